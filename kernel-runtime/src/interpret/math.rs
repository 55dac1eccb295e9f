//! Per-element semantics shared by every elementwise loop and the scalar path, written branch-free where
//! it matters so the block loops vectorize. They follow XLA: NaN-propagating max/min, integer division by
//! zero gives -1 (all ones) and remainder by zero gives the dividend, `MIN / -1` wraps.
//!
//! The transcendental ops are written once over [`lanes::Lanes`] (`approx.rs`, `trig.rs`, `pow.rs`):
//! their f32 instantiation is the op's reference and the AVX2 / AVX-512 loops (`elementfn.rs`) give
//! the same bits; the op table's `f32:` column names them by the items of `elementfn.rs`.

#[cfg(test)]
mod accuracy;
mod approx;
mod elementfn;
pub(crate) mod lanes;
#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes256;
#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes512;
mod pow;
mod trig;

pub(crate) use elementfn::{
    BinaryF32, Cos, Erf, Exp, Log, Log1p, Logistic, Operand, Pow, Pre, Rem, Rsqrt, Sin, Tanh,
    UnaryF32,
};

/// The constants of [`exp_f32`], shared with its 8- and 16-lane forms (`simd::exp8`, `simd::exp16`),
/// which must give the same bits.
pub(crate) mod exp_consts {
    pub const HI: f32 = 89.0;
    pub const LO: f32 = -110.0;
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// 1.5 · 2^23: adding it rounds to an integer (ties to even) ...
    pub const ROUND: f32 = 12_582_912.0;
    /// ... whose bits minus these are that integer.
    pub const ROUND_BITS: i32 = 0x4B40_0000;
    /// The polynomial's coefficients, highest degree first (Horner order).
    pub const POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
}

/// `e^x` for f32 by range reduction and a degree-6 polynomial (Cephes `expf` coefficients, ≤ 2 ulp on
/// the normal range, gradual underflow kept), branch-free with fused multiply-adds so whole rows
/// vectorize (libm `expf` made softmax 18× slower than XLA here). Over- and underflow come out of the
/// arithmetic itself: the clamped input scales by at most 2^128 (→ inf) or at least 2^-159 (→ 0).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    use exp_consts::*;
    let xc = x.clamp(LO, HI); // NaN stays NaN
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_BITS);
    let r = (-n).mul_add(LN2_HI, xc);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n in two factors so results down to the subnormal range round once.
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    // NaN in, the same NaN out (quieted): which NaN the arithmetic above propagates depends on how
    // the compiler orders FMA operands, so it is chosen here, identically in every code path.
    if x.is_nan() {
        x + x
    } else {
        y * s1 * s2
    }
}

/// NaN-propagating maximum with `max(-0, +0) = +0` (`arith.maximumf`, `jnp.maximum`).
#[inline(always)]
pub(crate) fn max_f32(a: f32, b: f32) -> f32 {
    let m = if a > b {
        a
    } else if b > a {
        b
    } else {
        f32::from_bits(a.to_bits() & b.to_bits())
    };
    if a.is_nan() || b.is_nan() {
        a + b
    } else {
        m
    }
}

/// NaN-propagating minimum with `min(-0, +0) = -0` (`arith.minimumf`, `jnp.minimum`).
#[inline(always)]
pub(crate) fn min_f32(a: f32, b: f32) -> f32 {
    let m = if a < b {
        a
    } else if b < a {
        b
    } else {
        f32::from_bits(a.to_bits() | b.to_bits())
    };
    if a.is_nan() || b.is_nan() {
        a + b
    } else {
        m
    }
}

/// Integer element semantics (wrapping, XLA division rules).
pub(crate) trait IntOps: Copy + PartialOrd + Eq {
    const MIN: Self;
    const MAX: Self;
    const ZERO: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn xdiv(self, o: Self) -> Self;
    fn xrem(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    fn imax(self, o: Self) -> Self;
    fn imin(self, o: Self) -> Self;
    /// `self << o`; 0 when `o` is the bit width or more (or negative), as XLA.
    fn shl(self, o: Self) -> Self;
    /// `self >> o`, arithmetic for signed and logical for unsigned types; a shift by the bit width
    /// or more (or negative) fills with the sign (signed) or 0 (unsigned), as XLA.
    fn shr(self, o: Self) -> Self;
}

macro_rules! int_ops {
    ($($t:ty),*) => {$(
        impl IntOps for $t {
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            const ZERO: Self = 0;
            #[inline(always)] fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn wsub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)] fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn xdiv(self, o: Self) -> Self { if o == 0 { !0 } else { self.wrapping_div(o) } }
            #[inline(always)] fn xrem(self, o: Self) -> Self { if o == 0 { self } else { self.wrapping_rem(o) } }
            #[inline(always)] fn and(self, o: Self) -> Self { self & o }
            #[inline(always)] fn or(self, o: Self) -> Self { self | o }
            #[inline(always)] fn xor(self, o: Self) -> Self { self ^ o }
            #[inline(always)] fn not(self) -> Self { !self }
            #[inline(always)] fn wneg(self) -> Self { (0 as $t).wrapping_sub(self) }
            #[inline(always)] fn wabs(self) -> Self { if self < (0 as $t) { self.wneg() } else { self } }
            #[inline(always)] fn imax(self, o: Self) -> Self { if self > o { self } else { o } }
            #[inline(always)] fn imin(self, o: Self) -> Self { if self < o { self } else { o } }
            #[inline(always)] fn shl(self, o: Self) -> Self {
                let bits = <$t>::BITS as i64;
                let n = o as i64;
                if (0..bits).contains(&n) { self.wrapping_shl(n as u32) } else { 0 }
            }
            #[inline(always)] fn shr(self, o: Self) -> Self {
                let bits = <$t>::BITS as i64;
                let n = o as i64;
                // For signed types `>>` is arithmetic; a full-width shift keeps only the sign fill.
                if (0..bits).contains(&n) { self.wrapping_shr(n as u32) } else { self.wrapping_shr(bits as u32 - 1).wrapping_shr(1) }
            }
        }
    )*};
}
int_ops!(i32, u32, i8, u8);

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exps_are_bit_identical_to_exp_f32() {
        use super::super::simd::{self, ExpIn};
        if !simd::avx2() {
            eprintln!("skipped: this CPU has no AVX2+FMA, so no vector exp is used here");
            return;
        }
        // Every 997th f32 bit pattern (all signs, exponents, NaNs), plus the edges of the fast path.
        let mut xs: Vec<f32> = (0..u32::MAX / 997)
            .map(|i| f32::from_bits(i * 997))
            .collect();
        xs.extend([
            -87.33655, -87.33654, -87.5, -103.9, -110.0, 88.72, 89.0, 0.0, -0.0,
        ]);
        let check = |name: &str, v: &[f32]| {
            for (x, got) in xs.iter().zip(v) {
                let want = exp_f32(*x);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name} exp({x:e}): {got:e} vs {want:e}"
                );
            }
        };
        let mut v = xs.clone();
        // SAFETY: AVX2 and FMA checked above.
        unsafe { simd::exp_run_avx2(&mut v, ExpIn::InPlace, None) };
        check("avx2", &v);
        // With the sum folded in: the row order's lanes and tail (`row_order::RowAcc`), bit for bit.
        use crate::interpret::row_order::{RowAcc, SUM};
        let row: Vec<f32> = (0..1003).map(|i| (i as f32) * 0.01 - 5.0).collect();
        let mut start = RowAcc::new(0.5f32);
        start.rest = 0.25;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (mut a2, mut d2) = (start, vec![0f32; row.len()]);
        // SAFETY: as above.
        unsafe { simd::exp_run_avx2(&mut d2, ExpIn::SubScalar(&row, 1.5), Some(&mut a2)) };
        let mut want = start;
        want.fold_f32::<SUM>(&d2);
        assert_eq!(bits(&a2.lanes), bits(&want.lanes));
        assert_eq!(a2.rest.to_bits(), want.rest.to_bits());
        if simd::avx512() {
            let mut v = xs.clone();
            // SAFETY: AVX-512F checked, AVX2 and FMA above.
            unsafe { simd::exp_run_avx512(&mut v, ExpIn::InPlace, None) };
            check("avx512", &v);
            let (mut a5, mut d5) = (start, vec![0f32; row.len()]);
            // SAFETY: as above.
            unsafe { simd::exp_run_avx512(&mut d5, ExpIn::SubScalar(&row, 1.5), Some(&mut a5)) };
            assert_eq!(bits(&d2), bits(&d5));
            assert_eq!(bits(&a5.lanes), bits(&want.lanes));
            assert_eq!(a5.rest.to_bits(), want.rest.to_bits());
        } else {
            eprintln!("this CPU has no AVX-512F: the 16-lane exp is not tested here");
        }
    }

    #[test]
    fn exp_matches_libm_within_two_ulp() {
        let mut worst = 0u32;
        let mut x = -103.0f32;
        while x < 88.7 {
            let (got, want) = (exp_f32(x), (x as f64).exp() as f32);
            if want.is_normal() {
                worst =
                    worst.max((got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32);
            } else {
                assert!(
                    (got - want).abs() <= f32::from_bits(2),
                    "x={x}: {got} vs {want}"
                );
            }
            x += 0.001_37;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(88.8), f32::INFINITY);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!(exp_f32(88.7).is_finite());
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn max_min_propagate_nan_and_order_zeros() {
        assert!(max_f32(f32::NAN, 1.0).is_nan());
        assert!(min_f32(1.0, f32::NAN).is_nan());
        assert!(max_f32(-0.0, 0.0).is_sign_positive());
        assert!(min_f32(0.0, -0.0).is_sign_negative());
        assert_eq!(max_f32(2.0, -3.0), 2.0);
    }

    #[test]
    fn integer_division_follows_xla() {
        assert_eq!(7i32.xdiv(0), -1);
        assert_eq!(7u32.xdiv(0), u32::MAX);
        assert_eq!(7i32.xrem(0), 7);
        assert_eq!(i32::MIN.xdiv(-1), i32::MIN);
        assert_eq!(i32::MIN.xrem(-1), 0);
        assert_eq!((-7i32).xdiv(2), -3);
        assert_eq!(3i32.pow(4), 81);
    }
}

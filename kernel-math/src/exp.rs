//! `e^x` in f32: [`exp_f32`], the definition, and its row loop [`exp_run`] — hand-written AVX2 and
//! AVX-512 forms ([`exp8`], [`exp16`]), op for op the scalar code, that can also fold a row's sum
//! (a fused softmax's exp-and-sum) in the same pass.

#[cfg(target_arch = "x86_64")]
use crate::cpu::avx512;

/// The constants of [`exp_f32`], shared with its 8- and 16-lane forms ([`exp8`], [`exp16`] and the
/// generic `approx::exp_core`), which must give the same bits.
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
    /// `y · 2^n` is +0 for `n` below this: `0 < y < 2` (`y ≈ e^r`, `|r| <= ln2 / 2`), so
    /// `y · 2^-151 < 2^-150`, half the least subnormal, which rounds to +0 (`y · 2^n1` alone is
    /// normal: `n1 >= -80` since `LO` clamps `n` to `>= -159`).
    pub const ZERO_BELOW: i32 = -150;
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
pub fn exp_f32(x: f32) -> f32 {
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

/// The running sum [`exp_run`] adds its results into: while whole groups of 16 remain, element
/// `16q + j` of the row goes to `lanes[j]` (in order of `q`), and the elements past the last whole
/// group go, in order, to `rest` — the interpreter's row order (`interpret/row_order.rs`), which its
/// tests hold this to.
#[cfg(target_arch = "x86_64")]
pub struct LaneSum<'a> {
    pub lanes: &'a mut [f32; 16],
    pub rest: &'a mut f32,
}

/// Where [`exp_run`] reads its input.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub enum ExpIn<'a> {
    /// The destination itself (`v = exp(v)`).
    InPlace,
    /// `exp(src[i] - m)`: a fused chain's leading subtraction of a broadcast scalar (f32, no rounding
    /// step between), read straight from the operand.
    SubScalar(&'a [f32], f32),
}

/// `dst[i] = exp_f32(input[i])` with AVX2+FMA, bit for bit [`exp_f32`]: the same clamp,
/// range reduction and polynomial, op for op. With `sum`, the results are also added into its lanes
/// (see [`LaneSum`]).
///
/// The one shortcut: `exp_f32` scales by `2^n` in two factors so that subnormal results round once;
/// when every lane of a vector has `-126 <= n <= 127`, `2^n` is itself a normal f32, `y·2^n` is one
/// rounding either way, and a single factor gives the same bits with five fewer instructions. Vectors
/// with a lane outside (NaN lanes included) take the two-factor path.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub unsafe fn exp_run(dst: &mut [f32], input: ExpIn<'_>, sum: Option<LaneSum<'_>>) {
    if avx512() {
        // SAFETY: AVX-512F checked; AVX2 + FMA by the caller.
        unsafe { exp_run_avx512(dst, input, sum) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { exp_run_avx2(dst, input, sum) }
    }
}

/// [`exp_run`] with 8 lanes per step.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_run_avx2(dst: &mut [f32], input: ExpIn<'_>, sum: Option<LaneSum<'_>>) {
    use std::arch::x86_64::*;
    let len = dst.len();
    if let ExpIn::SubScalar(src, _) = input {
        assert_eq!(src.len(), len, "exp_run operand length");
    }
    let (full8, full16) = (len / 8 * 8, len / 16 * 16);
    let p = dst.as_mut_ptr();
    // SAFETY: (every load/store below) offsets `i..i + 8` with `i + 8 <= full8 <= len`, in `dst` or in
    // `src` (checked to be as long); unaligned accesses.
    let load = |i: usize| unsafe {
        match input {
            ExpIn::InPlace => _mm256_loadu_ps(p.add(i)),
            ExpIn::SubScalar(src, m) => {
                _mm256_sub_ps(_mm256_loadu_ps(src.as_ptr().add(i)), _mm256_set1_ps(m))
            }
        }
    };
    match sum {
        Some(LaneSum { lanes, rest }) => {
            // SAFETY: as above; `lanes` has 16 elements.
            unsafe {
                let mut a0 = _mm256_loadu_ps(lanes.as_ptr());
                let mut a1 = _mm256_loadu_ps(lanes.as_ptr().add(8));
                let mut i = 0;
                while i < full16 {
                    let (e0, e1) = (exp8(load(i)), exp8(load(i + 8)));
                    _mm256_storeu_ps(p.add(i), e0);
                    _mm256_storeu_ps(p.add(i + 8), e1);
                    a0 = _mm256_add_ps(a0, e0);
                    a1 = _mm256_add_ps(a1, e1);
                    i += 16;
                }
                _mm256_storeu_ps(lanes.as_mut_ptr(), a0);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a1);
                if i < full8 {
                    _mm256_storeu_ps(p.add(i), exp8(load(i)));
                }
            }
            exp_tail(dst, input, full8);
            for &e in &dst[full16..] {
                *rest += e;
            }
        }
        None => {
            let mut i = 0;
            while i < full8 {
                // SAFETY: as above.
                unsafe { _mm256_storeu_ps(p.add(i), exp8(load(i))) };
                i += 8;
            }
            exp_tail(dst, input, full8);
        }
    }
}

/// [`exp_run`] with 16 lanes per step: `exp16` is `exp8` op for op on twice the lanes, and the 16
/// running sum lanes are one register holding what the AVX2 path keeps in two — the same bits.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn exp_run_avx512(dst: &mut [f32], input: ExpIn<'_>, sum: Option<LaneSum<'_>>) {
    use std::arch::x86_64::*;
    let len = dst.len();
    if let ExpIn::SubScalar(src, _) = input {
        assert_eq!(src.len(), len, "exp_run operand length");
    }
    let (full8, full16) = (len / 8 * 8, len / 16 * 16);
    let p = dst.as_mut_ptr();
    // SAFETY: (every load/store below) offsets `i..i + 16` with `i + 16 <= full16`, or `i..i + 8`
    // with `i + 8 <= full8`, in `dst` or in `src` (checked to be as long); unaligned accesses.
    let load16 = |i: usize| unsafe {
        match input {
            ExpIn::InPlace => _mm512_loadu_ps(p.add(i)),
            ExpIn::SubScalar(src, m) => {
                _mm512_sub_ps(_mm512_loadu_ps(src.as_ptr().add(i)), _mm512_set1_ps(m))
            }
        }
    };
    // SAFETY: as above (`i + 8 <= full8`).
    let load8 = |i: usize| unsafe {
        match input {
            ExpIn::InPlace => _mm256_loadu_ps(p.add(i)),
            ExpIn::SubScalar(src, m) => {
                _mm256_sub_ps(_mm256_loadu_ps(src.as_ptr().add(i)), _mm256_set1_ps(m))
            }
        }
    };
    let mut lanes_acc = sum.as_ref().map(|acc| {
        // SAFETY: `lanes` has 16 elements.
        unsafe { _mm512_loadu_ps(acc.lanes.as_ptr()) }
    });
    let mut i = 0;
    while i < full16 {
        let e = exp16(load16(i));
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(p.add(i), e) };
        if let Some(a) = &mut lanes_acc {
            *a = _mm512_add_ps(*a, e);
        }
        i += 16;
    }
    if i < full8 {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(p.add(i), exp8(load8(i))) };
    }
    exp_tail(dst, input, full8);
    if let (Some(acc), Some(a)) = (sum, lanes_acc) {
        // SAFETY: `lanes` has 16 elements.
        unsafe { _mm512_storeu_ps(acc.lanes.as_mut_ptr(), a) };
        for &e in &dst[full16..] {
            *acc.rest += e;
        }
    }
}

/// Sixteen lanes of `exp_f32`: [`exp8`] op for op.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use exp_consts::*;
    use std::arch::x86_64::*;
    let bias = _mm512_set1_epi32(127);
    // clamp(x, LO, HI) with NaN kept: MAXPS/MINPS return their second operand on NaN.
    let xc = _mm512_min_ps(_mm512_set1_ps(HI), _mm512_max_ps(_mm512_set1_ps(LO), x));
    let round = _mm512_set1_ps(ROUND);
    let t = _mm512_fmadd_ps(xc, _mm512_set1_ps(LOG2E), round);
    let n = _mm512_sub_ps(t, round);
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(ROUND_BITS));
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xc);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut p = _mm512_set1_ps(POLY[0]);
    for ck in &POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*ck));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    let outside = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(-126), ni)
        | _mm512_cmpgt_epi32_mask(ni, _mm512_set1_epi32(127));
    if outside == 0 {
        let s = _mm512_slli_epi32::<23>(_mm512_add_epi32(ni, bias));
        _mm512_mul_ps(y, _mm512_castsi512_ps(s))
    } else {
        let n1 = _mm512_srai_epi32::<1>(ni);
        let n2 = _mm512_sub_epi32(ni, n1);
        let s1 = _mm512_slli_epi32::<23>(_mm512_add_epi32(n1, bias));
        let s2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(n2, bias));
        // Lanes whose product is certainly +0 (see `ZERO_BELOW`) are zeroed before it, not by it:
        // an underflowing multiply costs a microcode assist on Intel cores (masked softmax lanes).
        let y = _mm512_maskz_mov_ps(
            _mm512_cmpge_epi32_mask(ni, _mm512_set1_epi32(ZERO_BELOW)),
            y,
        );
        let scaled = _mm512_mul_ps(
            _mm512_mul_ps(y, _mm512_castsi512_ps(s1)),
            _mm512_castsi512_ps(s2),
        );
        // NaN lanes (always here: their `n` is out of range) give `x + x`, as in `exp_f32`.
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_ps(nan, scaled, _mm512_add_ps(x, x))
    }
}

/// The scalar tail of [`exp_run`] from `from` on.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn exp_tail(dst: &mut [f32], input: ExpIn<'_>, from: usize) {
    for i in from..dst.len() {
        let x = match input {
            ExpIn::InPlace => dst[i],
            ExpIn::SubScalar(src, m) => src[i] - m,
        };
        dst[i] = exp_f32(x);
    }
}

/// Eight lanes of `exp_f32` (see [`exp_run`]).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use exp_consts::*;
    use std::arch::x86_64::*;
    let bias = _mm256_set1_epi32(127);
    // clamp(x, LO, HI) with NaN kept: MAXPS/MINPS return their second operand on NaN.
    let xc = _mm256_min_ps(_mm256_set1_ps(HI), _mm256_max_ps(_mm256_set1_ps(LO), x));
    let round = _mm256_set1_ps(ROUND);
    let t = _mm256_fmadd_ps(xc, _mm256_set1_ps(LOG2E), round);
    let n = _mm256_sub_ps(t, round);
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND_BITS));
    // (-n)·LN2_HI + xc, then (-n)·LN2_LO + r: fma(n, -LN2_HI, xc) is the same exact product.
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for ck in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*ck));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let outside = _mm256_or_si256(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni),
        _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127)),
    );
    if _mm256_testz_si256(outside, outside) == 1 {
        let s = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni, bias));
        _mm256_mul_ps(y, _mm256_castsi256_ps(s))
    } else {
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let s1 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias));
        let s2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias));
        // As in `exp16`: lanes certainly +0 are zeroed before the product.
        let live = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(ZERO_BELOW - 1));
        let y = _mm256_and_ps(y, _mm256_castsi256_ps(live));
        let scaled = _mm256_mul_ps(
            _mm256_mul_ps(y, _mm256_castsi256_ps(s1)),
            _mm256_castsi256_ps(s2),
        );
        // NaN lanes (always here: their `n` is out of range) give `x + x`, as in `exp_f32`.
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_blendv_ps(scaled, _mm256_add_ps(x, x), nan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exps_are_bit_identical_to_exp_f32() {
        use crate::cpu::{avx2, avx512};
        if !avx2() {
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
        // Every f32 in [-110, -100]: results from subnormal to +0, across `ZERO_BELOW` (n = -150 and
        // -151 at x ≈ -103.97 and -104.67), where the vector paths zero lanes before the product.
        xs.extend((100f32.to_bits()..=110f32.to_bits()).map(|b| -f32::from_bits(b)));
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
        unsafe { exp_run_avx2(&mut v, ExpIn::InPlace, None) };
        check("avx2", &v);
        // With the sum folded in: element `16q + j` into lane `j`, the tail into `rest`, in order.
        let row: Vec<f32> = (0..1003).map(|i| (i as f32) * 0.01 - 5.0).collect();
        let (lanes0, rest0) = ([0.5f32; 16], 0.25f32);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let folded = |d: &[f32]| {
            let (mut lanes, mut rest) = (lanes0, rest0);
            let groups = d.chunks_exact(16);
            for &e in groups.remainder() {
                rest += e;
            }
            for g in groups {
                for (l, e) in lanes.iter_mut().zip(g) {
                    *l += e;
                }
            }
            (lanes, rest)
        };
        let (mut l2, mut r2, mut d2) = (lanes0, rest0, vec![0f32; row.len()]);
        let sum = LaneSum {
            lanes: &mut l2,
            rest: &mut r2,
        };
        // SAFETY: as above.
        unsafe { exp_run_avx2(&mut d2, ExpIn::SubScalar(&row, 1.5), Some(sum)) };
        let (want_lanes, want_rest) = folded(&d2);
        assert_eq!(bits(&l2), bits(&want_lanes));
        assert_eq!(r2.to_bits(), want_rest.to_bits());
        if avx512() {
            let mut v = xs.clone();
            // SAFETY: AVX-512F checked, AVX2 and FMA above.
            unsafe { exp_run_avx512(&mut v, ExpIn::InPlace, None) };
            check("avx512", &v);
            let (mut l5, mut r5, mut d5) = (lanes0, rest0, vec![0f32; row.len()]);
            let sum = LaneSum {
                lanes: &mut l5,
                rest: &mut r5,
            };
            // SAFETY: as above.
            unsafe { exp_run_avx512(&mut d5, ExpIn::SubScalar(&row, 1.5), Some(sum)) };
            assert_eq!(bits(&d2), bits(&d5));
            assert_eq!(bits(&l5), bits(&want_lanes));
            assert_eq!(r5.to_bits(), want_rest.to_bits());
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
}

//! The element semantics that are not transcendental, as XLA defines them: NaN-propagating float
//! max/min (`-0 < +0`), and the integer ops — wrapping arithmetic, division by zero giving -1 (all
//! ones) and remainder by zero the dividend, `MIN / -1` wrapping, shifts by the bit width or more
//! giving 0 or the sign fill. Written branch-free where it matters, so the loops over them vectorize.

/// `x`'s bits with the quiet bit set (a quiet NaN stays itself; a signalling one becomes the quiet NaN
/// of its sign and payload, as an x86 operation on it returns it).
#[inline(always)]
fn quiet(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | 0x0040_0000)
}

/// `r`, the result of an operation on `x` and `y`, unless an operand is a NaN: then the first NaN
/// operand, quieted (x86's rule, written out: see [`add_f32`]).
#[inline(always)]
fn first_nan(x: f32, y: f32, r: f32) -> f32 {
    if x.is_nan() {
        quiet(x)
    } else if y.is_nan() {
        quiet(y)
    } else {
        r
    }
}

/// `x + y`, a NaN operand giving the first NaN operand, quieted (x86's rule, written out: `x + y`
/// alone lets the compiler commute a vectorized add in optimized builds, and then `log(x) + sqrt(x)`
/// of a negative `x` was +NaN on one dispatch path and −NaN on another). Only a NaN `x` needs
/// choosing: with one NaN operand the hardware returns it, quieted, in either operand order.
#[inline(always)]
pub fn add_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() {
        quiet(x)
    } else {
        x + y
    }
}

/// `x · y`, a NaN operand giving the first NaN operand, quieted (as [`add_f32`]).
#[inline(always)]
pub fn mul_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() {
        quiet(x)
    } else {
        x * y
    }
}

/// NaN-propagating maximum with `max(-0, +0) = +0` (`arith.maximumf`, `jnp.maximum`).
#[inline(always)]
pub fn max_f32(a: f32, b: f32) -> f32 {
    let m = if a > b {
        a
    } else if b > a {
        b
    } else {
        f32::from_bits(a.to_bits() & b.to_bits())
    };
    first_nan(a, b, m)
}

/// NaN-propagating minimum with `min(-0, +0) = -0` (`arith.minimumf`, `jnp.minimum`).
#[inline(always)]
pub fn min_f32(a: f32, b: f32) -> f32 {
    let m = if a < b {
        a
    } else if b < a {
        b
    } else {
        f32::from_bits(a.to_bits() | b.to_bits())
    };
    first_nan(a, b, m)
}

/// `f(x)`, or for a NaN `x + x`: quieted, its sign and payload kept — the NaN rule of every function
/// here.
#[inline(always)]
fn nan_rule(x: f32, f: impl Fn(f32) -> f32) -> f32 {
    if x.is_nan() {
        x + x
    } else {
        f(x)
    }
}

/// `x` rounded toward -inf (`math.floor`), NaNs by `nan_rule`. Spelled out because `f32::floor` is a
/// libm call or an instruction depending on the CPU and the code around it, which disagree on a
/// signaling NaN (one keeps it signaling, `roundss` quiets it); on every other input they are exact
/// and agree.
#[inline(always)]
pub fn floor_f32(x: f32) -> f32 {
    nan_rule(x, f32::floor)
}

/// `x` rounded toward +inf (`math.ceil`), NaNs as [`floor_f32`].
#[inline(always)]
pub fn ceil_f32(x: f32) -> f32 {
    nan_rule(x, f32::ceil)
}

/// `x` rounded to the nearest integer, ties to even (`math.roundeven`, `jnp.round`), NaNs as
/// [`floor_f32`].
#[inline(always)]
pub fn round_even_f32(x: f32) -> f32 {
    nan_rule(x, f32::round_ties_even)
}

/// The bits of `x` rounded to bf16: to nearest, ties to even (overflowing to ±inf); a NaN keeps its
/// sign and leading payload bits, quieted. How a bf16 result is rounded from the f32 it is computed
/// in, by every engine. Written with integer operations so loops over it vectorize.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) | 0x40) as u16;
    if x.is_nan() {
        nan
    } else {
        rounded
    }
}

/// The bits of the integer `v` rounded once (to nearest, ties to even) to bf16's 8 significant bits —
/// a cast to bf16; going through f32 would round twice for integers above 2^24.
pub fn bf16_bits_of_i64(v: i64) -> u16 {
    let mut a = v.unsigned_abs();
    let bits = 64 - a.leading_zeros();
    if bits > 8 {
        let shift = bits - 8;
        let rem = a & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        a >>= shift;
        if rem > half || (rem == half && a & 1 == 1) {
            a += 1;
        }
        a <<= shift;
    }
    let f = a as f32; // exact: at most 9 significant bits
    bf16_bits(if v < 0 { -f } else { f })
}

/// The f32 value of bf16 bits `b` (exact).
#[inline(always)]
pub fn f32_of_bf16_bits(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Integer element semantics (wrapping, XLA division rules).
pub trait IntOps: Copy + PartialOrd + Eq {
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

    #[test]
    fn max_min_propagate_nan_and_order_zeros() {
        assert!(max_f32(f32::NAN, 1.0).is_nan());
        assert!(min_f32(1.0, f32::NAN).is_nan());
        assert!(max_f32(-0.0, 0.0).is_sign_positive());
        assert!(min_f32(0.0, -0.0).is_sign_negative());
        assert_eq!(max_f32(2.0, -3.0), 2.0);
    }

    #[test]
    fn a_nan_operand_gives_the_first_nan_quieted() {
        let (p, n, s) = (
            f32::from_bits(0x7FC0_0001),
            f32::from_bits(0xFFC0_0000),
            f32::from_bits(0xFF80_0005),
        );
        for f in [add_f32, mul_f32, max_f32, min_f32] {
            assert_eq!(f(p, n).to_bits(), 0x7FC0_0001);
            assert_eq!(f(n, p).to_bits(), 0xFFC0_0000);
            assert_eq!(
                f(2.0, s).to_bits(),
                0xFFC0_0005,
                "a signalling NaN is quieted"
            );
            assert_eq!(f(s, p).to_bits(), 0xFFC0_0005);
        }
        assert_eq!((add_f32(1.5, 2.0), mul_f32(1.5, -2.0)), (3.5, -3.0));
        // No NaN operand: the operation's own result, the invalid ones' default NaN included.
        assert_eq!(
            add_f32(f32::INFINITY, f32::NEG_INFINITY).to_bits(),
            (f32::INFINITY + f32::NEG_INFINITY).to_bits()
        );
    }

    #[test]
    fn rounding_quiets_nans_and_rounds_to_even() {
        let snan = f32::from_bits(0xFF80_0001);
        for f in [floor_f32, ceil_f32, round_even_f32] {
            assert_eq!(f(snan).to_bits(), 0xFFC0_0001);
            assert_eq!(f(-0.0).to_bits(), (-0.0f32).to_bits());
        }
        assert_eq!(
            (floor_f32(-1.5), ceil_f32(-1.5), round_even_f32(-1.5)),
            (-2.0, -1.0, -2.0)
        );
        assert_eq!((round_even_f32(2.5), round_even_f32(0.5)), (2.0, 0.0));
        // bf16: ties to even, overflow to inf, NaNs keep sign and leading payload, quieted.
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(bf16_bits(f32::MAX), 0x7F80);
        assert_eq!(bf16_bits(f32::from_bits(0xFF80_0001)), 0xFFC0);
        assert_eq!(bf16_bits(f32::from_bits(0x7FA5_0000)), 0x7FE5);
        assert_eq!(f32_of_bf16_bits(0xC040), -3.0);
        // Integers round once: 2^24 + 2^16 + 1 is above the tie, though its f32 (2^24 + 2^16) is on it.
        assert_eq!(bf16_bits_of_i64(16_842_753), 0x4B81);
        assert_eq!(bf16_bits_of_i64(-16_842_753), 0xCB81);
        assert_eq!(bf16_bits_of_i64(i64::MIN), 0xDF00);
        assert_eq!(bf16_bits_of_i64(7), 0x40E0);
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

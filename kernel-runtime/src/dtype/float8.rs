//! The 8-bit floats of the dtype table, `f8e4m3fn` and `f8e5m2`, with ml_dtypes' (= XLA's) meaning
//! of every bit pattern and of every conversion: round to nearest, ties to even, once, from the exact
//! value; no saturation — a value beyond the largest finite one becomes infinity (`f8e5m2`) or NaN
//! (`f8e4m3fn`, which has no infinity); NaN keeps its sign.
//!
//! Written here rather than taken from the `float8` crate: that crate converts as CUDA's
//! `__NV_SATFINITE` does (overflow saturates to ±448 / ±57344, infinities included) and drops NaN
//! signs, which is not the bits jax computes. `python/tests/test_dtypes.py` compares every one of
//! the 256 patterns of each type, and f32 inputs around every rounding boundary, with ml_dtypes and
//! with `jax.jit` conversions, bit for bit.

use std::cmp::Ordering;
use std::fmt;

/// One 8-bit float format: `E` exponent bits, `M` mantissa bits; `FN`: "finite" (no infinity; the
/// all-ones pattern is the only NaN) as in `e4m3fn`, else IEEE-like (all-ones exponent: inf / NaN).
struct Format {
    e: u32,
    m: u32,
    finite_only: bool,
}

const E4M3FN: Format = Format {
    e: 4,
    m: 3,
    finite_only: true,
};
const E5M2: Format = Format {
    e: 5,
    m: 2,
    finite_only: false,
};

impl Format {
    const fn bias(&self) -> u32 {
        (1 << (self.e - 1)) - 1
    }
    /// The largest finite magnitude's bits.
    const fn max_finite(&self) -> u32 {
        if self.finite_only {
            0x7E
        } else {
            ((((1 << self.e) - 2) << self.m) | ((1 << self.m) - 1)) as u32
        }
    }
    /// The quiet NaN (positive).
    const fn nan(&self) -> u8 {
        if self.finite_only {
            0x7F
        } else {
            (((1u32 << self.e) - 1) << self.m | (1 << (self.m - 1))) as u8
        }
    }
    /// What a magnitude beyond the largest finite one becomes.
    const fn overflow(&self) -> u8 {
        if self.finite_only {
            0x7F
        } else {
            (((1u32 << self.e) - 1) << self.m) as u8
        }
    }

    /// `x` rounded to this format (see the module docs).
    const fn round_f32(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7FFF_FFFF;
        if abs > 0x7F80_0000 {
            return sign | self.nan();
        }
        if abs == 0x7F80_0000 {
            return sign | self.overflow();
        }
        let bias = self.bias();
        let drop = 23 - self.m;
        // The smallest normal of this format, as f32 bits.
        let min_normal = (127 - bias + 1) << 23;
        let r = if abs >= min_normal {
            // Rebias the exponent in place, then round the low `drop` bits off (a carry moves into
            // the exponent, as it should).
            let v = abs - ((127 - bias) << 23);
            let half = 1 << (drop - 1);
            let odd = (v >> drop) & 1;
            (v + half - 1 + odd) >> drop
        } else if abs < 0x0080_0000 {
            0 // an f32 subnormal is far below half the smallest subnormal here
        } else {
            // A subnormal here: the significand (implicit bit included) in units of the smallest
            // subnormal, 2^(1 - bias - m), shifted right by `s` with ties to even.
            let sig = (abs & 0x007F_FFFF) | 0x0080_0000;
            let exp = abs >> 23;
            let s = 150 + 1 - bias - self.m - exp; // > drop here
            if s >= 32 {
                0
            } else {
                let q = sig >> s;
                let rem = sig & ((1 << s) - 1);
                let half = 1 << (s - 1);
                if rem > half || (rem == half && q & 1 == 1) {
                    q + 1
                } else {
                    q
                }
            }
        };
        if r > self.max_finite() {
            sign | self.overflow()
        } else {
            sign | r as u8
        }
    }

    /// The exact value of a pattern as f32 (NaN: the quiet NaN with its sign).
    const fn value_of(&self, b: u8) -> f32 {
        let sign = ((b as u32) & 0x80) << 24;
        let abs = (b & 0x7F) as u32;
        let exp = abs >> self.m;
        let man = abs & ((1 << self.m) - 1);
        let top = (1 << self.e) - 1;
        if self.finite_only && abs == 0x7F || !self.finite_only && exp == top && man != 0 {
            return f32::from_bits(sign | 0x7FC0_0000);
        }
        if !self.finite_only && exp == top {
            return f32::from_bits(sign | 0x7F80_0000);
        }
        let bits = if exp == 0 {
            if man == 0 {
                0
            } else {
                // man × 2^(1 - bias - m), normalized.
                let lz = man.leading_zeros() - (32 - self.m); // shifts to the implicit bit
                let e = 127 + 1 - self.bias() - lz - 1;
                (e << 23) | (((man << (lz + 1)) & ((1 << self.m) - 1)) << (23 - self.m))
            }
        } else {
            ((exp + 127 - self.bias()) << 23) | (man << (23 - self.m))
        };
        f32::from_bits(sign | bits)
    }
}

macro_rules! float8 {
    ($(#[doc = $doc:literal])* $T:ident, $fmt:expr) => {
        $(#[doc = $doc])*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Default)]
        #[repr(transparent)]
        pub struct $T(u8);

        impl $T {
            pub const ZERO: $T = $T(0);
            pub const NAN: $T = $T($fmt.nan());
            pub const fn from_bits(bits: u8) -> $T {
                $T(bits)
            }
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// `x` rounded to nearest (ties to even), as ml_dtypes and XLA convert.
            pub const fn from_f32(x: f32) -> $T {
                $T($fmt.round_f32(x))
            }
            /// `x` rounded once: through f32 rounded to odd (which has room for the sticky bit, so
            /// the second rounding decides as the exact value would).
            pub fn from_f64(x: f64) -> $T {
                let mut t = x as f32;
                if !x.is_nan() && t as f64 != x {
                    if (t as f64).abs() > x.abs() {
                        t = f32::from_bits(t.to_bits() - 1); // toward zero: the truncation
                    }
                    t = f32::from_bits(t.to_bits() | 1);
                }
                $T::from_f32(t)
            }
            pub const fn to_f32(self) -> f32 {
                $fmt.value_of(self.0)
            }
            pub const fn to_f64(self) -> f64 {
                self.to_f32() as f64
            }
            pub const fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        /// IEEE equality of the values (NaN ≠ NaN, -0 = 0), as for `f32`.
        impl PartialEq for $T {
            fn eq(&self, o: &$T) -> bool {
                self.to_f32() == o.to_f32()
            }
        }
        impl PartialOrd for $T {
            fn partial_cmp(&self, o: &$T) -> Option<Ordering> {
                self.to_f32().partial_cmp(&o.to_f32())
            }
        }
        impl fmt::Debug for $T {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.to_f32(), f)
            }
        }
        impl fmt::Display for $T {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }
        impl From<$T> for f32 {
            fn from(x: $T) -> f32 {
                x.to_f32()
            }
        }
    };
}

float8!(
    /// 8-bit float: 4 exponent bits (bias 7), 3 mantissa bits, no infinity, NaN `S.1111.111`;
    /// largest finite ±448 (jax's `float8_e4m3fn`, torch's `float8_e4m3fn`, MLIR's `f8E4M3FN`).
    f8e4m3fn,
    E4M3FN
);
float8!(
    /// 8-bit float: 5 exponent bits (bias 15), 2 mantissa bits, IEEE infinities and NaNs; largest
    /// finite ±57344 (jax's `float8_e5m2`, torch's `float8_e5m2`, MLIR's `f8E5M2`).
    f8e5m2,
    E5M2
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_round_trips_through_f32() {
        for b in 0..=255u8 {
            for (x, back) in [
                (
                    f8e4m3fn(b).to_f32(),
                    f8e4m3fn::from_f32(f8e4m3fn(b).to_f32()).0,
                ),
                (f8e5m2(b).to_f32(), f8e5m2::from_f32(f8e5m2(b).to_f32()).0),
            ] {
                if x.is_nan() {
                    assert!(back & 0x7F > 0x7C, "{b:#x}: NaN stays NaN ({back:#x})");
                    assert_eq!(back & 0x80, b & 0x80, "{b:#x}: NaN keeps its sign");
                } else {
                    assert_eq!(back, b, "{b:#x} = {x}");
                }
            }
        }
    }

    #[test]
    fn the_edges_follow_ml_dtypes() {
        let e4 = |x: f32| f8e4m3fn::from_f32(x).0;
        let e5 = |x: f32| f8e5m2::from_f32(x).0;
        assert_eq!(f8e4m3fn(0x7E).to_f32(), 448.0);
        assert_eq!(f8e4m3fn(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(f8e5m2(0x7B).to_f32(), 57344.0);
        assert_eq!(f8e5m2(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(f8e5m2(0x7C).to_f32(), f32::INFINITY);
        assert_eq!(e4(464.0), 0x7E, "a tie rounds to the even 448");
        assert_eq!(e4(464.01), 0x7F, "beyond it: NaN (no saturation)");
        assert_eq!(e4(f32::NEG_INFINITY), 0xFF);
        assert_eq!(e5(61440.0), 0x7C, "the tie above 57344 rounds to even: inf");
        assert_eq!(e5(-1e9), 0xFC);
        assert_eq!(
            e4(2f32.powi(-10)),
            0x00,
            "half the smallest subnormal ties to 0"
        );
        assert_eq!(e4(1.5 * 2f32.powi(-10)), 0x01);
        assert_eq!(e4(3.0 * 2f32.powi(-10)), 0x02, "1.5 ulp ties to even 2");
        assert_eq!(e4(-0.0), 0x80);
        assert_eq!(e5(f32::NAN), 0x7E);
        assert_eq!(e4(-f32::NAN), 0xFF);
        assert_eq!(f8e4m3fn::from_f64(448.0 + 16.0 + 1e-9).0, 0x7F);
        assert_eq!(f8e4m3fn::from_f64(448.0 + 16.0).0, 0x7E);
        assert_eq!(f8e5m2::from_f64(1.125 + 1e-12).0, f8e5m2::from_f32(1.25).0);
    }
}

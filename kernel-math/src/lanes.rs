//! The arithmetic an elementwise function is written in once, for every lane width: [`Lanes`] is one
//! f32 (the scalar reference) or 8 / 16 f32 lanes (AVX2+FMA in `lanes256.rs`, AVX-512F in
//! `lanes512.rs`), [`Lanes64`] the same for f64. Every operation is an IEEE operation (one rounding:
//! `fma` included) or a bit manipulation, with one meaning per lane — so a generic body gives the same
//! bits at every width, and the scalar instantiation is the reference the vector ones reproduce.
//!
//! Soundness: a vector value (`V8`, `V16` and their int and f64 forms) is only made by `unsafe`
//! constructors whose callers have checked the CPU features at run time (the drivers in
//! `elementfn.rs`); every other value derives from one (`x.splat(c)` takes an existing value as its
//! witness). So each safe method runs only where its instructions exist.

use std::ops::{Add, BitAnd, BitOr, Div, Mul, Neg, Not, Sub};

/// f32 lanes.
pub(crate) trait Lanes:
    Copy
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// A per-lane condition.
    type Mask: Copy
        + BitAnd<Output = Self::Mask>
        + BitOr<Output = Self::Mask>
        + Not<Output = Self::Mask>;
    /// As many i32 lanes.
    type Int: IntLanes;
    /// As many f64 lanes (in halves, see [`Lanes::map_wide`]).
    type Wide: Lanes64;
    /// Lanes per value.
    const N: usize;
    /// `c` in every lane (`self` only vouches for the lane type).
    fn splat(self, c: f32) -> Self;
    fn splat_int(self, c: i32) -> Self::Int;
    /// `self * b + c`, rounded once.
    fn fma(self, b: Self, c: Self) -> Self;
    /// `if self > o { self } else { o }` per lane (x86 `maxps`: `o` when either is NaN).
    fn max(self, o: Self) -> Self;
    /// `if self < o { self } else { o }` per lane (x86 `minps`).
    fn min(self, o: Self) -> Self;
    /// The sign bit cleared.
    fn abs(self) -> Self;
    /// Correctly rounded square root.
    fn sqrt(self) -> Self;
    fn lt(self, o: Self) -> Self::Mask;
    fn eq(self, o: Self) -> Self::Mask;
    fn is_nan(self) -> Self::Mask;
    /// `a` where `m`, else `b`.
    fn select(m: Self::Mask, a: Self, b: Self) -> Self;
    /// Whether `m` holds in any lane.
    fn any(m: Self::Mask) -> bool;
    fn bits(self) -> Self::Int;
    fn from_bits(i: Self::Int) -> Self;
    /// i32 → f32, rounded to nearest even (exact below 2^24).
    fn from_int(i: Self::Int) -> Self;
    /// f32 → i32 toward zero; only meaningful for `|self| < 2^31` (lanes beyond differ by width).
    fn trunc_int(self) -> Self::Int;
    fn int_eq(a: Self::Int, b: Self::Int) -> Self::Mask;
    /// `table[i]` per lane, for `i` in `0..8` (a register permute in the vector forms).
    fn lookup8(self, i: Self::Int, table: &[f32; 8]) -> Self;
    /// Lane `i` of the result is lane `i` of `src` (`src` holds at least `N` values).
    fn load(self, src: &[f32]) -> Self;
    /// Lane `i` to `dst[i]` (`dst` holds at least `N` values).
    fn store(self, dst: &mut [f32]);
    fn load_int(self, src: &[i32]) -> Self::Int;
    fn store_int(i: Self::Int, dst: &mut [i32]);
    /// `F` on the f64 forms of `self` and `o` (exact), rounded back to f32 once per lane.
    fn map_wide<F: WideFn>(self, o: Self) -> Self;
}

/// A binary function over f64 lanes (a type, not a closure, so its body is always inlined into the
/// caller's target features).
pub(crate) trait WideFn {
    fn apply<D: Lanes64>(x: D, y: D) -> D;
}

/// i32 lanes, wrapping.
pub(crate) trait IntLanes: Copy {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn shl<const K: i32>(self) -> Self;
    /// Arithmetic shift right.
    fn sra<const K: i32>(self) -> Self;
}

/// f64 lanes, with their bit patterns as u64 lanes where an algorithm needs the exponent.
pub(crate) trait Lanes64:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    type Mask: Copy;
    fn splat(self, c: f64) -> Self;
    fn fma(self, b: Self, c: Self) -> Self;
    /// As [`Lanes::max`] / [`Lanes::min`].
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn lt(self, o: Self) -> Self::Mask;
    fn select(m: Self::Mask, a: Self, b: Self) -> Self;
    /// The bit patterns: `and`, `or` with a constant, logical shifts, and a wrapping integer add.
    fn bits_and(self, m: u64) -> Self;
    fn bits_or(self, m: u64) -> Self;
    fn bits_shr<const K: i32>(self) -> Self;
    fn bits_shl<const K: i32>(self) -> Self;
    fn bits_add(self, o: Self) -> Self;
}

// ---------------------------------------------------------------------------------------------- one lane

impl Lanes for f32 {
    type Mask = bool;
    type Int = i32;
    type Wide = f64;
    const N: usize = 1;
    #[inline(always)]
    fn splat(self, c: f32) -> f32 {
        c
    }
    #[inline(always)]
    fn splat_int(self, c: i32) -> i32 {
        c
    }
    #[inline(always)]
    fn fma(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
    #[inline(always)]
    fn max(self, o: f32) -> f32 {
        if self > o {
            self
        } else {
            o
        }
    }
    #[inline(always)]
    fn min(self, o: f32) -> f32 {
        if self < o {
            self
        } else {
            o
        }
    }
    #[inline(always)]
    fn abs(self) -> f32 {
        f32::from_bits(self.to_bits() & 0x7FFF_FFFF)
    }
    #[inline(always)]
    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn lt(self, o: f32) -> bool {
        self < o
    }
    #[inline(always)]
    fn eq(self, o: f32) -> bool {
        self == o
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
    #[inline(always)]
    fn select(m: bool, a: f32, b: f32) -> f32 {
        if m {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn any(m: bool) -> bool {
        m
    }
    #[inline(always)]
    fn bits(self) -> i32 {
        self.to_bits() as i32
    }
    #[inline(always)]
    fn from_bits(i: i32) -> f32 {
        f32::from_bits(i as u32)
    }
    #[inline(always)]
    fn from_int(i: i32) -> f32 {
        i as f32
    }
    #[inline(always)]
    fn trunc_int(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn int_eq(a: i32, b: i32) -> bool {
        a == b
    }
    #[inline(always)]
    fn lookup8(self, i: i32, table: &[f32; 8]) -> f32 {
        table[i as usize]
    }
    #[inline(always)]
    fn load(self, src: &[f32]) -> f32 {
        src[0]
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32]) {
        dst[0] = self;
    }
    #[inline(always)]
    fn load_int(self, src: &[i32]) -> i32 {
        src[0]
    }
    #[inline(always)]
    fn store_int(i: i32, dst: &mut [i32]) {
        dst[0] = i;
    }
    #[inline(always)]
    fn map_wide<F: WideFn>(self, o: f32) -> f32 {
        F::apply(self as f64, o as f64) as f32
    }
}

impl IntLanes for i32 {
    #[inline(always)]
    fn add(self, o: i32) -> i32 {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn sub(self, o: i32) -> i32 {
        self.wrapping_sub(o)
    }
    #[inline(always)]
    fn and(self, o: i32) -> i32 {
        self & o
    }
    #[inline(always)]
    fn or(self, o: i32) -> i32 {
        self | o
    }
    #[inline(always)]
    fn xor(self, o: i32) -> i32 {
        self ^ o
    }
    #[inline(always)]
    fn shl<const K: i32>(self) -> i32 {
        self << K
    }
    #[inline(always)]
    fn sra<const K: i32>(self) -> i32 {
        self >> K
    }
}

impl Lanes64 for f64 {
    type Mask = bool;
    #[inline(always)]
    fn splat(self, c: f64) -> f64 {
        c
    }
    #[inline(always)]
    fn fma(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
    #[inline(always)]
    fn max(self, o: f64) -> f64 {
        if self > o {
            self
        } else {
            o
        }
    }
    #[inline(always)]
    fn min(self, o: f64) -> f64 {
        if self < o {
            self
        } else {
            o
        }
    }
    #[inline(always)]
    fn lt(self, o: f64) -> bool {
        self < o
    }
    #[inline(always)]
    fn select(m: bool, a: f64, b: f64) -> f64 {
        if m {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn bits_and(self, m: u64) -> f64 {
        f64::from_bits(self.to_bits() & m)
    }
    #[inline(always)]
    fn bits_or(self, m: u64) -> f64 {
        f64::from_bits(self.to_bits() | m)
    }
    #[inline(always)]
    fn bits_shr<const K: i32>(self) -> f64 {
        f64::from_bits(self.to_bits() >> K)
    }
    #[inline(always)]
    fn bits_shl<const K: i32>(self) -> f64 {
        f64::from_bits(self.to_bits() << K)
    }
    #[inline(always)]
    fn bits_add(self, o: f64) -> f64 {
        f64::from_bits(self.to_bits().wrapping_add(o.to_bits()))
    }
}

//! The arithmetic an elementwise function is written in once, for every lane width: [`Lanes`] is one
//! f32 (the scalar reference) or 8 / 16 f32 lanes (AVX2+FMA, AVX-512F; `lanes512.rs`), [`Lanes64`] the
//! same for f64. Every operation is an IEEE operation (one rounding: `fma` included) or a bit
//! manipulation, with one meaning per lane — so a generic body gives the same bits at every width, and
//! the scalar instantiation is the reference the vector ones reproduce.
//!
//! Soundness: a vector value ([`V8`], [`I8`], [`D4`]) is only made by `unsafe` constructors whose
//! callers have checked the CPU features at run time (the drivers in `elementfn.rs`); every other value
//! derives from one (`x.splat(c)` takes an existing value as its witness). So each safe method below
//! runs only where its instructions exist.

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
    /// Lane `i` of the result is lane `i` of `src` (`src` holds at least `N` values).
    fn load(self, src: &[f32]) -> Self;
    /// Lane `i` to `dst[i]` (`dst` holds at least `N` values).
    fn store(self, dst: &mut [f32]);
    fn load_int(self, src: &[i32]) -> Self::Int;
    fn store_int(i: Self::Int, dst: &mut [i32]);
    /// `f` on the f64 forms of `self` and `o` (exact), rounded back to f32 once per lane.
    fn map_wide(self, o: Self, f: impl Fn(Self::Wide, Self::Wide) -> Self::Wide) -> Self;
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
    fn sqrt(self) -> Self;
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
    fn map_wide(self, o: f32, f: impl Fn(f64, f64) -> f64) -> f32 {
        f(self as f64, o as f64) as f32
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
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
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

// ---------------------------------------------------------------------------------------------- AVX2

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::V8;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{IntLanes, Lanes, Lanes64};
    use std::arch::x86_64::*;
    use std::ops::{Add, BitAnd, BitOr, Div, Mul, Neg, Not, Sub};

    /// Eight f32 lanes (AVX2+FMA). Made only by [`V8::load_ptr`] / [`V8::splat_new`], whose callers
    /// have checked AVX2 and FMA at run time; so every method below runs on such a CPU.
    #[derive(Clone, Copy)]
    pub(crate) struct V8(__m256);
    /// Eight i32 lanes (from a [`V8`]).
    #[derive(Clone, Copy)]
    pub(crate) struct I8(__m256i);
    /// Eight lane conditions (all ones / all zeros).
    #[derive(Clone, Copy)]
    pub(crate) struct M8(__m256);
    /// Four f64 lanes (half a [`V8`]).
    #[derive(Clone, Copy)]
    pub(crate) struct D4(__m256d);

    impl V8 {
        /// # Safety
        /// The CPU must support AVX2 and FMA; `p` must be valid for reading 8 f32.
        #[inline(always)]
        pub(crate) unsafe fn load_ptr(p: *const f32) -> V8 {
            // SAFETY: forwarded to the caller.
            V8(unsafe { _mm256_loadu_ps(p) })
        }
        /// # Safety
        /// The CPU must support AVX2 and FMA.
        #[inline(always)]
        pub(crate) unsafe fn splat_new(c: f32) -> V8 {
            // SAFETY: forwarded to the caller.
            V8(unsafe { _mm256_set1_ps(c) })
        }
        /// # Safety
        /// `p` must be valid for writing 8 f32.
        #[inline(always)]
        pub(crate) unsafe fn store_ptr(self, p: *mut f32) {
            // SAFETY: AVX2 as for every V8 (see the type); `p` by the caller.
            unsafe { _mm256_storeu_ps(p, self.0) }
        }
    }

    /// `$body` with AVX2+FMA instructions, which every value of these types vouches for (see [`V8`]).
    macro_rules! avx {
        ($body:expr) => {
            // SAFETY: a V8 / I8 / M8 / D4 exists only on a CPU with AVX2 and FMA (see `V8`).
            unsafe { $body }
        };
    }

    macro_rules! binop {
        ($T:ident, $Tr:ident, $m:ident, $f:ident) => {
            impl $Tr for $T {
                type Output = $T;
                #[inline(always)]
                fn $m(self, o: $T) -> $T {
                    $T(avx!($f(self.0, o.0)))
                }
            }
        };
    }
    binop!(V8, Add, add, _mm256_add_ps);
    binop!(V8, Sub, sub, _mm256_sub_ps);
    binop!(V8, Mul, mul, _mm256_mul_ps);
    binop!(V8, Div, div, _mm256_div_ps);
    binop!(M8, BitAnd, bitand, _mm256_and_ps);
    binop!(M8, BitOr, bitor, _mm256_or_ps);
    binop!(D4, Add, add, _mm256_add_pd);
    binop!(D4, Sub, sub, _mm256_sub_pd);
    binop!(D4, Mul, mul, _mm256_mul_pd);
    binop!(D4, Div, div, _mm256_div_pd);

    impl Neg for V8 {
        type Output = V8;
        #[inline(always)]
        fn neg(self) -> V8 {
            V8(avx!(_mm256_xor_ps(self.0, _mm256_set1_ps(-0.0))))
        }
    }
    impl Not for M8 {
        type Output = M8;
        #[inline(always)]
        fn not(self) -> M8 {
            M8(avx!(_mm256_xor_ps(
                self.0,
                _mm256_castsi256_ps(_mm256_set1_epi32(-1))
            )))
        }
    }

    impl Lanes for V8 {
        type Mask = M8;
        type Int = I8;
        type Wide = D4;
        const N: usize = 8;
        #[inline(always)]
        fn splat(self, c: f32) -> V8 {
            V8(avx!(_mm256_set1_ps(c)))
        }
        #[inline(always)]
        fn splat_int(self, c: i32) -> I8 {
            I8(avx!(_mm256_set1_epi32(c)))
        }
        #[inline(always)]
        fn fma(self, b: V8, c: V8) -> V8 {
            V8(avx!(_mm256_fmadd_ps(self.0, b.0, c.0)))
        }
        #[inline(always)]
        fn max(self, o: V8) -> V8 {
            V8(avx!(_mm256_max_ps(self.0, o.0)))
        }
        #[inline(always)]
        fn min(self, o: V8) -> V8 {
            V8(avx!(_mm256_min_ps(self.0, o.0)))
        }
        #[inline(always)]
        fn abs(self) -> V8 {
            V8(avx!(_mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0)))
        }
        #[inline(always)]
        fn lt(self, o: V8) -> M8 {
            M8(avx!(_mm256_cmp_ps::<_CMP_LT_OQ>(self.0, o.0)))
        }
        #[inline(always)]
        fn eq(self, o: V8) -> M8 {
            M8(avx!(_mm256_cmp_ps::<_CMP_EQ_OQ>(self.0, o.0)))
        }
        #[inline(always)]
        fn is_nan(self) -> M8 {
            M8(avx!(_mm256_cmp_ps::<_CMP_UNORD_Q>(self.0, self.0)))
        }
        #[inline(always)]
        fn select(m: M8, a: V8, b: V8) -> V8 {
            V8(avx!(_mm256_blendv_ps(b.0, a.0, m.0)))
        }
        #[inline(always)]
        fn any(m: M8) -> bool {
            avx!(_mm256_movemask_ps(m.0)) != 0
        }
        #[inline(always)]
        fn bits(self) -> I8 {
            I8(avx!(_mm256_castps_si256(self.0)))
        }
        #[inline(always)]
        fn from_bits(i: I8) -> V8 {
            V8(avx!(_mm256_castsi256_ps(i.0)))
        }
        #[inline(always)]
        fn from_int(i: I8) -> V8 {
            V8(avx!(_mm256_cvtepi32_ps(i.0)))
        }
        #[inline(always)]
        fn trunc_int(self) -> I8 {
            I8(avx!(_mm256_cvttps_epi32(self.0)))
        }
        #[inline(always)]
        fn int_eq(a: I8, b: I8) -> M8 {
            M8(avx!(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a.0, b.0))))
        }
        #[inline(always)]
        fn load(self, src: &[f32]) -> V8 {
            assert!(src.len() >= 8);
            V8(avx!(_mm256_loadu_ps(src.as_ptr())))
        }
        #[inline(always)]
        fn store(self, dst: &mut [f32]) {
            assert!(dst.len() >= 8);
            avx!(_mm256_storeu_ps(dst.as_mut_ptr(), self.0))
        }
        #[inline(always)]
        fn load_int(self, src: &[i32]) -> I8 {
            assert!(src.len() >= 8);
            I8(avx!(_mm256_loadu_si256(src.as_ptr() as *const __m256i)))
        }
        #[inline(always)]
        fn store_int(i: I8, dst: &mut [i32]) {
            assert!(dst.len() >= 8);
            avx!(_mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, i.0))
        }
        #[inline(always)]
        fn map_wide(self, o: V8, f: impl Fn(D4, D4) -> D4) -> V8 {
            let wide = |v: __m128| D4(avx!(_mm256_cvtps_pd(v)));
            let lo = f(
                wide(avx!(_mm256_castps256_ps128(self.0))),
                wide(avx!(_mm256_castps256_ps128(o.0))),
            );
            let hi = f(
                wide(avx!(_mm256_extractf128_ps::<1>(self.0))),
                wide(avx!(_mm256_extractf128_ps::<1>(o.0))),
            );
            V8(avx!(_mm256_set_m128(
                _mm256_cvtpd_ps(hi.0),
                _mm256_cvtpd_ps(lo.0)
            )))
        }
    }

    impl IntLanes for I8 {
        #[inline(always)]
        fn add(self, o: I8) -> I8 {
            I8(avx!(_mm256_add_epi32(self.0, o.0)))
        }
        #[inline(always)]
        fn sub(self, o: I8) -> I8 {
            I8(avx!(_mm256_sub_epi32(self.0, o.0)))
        }
        #[inline(always)]
        fn and(self, o: I8) -> I8 {
            I8(avx!(_mm256_and_si256(self.0, o.0)))
        }
        #[inline(always)]
        fn or(self, o: I8) -> I8 {
            I8(avx!(_mm256_or_si256(self.0, o.0)))
        }
        #[inline(always)]
        fn xor(self, o: I8) -> I8 {
            I8(avx!(_mm256_xor_si256(self.0, o.0)))
        }
        #[inline(always)]
        fn shl<const K: i32>(self) -> I8 {
            I8(avx!(_mm256_slli_epi32::<K>(self.0)))
        }
        #[inline(always)]
        fn sra<const K: i32>(self) -> I8 {
            I8(avx!(_mm256_srai_epi32::<K>(self.0)))
        }
    }

    impl Lanes64 for D4 {
        type Mask = __m256d;
        #[inline(always)]
        fn splat(self, c: f64) -> D4 {
            D4(avx!(_mm256_set1_pd(c)))
        }
        #[inline(always)]
        fn fma(self, b: D4, c: D4) -> D4 {
            D4(avx!(_mm256_fmadd_pd(self.0, b.0, c.0)))
        }
        #[inline(always)]
        fn sqrt(self) -> D4 {
            D4(avx!(_mm256_sqrt_pd(self.0)))
        }
        #[inline(always)]
        fn max(self, o: D4) -> D4 {
            D4(avx!(_mm256_max_pd(self.0, o.0)))
        }
        #[inline(always)]
        fn min(self, o: D4) -> D4 {
            D4(avx!(_mm256_min_pd(self.0, o.0)))
        }
        #[inline(always)]
        fn lt(self, o: D4) -> __m256d {
            avx!(_mm256_cmp_pd::<_CMP_LT_OQ>(self.0, o.0))
        }
        #[inline(always)]
        fn select(m: __m256d, a: D4, b: D4) -> D4 {
            D4(avx!(_mm256_blendv_pd(b.0, a.0, m)))
        }
        #[inline(always)]
        fn bits_and(self, m: u64) -> D4 {
            D4(avx!(_mm256_and_pd(
                self.0,
                _mm256_castsi256_pd(_mm256_set1_epi64x(m as i64))
            )))
        }
        #[inline(always)]
        fn bits_or(self, m: u64) -> D4 {
            D4(avx!(_mm256_or_pd(
                self.0,
                _mm256_castsi256_pd(_mm256_set1_epi64x(m as i64))
            )))
        }
        #[inline(always)]
        fn bits_shr<const K: i32>(self) -> D4 {
            D4(avx!(_mm256_castsi256_pd(_mm256_srli_epi64::<K>(
                _mm256_castpd_si256(self.0)
            ))))
        }
        #[inline(always)]
        fn bits_shl<const K: i32>(self) -> D4 {
            D4(avx!(_mm256_castsi256_pd(_mm256_slli_epi64::<K>(
                _mm256_castpd_si256(self.0)
            ))))
        }
        #[inline(always)]
        fn bits_add(self, o: D4) -> D4 {
            D4(avx!(_mm256_castsi256_pd(_mm256_add_epi64(
                _mm256_castpd_si256(self.0),
                _mm256_castpd_si256(o.0)
            ))))
        }
    }
}

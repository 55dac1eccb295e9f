//! Eight f32 lanes (AVX2+FMA): [`Lanes`] as in `lanes.rs`, every operation with the meaning of its
//! scalar counterpart, so the results are those of the one-lane reference.

use super::lanes::{IntLanes, Lanes, Lanes64, WideFn};
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

impl V8 {
    /// The low and high four lanes in f64.
    #[inline(always)]
    fn halves(self) -> (D4, D4) {
        let lo = avx!(_mm256_cvtps_pd(_mm256_castps256_ps128(self.0)));
        let hi = avx!(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(self.0)));
        (D4(lo), D4(hi))
    }
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
    fn sqrt(self) -> V8 {
        V8(avx!(_mm256_sqrt_ps(self.0)))
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
    fn lookup8(self, i: I8, table: &[f32; 8]) -> V8 {
        V8(avx!(_mm256_permutevar8x32_ps(
            _mm256_loadu_ps(table.as_ptr()),
            i.0
        )))
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
    fn map_wide<F: WideFn>(self, o: V8) -> V8 {
        let (xl, xh) = self.halves();
        let (ol, oh) = o.halves();
        let (lo, hi) = (F::apply(xl, ol), F::apply(xh, oh));
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

//! Sixteen f32 lanes (AVX-512F): [`Lanes`] as in `lanes.rs`, for the functions where the wider
//! vectors pay. Only AVX-512F instructions are used (no DQ/BW/VL), and every operation has the
//! meaning of its scalar counterpart, so the results are those of the one-lane reference.

use super::lanes::{IntLanes, Lanes, Lanes64, WideFn};
use std::arch::x86_64::*;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Sixteen f32 lanes. Made only by [`V16::load_ptr`] / [`V16::splat_new`], whose callers have
/// checked AVX-512F (and AVX2, FMA) at run time; so every method below runs on such a CPU.
#[derive(Clone, Copy)]
pub(crate) struct V16(__m512);
/// Sixteen i32 lanes (from a [`V16`]).
#[derive(Clone, Copy)]
pub(crate) struct I16(__m512i);
/// Eight f64 lanes (half a [`V16`]).
#[derive(Clone, Copy)]
pub(crate) struct D8(__m512d);

impl V16 {
    /// # Safety
    /// The CPU must support AVX-512F; `p` must be valid for reading 16 f32.
    #[inline(always)]
    pub(crate) unsafe fn load_ptr(p: *const f32) -> V16 {
        // SAFETY: forwarded to the caller.
        V16(unsafe { _mm512_loadu_ps(p) })
    }
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn splat_new(c: f32) -> V16 {
        // SAFETY: forwarded to the caller.
        V16(unsafe { _mm512_set1_ps(c) })
    }
    /// # Safety
    /// `p` must be valid for writing 16 f32.
    #[inline(always)]
    pub(crate) unsafe fn store_ptr(self, p: *mut f32) {
        // SAFETY: AVX-512F as for every V16 (see the type); `p` by the caller.
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
}

/// `$body` with AVX-512F instructions, which every value of these types vouches for (see [`V16`]).
macro_rules! avx512 {
    ($body:expr) => {
        // SAFETY: a V16 / I16 / D8 exists only on a CPU with AVX-512F (see `V16`).
        unsafe { $body }
    };
}

macro_rules! binop {
    ($T:ident, $Tr:ident, $m:ident, $f:ident) => {
        impl $Tr for $T {
            type Output = $T;
            #[inline(always)]
            fn $m(self, o: $T) -> $T {
                $T(avx512!($f(self.0, o.0)))
            }
        }
    };
}
binop!(V16, Add, add, _mm512_add_ps);
binop!(V16, Sub, sub, _mm512_sub_ps);
binop!(V16, Mul, mul, _mm512_mul_ps);
binop!(V16, Div, div, _mm512_div_ps);
binop!(D8, Add, add, _mm512_add_pd);
binop!(D8, Sub, sub, _mm512_sub_pd);
binop!(D8, Mul, mul, _mm512_mul_pd);
binop!(D8, Div, div, _mm512_div_pd);

impl Neg for V16 {
    type Output = V16;
    #[inline(always)]
    fn neg(self) -> V16 {
        let sign = avx512!(_mm512_set1_epi32(i32::MIN));
        V16::from_bits(I16(sign)).bits_xor(self)
    }
}

impl V16 {
    /// The low and high eight lanes in f64.
    #[inline(always)]
    fn halves(self) -> (D8, D8) {
        let lo = avx512!(_mm512_castps512_ps256(self.0));
        let hi = avx512!(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(self.0)
        )));
        (
            D8(avx512!(_mm512_cvtps_pd(lo))),
            D8(avx512!(_mm512_cvtps_pd(hi))),
        )
    }
    #[inline(always)]
    fn bits_xor(self, o: V16) -> V16 {
        V16(avx512!(_mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(self.0),
            _mm512_castps_si512(o.0)
        ))))
    }
}

/// A shift count register (the immediate forms take `u32` counts, the trait `i32`).
#[inline(always)]
fn count(k: i32) -> __m128i {
    avx512!(_mm_cvtsi32_si128(k))
}

impl Lanes for V16 {
    type Mask = u16;
    type Int = I16;
    type Wide = D8;
    const N: usize = 16;
    #[inline(always)]
    fn splat(self, c: f32) -> V16 {
        V16(avx512!(_mm512_set1_ps(c)))
    }
    #[inline(always)]
    fn splat_int(self, c: i32) -> I16 {
        I16(avx512!(_mm512_set1_epi32(c)))
    }
    #[inline(always)]
    fn fma(self, b: V16, c: V16) -> V16 {
        V16(avx512!(_mm512_fmadd_ps(self.0, b.0, c.0)))
    }
    #[inline(always)]
    fn max(self, o: V16) -> V16 {
        V16(avx512!(_mm512_max_ps(self.0, o.0)))
    }
    #[inline(always)]
    fn min(self, o: V16) -> V16 {
        V16(avx512!(_mm512_min_ps(self.0, o.0)))
    }
    #[inline(always)]
    fn abs(self) -> V16 {
        V16(avx512!(_mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(self.0),
            _mm512_set1_epi32(i32::MAX)
        ))))
    }
    #[inline(always)]
    fn sqrt(self) -> V16 {
        V16(avx512!(_mm512_sqrt_ps(self.0)))
    }
    #[inline(always)]
    fn lt(self, o: V16) -> u16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, o.0))
    }
    #[inline(always)]
    fn eq(self, o: V16) -> u16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(self.0, o.0))
    }
    #[inline(always)]
    fn is_nan(self) -> u16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self.0, self.0))
    }
    #[inline(always)]
    fn select(m: u16, a: V16, b: V16) -> V16 {
        V16(avx512!(_mm512_mask_blend_ps(m, b.0, a.0)))
    }
    #[inline(always)]
    fn any(m: u16) -> bool {
        m != 0
    }
    #[inline(always)]
    fn bits(self) -> I16 {
        I16(avx512!(_mm512_castps_si512(self.0)))
    }
    #[inline(always)]
    fn from_bits(i: I16) -> V16 {
        V16(avx512!(_mm512_castsi512_ps(i.0)))
    }
    #[inline(always)]
    fn from_int(i: I16) -> V16 {
        V16(avx512!(_mm512_cvtepi32_ps(i.0)))
    }
    #[inline(always)]
    fn trunc_int(self) -> I16 {
        I16(avx512!(_mm512_cvttps_epi32(self.0)))
    }
    #[inline(always)]
    fn int_eq(a: I16, b: I16) -> u16 {
        avx512!(_mm512_cmpeq_epi32_mask(a.0, b.0))
    }
    #[inline(always)]
    fn lookup8(self, i: I16, table: &[f32; 8]) -> V16 {
        // Indices below 8 read only the low half, the table.
        let t = avx512!(_mm512_castps256_ps512(_mm256_loadu_ps(table.as_ptr())));
        V16(avx512!(_mm512_permutexvar_ps(i.0, t)))
    }
    #[inline(always)]
    fn load(self, src: &[f32]) -> V16 {
        assert!(src.len() >= 16);
        V16(avx512!(_mm512_loadu_ps(src.as_ptr())))
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32]) {
        assert!(dst.len() >= 16);
        avx512!(_mm512_storeu_ps(dst.as_mut_ptr(), self.0))
    }
    #[inline(always)]
    fn load_int(self, src: &[i32]) -> I16 {
        assert!(src.len() >= 16);
        I16(avx512!(_mm512_loadu_si512(src.as_ptr() as *const _)))
    }
    #[inline(always)]
    fn store_int(i: I16, dst: &mut [i32]) {
        assert!(dst.len() >= 16);
        avx512!(_mm512_storeu_si512(dst.as_mut_ptr() as *mut _, i.0))
    }
    #[inline(always)]
    fn map_wide<F: WideFn>(self, o: V16) -> V16 {
        let ((xl, xh), (ol, oh)) = (self.halves(), o.halves());
        let (lo, hi) = (F::apply(xl, ol), F::apply(xh, oh));
        V16(avx512!(_mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(lo.0))),
            _mm256_castps_pd(_mm512_cvtpd_ps(hi.0))
        ))))
    }
}

impl IntLanes for I16 {
    #[inline(always)]
    fn add(self, o: I16) -> I16 {
        I16(avx512!(_mm512_add_epi32(self.0, o.0)))
    }
    #[inline(always)]
    fn sub(self, o: I16) -> I16 {
        I16(avx512!(_mm512_sub_epi32(self.0, o.0)))
    }
    #[inline(always)]
    fn and(self, o: I16) -> I16 {
        I16(avx512!(_mm512_and_si512(self.0, o.0)))
    }
    #[inline(always)]
    fn or(self, o: I16) -> I16 {
        I16(avx512!(_mm512_or_si512(self.0, o.0)))
    }
    #[inline(always)]
    fn xor(self, o: I16) -> I16 {
        I16(avx512!(_mm512_xor_si512(self.0, o.0)))
    }
    #[inline(always)]
    fn shl<const K: i32>(self) -> I16 {
        I16(avx512!(_mm512_sll_epi32(self.0, count(K))))
    }
    #[inline(always)]
    fn sra<const K: i32>(self) -> I16 {
        I16(avx512!(_mm512_sra_epi32(self.0, count(K))))
    }
}

impl Lanes64 for D8 {
    type Mask = u8;
    #[inline(always)]
    fn splat(self, c: f64) -> D8 {
        D8(avx512!(_mm512_set1_pd(c)))
    }
    #[inline(always)]
    fn fma(self, b: D8, c: D8) -> D8 {
        D8(avx512!(_mm512_fmadd_pd(self.0, b.0, c.0)))
    }
    #[inline(always)]
    fn max(self, o: D8) -> D8 {
        D8(avx512!(_mm512_max_pd(self.0, o.0)))
    }
    #[inline(always)]
    fn min(self, o: D8) -> D8 {
        D8(avx512!(_mm512_min_pd(self.0, o.0)))
    }
    #[inline(always)]
    fn lt(self, o: D8) -> u8 {
        avx512!(_mm512_cmp_pd_mask::<_CMP_LT_OQ>(self.0, o.0))
    }
    #[inline(always)]
    fn select(m: u8, a: D8, b: D8) -> D8 {
        D8(avx512!(_mm512_mask_blend_pd(m, b.0, a.0)))
    }
    #[inline(always)]
    fn bits_and(self, m: u64) -> D8 {
        D8(avx512!(_mm512_castsi512_pd(_mm512_and_si512(
            _mm512_castpd_si512(self.0),
            _mm512_set1_epi64(m as i64)
        ))))
    }
    #[inline(always)]
    fn bits_or(self, m: u64) -> D8 {
        D8(avx512!(_mm512_castsi512_pd(_mm512_or_si512(
            _mm512_castpd_si512(self.0),
            _mm512_set1_epi64(m as i64)
        ))))
    }
    #[inline(always)]
    fn bits_shr<const K: i32>(self) -> D8 {
        D8(avx512!(_mm512_castsi512_pd(_mm512_srl_epi64(
            _mm512_castpd_si512(self.0),
            count(K)
        ))))
    }
    #[inline(always)]
    fn bits_shl<const K: i32>(self) -> D8 {
        D8(avx512!(_mm512_castsi512_pd(_mm512_sll_epi64(
            _mm512_castpd_si512(self.0),
            count(K)
        ))))
    }
    #[inline(always)]
    fn bits_add(self, o: D8) -> D8 {
        D8(avx512!(_mm512_castsi512_pd(_mm512_add_epi64(
            _mm512_castpd_si512(self.0),
            _mm512_castpd_si512(o.0)
        ))))
    }
}

//! The one way the interpreter compiles a loop twice: [`multiversion!`] builds a function's body for
//! the baseline target and again with AVX2 + FMA enabled, and picks one per call. The two give the
//! same bits (`mul_add` is exact either way; nothing is contracted implicitly). The explicit-intrinsic
//! kernels here (`fold16`, `tree16`, ...) are AVX2 code only, called after the same check. The CPU
//! feature checks are the vector math's ([`crate::math::cpu`]), which picks its lane widths by them.

/// Whether this CPU has AVX2 and FMA (see [`crate::math::cpu`]).
#[cfg(target_arch = "x86_64")]
pub(crate) use crate::math::cpu::avx2;

/// Define `fn name[generics](args) -> Ret { body }` whose body is compiled twice — for the baseline
/// target and with `#[target_feature(enable = "avx2,fma")]` — running the AVX2 build when [`avx2`]
/// says the CPU has it. Generics go in square brackets (no `where` clauses); every argument is a plain
/// `name: Type`. The body is `#[inline(always)]` into both builds, so the closures and generic callees
/// it calls are vectorized for the enabled features too.
macro_rules! multiversion {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident [$($gen:tt)*] ($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $body:block
    ) => {
        $(#[$attr])*
        $vis fn $name<$($gen)*>($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable<$($gen)*>($($arg: $ty),*) -> $ret $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2<$($gen)*>($($arg: $ty),*) -> $ret {
                portable($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            if $crate::interpret::simd::avx2() {
                // SAFETY: the CPU has AVX2 and FMA (checked at run time).
                return unsafe { avx2($($arg),*) };
            }
            portable($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Max / min of a row with plain `vmaxps` / `vminps`, when that is provably the answer of the 16-lane
/// NaN-propagating reduction: without NaNs, that reduction (which orders -0 below +0) computes the
/// order-independent extremum, and `vmaxps` / `vminps` differ from it only in the sign of a zero tie,
/// which can matter only when the extremum itself is a zero. None for a row with a NaN or a zero result.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn max_min_no_nan<const K: u8>(row: &[f32], identity: f32) -> Option<f32> {
    use super::row_order::MAX;
    use std::arch::x86_64::*;
    let mut a0 = _mm256_set1_ps(identity);
    let mut a1 = _mm256_set1_ps(identity);
    let mut nan = _mm256_setzero_ps();
    let chunks = row.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        // SAFETY: `c` has 16 elements; unaligned loads.
        let (x0, x1) = unsafe {
            (
                _mm256_loadu_ps(c.as_ptr()),
                _mm256_loadu_ps(c.as_ptr().add(8)),
            )
        };
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x0, x1));
        if K == MAX {
            a0 = _mm256_max_ps(a0, x0);
            a1 = _mm256_max_ps(a1, x1);
        } else {
            a0 = _mm256_min_ps(a0, x0);
            a1 = _mm256_min_ps(a1, x1);
        }
    }
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` has room for two 8-lane stores.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), a0);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a1);
    }
    let mut r = identity;
    for &x in lanes.iter().chain(rest) {
        if x.is_nan() {
            return None;
        }
        if (K == MAX && x > r) || (K != MAX && x < r) {
            r = x;
        }
    }
    (r != 0.0).then_some(r)
}

/// `a + x` lane by lane in this operand order: a NaN lane gives the first NaN operand, quieted (the
/// scalar [`crate::math::add_f32`]'s rule). `_mm256_add_ps` leaves the order to the compiler, which
/// commutes it in optimized builds; the instruction written out keeps it.
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) unsafe fn add_ps_ordered(
    a: std::arch::x86_64::__m256,
    x: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    let r;
    // SAFETY: one AVX instruction on registers (AVX by the caller); no memory, no flags.
    unsafe {
        std::arch::asm!(
            "vaddps {r}, {a}, {x}",
            r = lateout(ymm_reg) r,
            a = in(ymm_reg) a,
            x = in(ymm_reg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    r
}

/// One 8-lane step of a sum / NaN-propagating max / min (the vector form of `reduce`'s combine).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn comb_ps<const K: u8>(
    a: std::arch::x86_64::__m256,
    x: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use super::row_order::{MAX, SUM};
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is guaranteed by the caller.
    unsafe {
        match K {
            SUM => add_ps_ordered(a, x),
            _ => {
                let m = if K == MAX {
                    _mm256_max_ps(a, x)
                } else {
                    _mm256_min_ps(a, x)
                };
                let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(a, x);
                let zeros = if K == MAX {
                    _mm256_and_ps(a, x)
                } else {
                    _mm256_or_ps(a, x)
                };
                let m = _mm256_blendv_ps(m, zeros, eq);
                let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, x);
                _mm256_blendv_ps(m, add_ps_ordered(a, x), nan)
            }
        }
    }
}

/// The pairwise tree of 16 lanes (`lane[i] ⊕= lane[i + w]` for `w` = 8, 4, 2, 1; the vector form of
/// [`super::row_order::RowAcc::finish`] before its `rest`): `lane[0]`, the same bits as the scalar tree
/// (each step is [`comb_ps`], lane for lane the scalar combiner), without its data-dependent branches.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tree16<const K: u8>(lanes: &[f32; 16]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: `lanes` has 16 elements; unaligned loads; AVX2 by the caller.
    unsafe {
        // w = 8: t[i] = l[i] ⊕ l[i + 8].
        let t = comb_ps::<K>(
            _mm256_loadu_ps(lanes.as_ptr()),
            _mm256_loadu_ps(lanes.as_ptr().add(8)),
        );
        // w = 4: the high 128 bits brought down.
        let t = comb_ps::<K>(t, _mm256_permute2f128_ps::<1>(t, t));
        // w = 2: lanes 0, 1 take lanes 2, 3.
        let t = comb_ps::<K>(t, _mm256_permute_ps::<0xEE>(t));
        // w = 1: lane 0 takes lane 1.
        let t = comb_ps::<K>(t, _mm256_permute_ps::<0x55>(t));
        _mm256_cvtss_f32(t)
    }
}

/// Fold `v` (a multiple of 16 long) into 16 running lanes: lane `j` takes elements `16q + j` (the
/// vector form of [`super::row_order::RowAcc::fold`]).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn fold16<const K: u8>(lanes: &mut [f32; 16], v: &[f32]) {
    use std::arch::x86_64::*;
    // SAFETY: `lanes` has 16 elements, every chunk of `v` 16; unaligned loads and stores.
    unsafe {
        let mut a0 = _mm256_loadu_ps(lanes.as_ptr());
        let mut a1 = _mm256_loadu_ps(lanes.as_ptr().add(8));
        for c in v.chunks_exact(16) {
            a0 = comb_ps::<K>(a0, _mm256_loadu_ps(c.as_ptr()));
            a1 = comb_ps::<K>(a1, _mm256_loadu_ps(c.as_ptr().add(8)));
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), a0);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a1);
    }
}

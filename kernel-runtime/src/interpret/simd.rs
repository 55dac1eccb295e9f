//! Run-time CPU feature checks: the hot loops are compiled twice, for the baseline target and with AVX2
//! (`#[target_feature]`), and pick one per call. The results are bit-identical (`mul_add` is exact either way; nothing is contracted implicitly).

/// Whether this CPU has AVX2 and FMA (cached by std after the first call). The `*_avx2` variants of
/// the hot loops are compiled with both enabled.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Sum / NaN-propagating max / min of a contiguous f32 row with AVX2, lane for lane the same order as
/// the portable `reduce_row` (16 lanes: element `i` goes to lane `i % 16`, then a pairwise tree), so
/// both paths give identical bits.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn reduce_row_f32<const K: u8>(row: &[f32]) -> f32 {
    use super::math::{max_f32, min_f32};
    use super::reduce::{MAX, SUM};
    use std::arch::x86_64::*;
    let identity = match K {
        SUM => 0.0,
        MAX => f32::NEG_INFINITY,
        _ => f32::INFINITY,
    };
    use comb_ps as comb;
    let scalar = |a: f32, b: f32| match K {
        SUM => a + b,
        MAX => max_f32(a, b),
        _ => min_f32(a, b),
    };
    if K != SUM {
        // SAFETY: AVX2 per this function's contract.
        if let Some(r) = unsafe { max_min_no_nan::<K>(row, identity) } {
            return r;
        }
    }
    let mut a0 = _mm256_set1_ps(identity);
    let mut a1 = _mm256_set1_ps(identity);
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
        a0 = comb::<K>(a0, x0);
        a1 = comb::<K>(a1, x1);
    }
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` has room for two 8-lane stores.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), a0);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a1);
    }
    let r = rest.iter().fold(identity, |a, &x| scalar(a, x));
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            lanes[i] = scalar(lanes[i], lanes[i + w]);
        }
    }
    scalar(lanes[0], r)
}

/// Max / min of a row with plain `vmaxps` / `vminps`, when that is provably the answer of the 16-lane
/// NaN-propagating reduction: without NaNs, that reduction (which orders -0 below +0) computes the
/// order-independent extremum, and `vmaxps` / `vminps` differ from it only in the sign of a zero tie,
/// which can matter only when the extremum itself is a zero. None for a row with a NaN or a zero result.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn max_min_no_nan<const K: u8>(row: &[f32], identity: f32) -> Option<f32> {
    use super::reduce::MAX;
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
    use super::reduce::{MAX, SUM};
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is guaranteed by the caller.
    unsafe {
        match K {
            SUM => _mm256_add_ps(a, x),
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
                _mm256_blendv_ps(m, _mm256_add_ps(a, x), nan)
            }
        }
    }
}

/// Fold `v` (a multiple of 16 long) into 16 running lanes: lane `j` takes elements `16q + j`.
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

/// `v[i] = exp_f32(v[i])` with AVX2+FMA, bit for bit [`super::math::exp_f32`]: the same clamp, range
/// reduction and polynomial, op for op. The only shortcut: `exp_f32` scales by `2^n` in two factors so
/// that subnormal results round once; when every lane of a vector has `n >= -126` both factors and
/// their product are normal powers of two, `y·2^n` is one rounding either way, and a single factor
/// gives the same bits with five fewer instructions. Vectors with a lane below take the two-factor path.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_in_place(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = v.len() / 8 * 8;
    let (body, tail) = v.split_at_mut(full);
    let lo = _mm256_set1_ps(-110.0);
    let hi = _mm256_set1_ps(89.0);
    let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
    let round = _mm256_set1_ps(12_582_912.0);
    let neg_ln2_hi = _mm256_set1_ps(-0.693_359_4);
    let neg_ln2_lo = _mm256_set1_ps(2.121_944_4e-4);
    let c = [
        _mm256_set1_ps(1.987_569_1e-4),
        _mm256_set1_ps(1.398_199_9e-3),
        _mm256_set1_ps(8.333_452e-3),
        _mm256_set1_ps(4.166_579_6e-2),
        _mm256_set1_ps(1.666_666_5e-1),
        _mm256_set1_ps(0.5),
    ];
    let one = _mm256_set1_ps(1.0);
    let bias = _mm256_set1_epi32(127);
    let round_bits = _mm256_set1_epi32(0x4B40_0000);
    let (below, above) = (_mm256_set1_epi32(-126), _mm256_set1_epi32(127));
    for chunk in body.chunks_exact_mut(8) {
        // SAFETY: `chunk` has 8 elements; unaligned load and store.
        let x = unsafe { _mm256_loadu_ps(chunk.as_ptr()) };
        // clamp(x, LO, HI) with NaN kept: MAXPS/MINPS return their second operand on NaN.
        let xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
        let t = _mm256_fmadd_ps(xc, log2e, round);
        let n = _mm256_sub_ps(t, round);
        let ni = _mm256_sub_epi32(_mm256_castps_si256(t), round_bits);
        // (-n)·LN2_HI + xc, then (-n)·LN2_LO + r: fma(n, -LN2_HI, xc) is the same exact product.
        let r = _mm256_fmadd_ps(n, neg_ln2_hi, xc);
        let r = _mm256_fmadd_ps(n, neg_ln2_lo, r);
        let mut p = c[0];
        for ck in &c[1..] {
            p = _mm256_fmadd_ps(p, r, *ck);
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
        let outside = _mm256_or_si256(_mm256_cmpgt_epi32(below, ni), _mm256_cmpgt_epi32(ni, above));
        let out = if _mm256_testz_si256(outside, outside) == 1 {
            let s = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni, bias));
            _mm256_mul_ps(y, _mm256_castsi256_ps(s))
        } else {
            let n1 = _mm256_srai_epi32::<1>(ni);
            let n2 = _mm256_sub_epi32(ni, n1);
            let s1 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias));
            let s2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias));
            let scaled = _mm256_mul_ps(
                _mm256_mul_ps(y, _mm256_castsi256_ps(s1)),
                _mm256_castsi256_ps(s2),
            );
            // NaN lanes (always here: their `n` is out of range) give `x + x`, as in `exp_f32`.
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
            _mm256_blendv_ps(scaled, _mm256_add_ps(x, x), nan)
        };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), out) };
    }
    for x in tail {
        *x = super::math::exp_f32(*x);
    }
}

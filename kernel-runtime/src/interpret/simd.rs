//! Run-time CPU features, and the one way the interpreter compiles a loop twice: [`multiversion!`]
//! builds a function's body for the baseline target and again with AVX2 + FMA enabled, and picks one
//! per call. The two give the same bits (`mul_add` is exact either way; nothing is contracted
//! implicitly). The explicit-intrinsic kernels here (`fold16`, `exp_run`, ...) are AVX2 code only,
//! called after the same check.

/// Whether this CPU has AVX2 and FMA (cached by std after the first call).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

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

/// Whether this CPU has AVX-512F (checked once): `exp_run` then takes 16 lanes per step.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
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

/// Where [`exp_run`] reads its input.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) enum ExpIn<'a> {
    /// The destination itself (`v = exp(v)`).
    InPlace,
    /// `exp(src[i] - m)`: a fused chain's leading subtraction of a broadcast scalar (f32, no rounding
    /// step between), read straight from the operand.
    SubScalar(&'a [f32], f32),
}

/// `dst[i] = exp_f32(input[i])` with AVX2+FMA, bit for bit [`super::math::exp_f32`]: the same clamp,
/// range reduction and polynomial, op for op. With `sum`, the results are also folded into the row's
/// reduction in [`super::row_order`]'s order (as `sum.fold_f32::<SUM>(dst)` would).
///
/// The one shortcut: `exp_f32` scales by `2^n` in two factors so that subnormal results round once;
/// when every lane of a vector has `-126 <= n <= 127`, `2^n` is itself a normal f32, `y·2^n` is one
/// rounding either way, and a single factor gives the same bits with five fewer instructions. Vectors
/// with a lane outside (NaN lanes included) take the two-factor path.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn exp_run(
    dst: &mut [f32],
    input: ExpIn<'_>,
    sum: Option<&mut super::row_order::RowAcc<f32>>,
) {
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
pub(crate) unsafe fn exp_run_avx2(
    dst: &mut [f32],
    input: ExpIn<'_>,
    sum: Option<&mut super::row_order::RowAcc<f32>>,
) {
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
        Some(acc) => {
            let lanes = &mut acc.lanes;
            // SAFETY: as above; `lanes` has 16 elements.
            unsafe {
                let mut a0 = _mm256_loadu_ps(lanes.as_ptr());
                let mut a1 = _mm256_loadu_ps(lanes.as_ptr().add(8));
                let mut i = 0;
                while i < full16 {
                    let (e0, e1) = (exp8(load(i)), exp8(load(i + 8)));
                    _mm256_storeu_ps(p.add(i), e0);
                    _mm256_storeu_ps(p.add(i + 8), e1);
                    a0 = comb_ps::<{ super::row_order::SUM }>(a0, e0);
                    a1 = comb_ps::<{ super::row_order::SUM }>(a1, e1);
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
                acc.rest += e;
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
pub(crate) unsafe fn exp_run_avx512(
    dst: &mut [f32],
    input: ExpIn<'_>,
    sum: Option<&mut super::row_order::RowAcc<f32>>,
) {
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
            acc.rest += e;
        }
    }
}

/// Sixteen lanes of `exp_f32`: [`exp8`] op for op.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use super::math::exp_consts::*;
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
        dst[i] = super::math::exp_f32(x);
    }
}

/// Eight lanes of `exp_f32` (see [`exp_run`]).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use super::math::exp_consts::*;
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
        let scaled = _mm256_mul_ps(
            _mm256_mul_ps(y, _mm256_castsi256_ps(s1)),
            _mm256_castsi256_ps(s2),
        );
        // NaN lanes (always here: their `n` is out of range) give `x + x`, as in `exp_f32`.
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_blendv_ps(scaled, _mm256_add_ps(x, x), nan)
    }
}

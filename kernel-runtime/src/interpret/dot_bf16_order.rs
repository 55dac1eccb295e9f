//! The one accumulation order of a bf16 × bf16 → f32 `dot`, on every CPU: the order of AVX-512 BF16's
//! `vdpbf16ps`, which `dot_bf16` runs in hardware, written out here for every other CPU (AVX2 + FMA,
//! else scalar), so a kernel gives the same bits wherever it runs.
//!
//! **The order.** Per output `(i, j)`, starting from the accumulator `c(i, j)` (or +0 when there is
//! none), for each pair index `p` in `0..⌈k/2⌉`:
//! `s = s + a(i, 2p+1)·b(2p+1, j)`, then `s = s + a(i, 2p)·b(2p, j)` — the odd member of the pair
//! first, a zero in its place past an odd `k` —, each step one fused multiply-add rounded to nearest
//! even. An input (an element of `a` or `b`, or the accumulator) that is subnormal reads as a zero of
//! its sign, and a step whose result is subnormal gives a zero of its sign (DAZ and FTZ).
//! `tests::every_path_gives_vdpbf16ps_bits` holds the four kernels (`vdpbf16ps`, the two FMA tiles,
//! the scalar definition) equal bit for bit on random bit patterns, subnormals, infinities and
//! cancellations included.
//!
//! **The FMA kernels** are the f32 form of the same steps: operands widened to f32 (exact) and
//! packed — `a` row-major (rows padded to a multiple of `MR`), `b` per `NR`-column panel, one k row
//! per step, zeros past the edges —; an `MR × NR` tile of accumulators takes each k row in the order
//! above: 6×16 in 256-bit registers (AVX2 + FMA), 8×32 in 512-bit ones (AVX-512F). DAZ and FTZ are the
//! CPU's own (MXCSR bits 6 and 15, set for the kernel's call and restored after it, see [`DazFtz`]),
//! so the inner loop is plain FMAs.
//!
//! **Which kernel runs** ([`gemm`], as `crate::math::cpu::bf16_dot` says): `vdpbf16ps` where the CPU
//! has AVX-512 BF16 and it outruns a 512-bit FMA (`crate::math::cpu::bf16_dot_by_dpbf16`: AMD),
//! else the 8×32 tile where the CPU has AVX-512F (Intel without AMX: twice `vdpbf16ps`'s rate), else
//! the 6×16 tile, else the definition. The choice changes the speed, never the bits.

use super::dot::{KeepRows, View};
use half::bf16;

/// A bf16 element as f32 (exact: the bf16's bits are the f32's high half).
#[inline(always)]
fn widen(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// `x`, or a zero of its sign when `x` is subnormal (DAZ on an input, FTZ on a result).
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// `c = a·b + (accumulate ? c : 0)` in the order of the module docs, for `a: m×k`, `b: k×n` and a
/// row-major `m×n` `c`; the views lie inside their buffers (the caller checks).
///
/// `keep` (rows of `b` read as +0 where it does not hold, see [`KeepRows`]) is taken only where
/// [`packs_kept_rows`]: the caller zeroes the rows itself elsewhere.
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, bf16>,
    (b, keep): (View<'_, bf16>, Option<KeepRows<'_>>),
    c: &mut [f32],
    accumulate: bool,
) -> crate::error::Result<()> {
    use crate::math::cpu::{bf16_dot, Bf16Dot};
    if keep.is_some() && !packs_kept_rows() {
        return Err(super::tensor::internal(
            "kept rows of a dot the kernel cannot drop",
        ));
    }
    match bf16_dot() {
        #[cfg(target_arch = "x86_64")]
        Bf16Dot::Dpbf16 => super::dot_bf16::gemm(m, n, k, a, (b, keep), c, accumulate),
        #[cfg(target_arch = "x86_64")]
        Bf16Dot::Fma512 => fma::gemm::<fma::Avx512>(m, n, k, a, b, c, accumulate),
        #[cfg(target_arch = "x86_64")]
        Bf16Dot::Fma256 => fma::gemm::<fma::Avx2>(m, n, k, a, b, c, accumulate),
        _ => gemm_scalar(m, n, k, a, b, c, accumulate),
    }
    Ok(())
}

/// Whether [`gemm`]'s kernel on this CPU drops `b`'s rows itself (`vdpbf16ps`'s packs its panels of
/// `b` from the kept rows, zeros for the others).
pub(crate) fn packs_kept_rows() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::math::cpu::bf16_dot() == crate::math::cpu::Bf16Dot::Dpbf16
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The definition, one element at a time.
pub(crate) fn gemm_scalar(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, bf16>,
    b: View<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
) {
    let at = |v: &View<'_, bf16>, r: usize, col: usize| {
        flush(widen(v.data[v.off + r * v.rs + col * v.cs]))
    };
    for i in 0..m {
        for j in 0..n {
            let mut s = if accumulate { flush(c[i * n + j]) } else { 0.0 };
            for p in 0..k.div_ceil(2) {
                let (ao, bo) = if 2 * p + 1 < k {
                    (at(&a, i, 2 * p + 1), at(&b, 2 * p + 1, j))
                } else {
                    (0.0, 0.0)
                };
                s = flush(ao.mul_add(bo, s));
                s = flush(at(&a, i, 2 * p).mul_add(at(&b, 2 * p, j), s));
            }
            c[i * n + j] = s;
        }
    }
}

/// MXCSR's DAZ and FTZ bits set for as long as this lives (this thread only), then the old MXCSR back.
///
/// Rust and LLVM assume the default floating-point environment; the kernel run under it is an
/// `#[inline(never)]` function whose float operations all read run-time data, so nothing of it is
/// folded at compile time under the other assumption, and the guard restores the environment on every
/// exit (a panic included) before any other float code runs.
#[cfg(target_arch = "x86_64")]
struct DazFtz(u32);

#[cfg(target_arch = "x86_64")]
impl DazFtz {
    const BITS: u32 = 1 << 6 | 1 << 15;

    fn set() -> Self {
        let mut old = 0u32;
        // SAFETY: stmxcsr stores the 32-bit MXCSR to `old`; ldmxcsr loads a value whose reserved
        // bits are those just read (only DAZ and FTZ are added).
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut old, options(nostack, preserves_flags));
            let new = old | Self::BITS;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &new, options(nostack, preserves_flags));
        }
        DazFtz(old)
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for DazFtz {
    fn drop(&mut self) {
        // SAFETY: restores the MXCSR read in `set`.
        unsafe {
            std::arch::asm!("ldmxcsr [{}]", in(reg) &self.0, options(nostack, preserves_flags));
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod fma {
    use super::super::dot::{edge_tile_load, edge_tile_store};
    use super::{widen, DazFtz, View};
    use half::bf16;
    use std::arch::x86_64::*;

    /// k rows per band (even: whole pairs); a band of a 16-column B panel is 16 KiB, of a 32-column
    /// one 32 KiB.
    const KC: usize = 256;
    /// The largest tile, in f32 (an edge tile's buffer).
    const MAX_TILE: usize = 8 * 32;

    /// A register tile of the FMA form: `MR` rows × `NR` columns of accumulators.
    pub(crate) trait Tile {
        const MR: usize;
        const NR: usize;
        /// `c (MR×NR at row stride ldc) += Σ_p` the odd then the even k row of pair p; A's element
        /// `(i, q)` at `a + i·lda + q`, B's k row q at `b + q·NR`.
        ///
        /// # Safety
        /// The tile's CPU features are available ([`Tile::available`]); `a` holds MR rows of `2·kp`
        /// f32 at stride `lda`, `b` `2·kp·NR`, `c` MR rows of NR at stride `ldc`.
        unsafe fn tile(kp: usize, a: (*const f32, usize), b: *const f32, c: (*mut f32, usize));
        /// Whether this CPU runs the tile (and `widen_contiguous`'s AVX2).
        fn available() -> bool;
    }

    /// 6×16: twelve 256-bit accumulators (AVX2 + FMA).
    pub(crate) struct Avx2;
    /// 8×32: sixteen 512-bit accumulators (AVX-512F), for CPUs where a 512-bit FMA outruns
    /// `vdpbf16ps` (`crate::math::cpu::bf16_dot_by_dpbf16`).
    pub(crate) struct Avx512;

    impl Tile for Avx2 {
        const MR: usize = 6;
        const NR: usize = 16;
        unsafe fn tile(kp: usize, a: (*const f32, usize), b: *const f32, c: (*mut f32, usize)) {
            // SAFETY: the caller's contract (avx2 + fma; the extents of a 6×16 tile).
            unsafe { tile_6x16(kp, a, b, c) }
        }
        fn available() -> bool {
            crate::math::cpu::avx2()
        }
    }

    impl Tile for Avx512 {
        const MR: usize = 8;
        const NR: usize = 32;
        unsafe fn tile(kp: usize, a: (*const f32, usize), b: *const f32, c: (*mut f32, usize)) {
            // SAFETY: the caller's contract (avx512f; the extents of an 8×32 tile).
            unsafe { tile_8x32(kp, a, b, c) }
        }
        fn available() -> bool {
            crate::math::cpu::avx2() && crate::math::cpu::avx512()
        }
    }

    /// See [`super::gemm`]; `T::available()` must be true.
    pub(crate) fn gemm<T: Tile>(
        m: usize,
        n: usize,
        k: usize,
        a: View<'_, bf16>,
        b: View<'_, bf16>,
        c: &mut [f32],
        accumulate: bool,
    ) {
        let (mr, nr) = (T::MR, T::NR);
        assert!(T::available() && mr * nr <= MAX_TILE);
        let kk = 2 * k.div_ceil(2);
        // A widened whole, row-major with row stride kk, rows padded to a multiple of MR (zeros).
        let mut pa = vec![0f32; m.div_ceil(mr) * mr * kk];
        for (i, row) in pa.chunks_mut(kk).take(m).enumerate() {
            widen_run(&mut row[..k], a, a.off + i * a.rs, a.cs);
        }
        // With no accumulator the sums start at +0: `c` zeroed, then accumulated into.
        if !accumulate {
            c.fill(0.0);
        }
        // B per NR-column panel and KC-row band: k row q of the band at `q·NR`.
        let mut pb = vec![0f32; KC * nr];
        let mut col = vec![0f32; KC];
        let mut tile = [0f32; MAX_TILE];
        let _env = DazFtz::set();
        for k0 in (0..kk).step_by(KC) {
            // Rows k0..k0+kc of the padded k (kc even: whole pairs), of which k0..k0+kr are B's.
            let kc = KC.min(kk - k0);
            let kr = kc.min(k - k0);
            for j0 in (0..n).step_by(nr) {
                let nc = nr.min(n - j0);
                if nc < nr || kr < kc {
                    pb.fill(0.0);
                }
                if b.cs == 1 && nc == nr {
                    for q in 0..kr {
                        let at = b.off + (k0 + q) * b.rs + j0;
                        widen_run(&mut pb[q * nr..(q + 1) * nr], b, at, 1);
                    }
                } else if b.rs == 1 {
                    // A transposed operand (`dot_nt`'s keys): each column is a contiguous run of
                    // k, turned into rows of the panel 8 × 8 at a time.
                    pack_transposed(&mut pb, nr, b, (k0, kr), (j0, nc));
                } else {
                    // Columns one by one.
                    for jj in 0..nc {
                        let at = b.off + (j0 + jj) * b.cs + k0 * b.rs;
                        widen_run(&mut col[..kr], b, at, b.rs);
                        for (q, x) in col[..kr].iter().enumerate() {
                            pb[q * nr + jj] = *x;
                        }
                    }
                }
                for i0 in (0..m).step_by(mr) {
                    let rows = mr.min(m - i0);
                    let direct = rows == mr && nc == nr;
                    let (out, ldc) = if direct {
                        (c[i0 * n + j0..].as_mut_ptr(), n)
                    } else {
                        let t = &mut tile[..mr * nr];
                        edge_tile_load(t, nr, c, n, (i0, j0), (rows, nc), true);
                        (tile.as_mut_ptr(), nr)
                    };
                    // SAFETY: `T::available()` (asserted); rows i0..i0+MR of `pa` (padded to a
                    // multiple of MR) hold columns k0..k0+kc at stride kk, pb kc·NR; `out` is MR rows
                    // of NR f32 at stride ldc: the local tile, or (a whole tile) rows i0..i0+MR,
                    // columns j0..j0+NR of the m×n `c`.
                    unsafe {
                        let a_at = pa[i0 * kk + k0..].as_ptr();
                        T::tile(kc / 2, (a_at, kk), pb.as_ptr(), (out, ldc))
                    };
                    if !direct {
                        edge_tile_store(&tile[..mr * nr], nr, c, n, (i0, j0), (rows, nc));
                    }
                }
            }
        }
    }

    /// `dst[t] = widen(v.data[at + t·stride])` for every t (8 at a time when contiguous).
    fn widen_run(dst: &mut [f32], v: View<'_, bf16>, at: usize, stride: usize) {
        let n = dst.len();
        if stride == 1 {
            let src = &v.data[at..at + n];
            // SAFETY: avx2 (every tile's `available`); `src` and `dst` hold n elements each.
            unsafe { widen_contiguous(src.as_ptr().cast(), dst.as_mut_ptr(), n) };
        } else {
            for (t, d) in dst.iter_mut().enumerate() {
                *d = widen(v.data[at + t * stride]);
            }
        }
    }

    /// Rows `k0..k0 + kr` of columns `j0..j0 + nc` of `b` (whose columns are contiguous: `rs` 1),
    /// widened into the panel `pb` (k row q at `q·nr`): 8 × 8 blocks through registers, the edges
    /// one by one.
    fn pack_transposed(
        pb: &mut [f32],
        nr: usize,
        b: View<'_, bf16>,
        (k0, kr): (usize, usize),
        (j0, nc): (usize, usize),
    ) {
        let column = |jj: usize| b.off + (j0 + jj) * b.cs + k0;
        let (j8, q8) = (nc / 8 * 8, kr / 8 * 8);
        assert!(pb.len() >= kr * nr && nc <= nr);
        for jj in (0..j8).step_by(8) {
            let last = column(jj + 7) + kr;
            assert!(last <= b.data.len());
            for q in (0..q8).step_by(8) {
                // SAFETY: avx2 (every tile's `available`); the 8 columns jj..jj+8 hold kr ≥ q + 8
                // elements from `column` (the last one's end checked above, the others' before
                // it: columns ascend by `cs`), and the panel rows q..q+8 hold nr ≥ jj + 8 f32.
                unsafe {
                    transpose8(
                        b.data.as_ptr().add(column(jj) + q).cast(),
                        b.cs,
                        pb.as_mut_ptr().add(q * nr + jj),
                        nr,
                    )
                };
            }
        }
        for jj in 0..nc {
            let from = if jj < j8 { q8 } else { 0 };
            let at = column(jj);
            for q in from..kr {
                pb[q * nr + jj] = widen(b.data[at + q]);
            }
        }
    }

    /// `d[q·ld + c] = widen(s[c·cs + q])` for q, c in 0..8: eight runs of 8 bf16, `cs` apart,
    /// widened and transposed.
    ///
    /// # Safety
    /// avx2 available; `s` readable at `c·cs .. c·cs + 8` for c in 0..8, `d` writable at
    /// `q·ld .. q·ld + 8` for q in 0..8.
    #[target_feature(enable = "avx2")]
    unsafe fn transpose8(s: *const u16, cs: usize, d: *mut f32, ld: usize) {
        // SAFETY: the caller's contract; unaligned accesses.
        unsafe {
            let r = [0, 1, 2, 3, 4, 5, 6, 7].map(|c| widen8(s.add(c * cs)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (q, v) in out.into_iter().enumerate() {
                _mm256_storeu_ps(d.add(q * ld), v);
            }
        }
    }

    /// Eight bf16 at `s`, widened to f32.
    ///
    /// # Safety
    /// avx2 available; `s` readable for 8 u16.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn widen8(s: *const u16) -> __m256 {
        // SAFETY: the caller's contract; an unaligned load.
        unsafe {
            let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x))
        }
    }

    /// `n` bf16 at `s` widened to f32 at `d`, eight at a time.
    ///
    /// # Safety
    /// avx2 available; `s` readable for `n` u16, `d` writable for `n` f32.
    #[target_feature(enable = "avx2")]
    unsafe fn widen_contiguous(s: *const u16, d: *mut f32, n: usize) {
        // SAFETY: the caller's contract; unaligned accesses, all below `n`.
        unsafe {
            let full = n / 8 * 8;
            for t in (0..full).step_by(8) {
                _mm256_storeu_ps(d.add(t), widen8(s.add(t)));
            }
            for t in full..n {
                *d.add(t) = f32::from_bits((*s.add(t) as u32) << 16);
            }
        }
    }

    /// [`Tile::tile`] of [`Avx2`].
    ///
    /// # Safety
    /// avx2 + fma available; `a` holds 6 rows of `2·kp` f32 at stride `lda`, `b` `2·kp·16`, `c` 6
    /// rows of 16 at stride `ldc`.
    #[inline(never)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_6x16(
        kp: usize,
        (a, lda): (*const f32, usize),
        b: *const f32,
        (c, ldc): (*mut f32, usize),
    ) {
        const MR: usize = 6;
        const NR: usize = 16;
        // SAFETY: the caller's contract bounds every offset below.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            for (i, row) in acc.iter_mut().enumerate() {
                row[0] = _mm256_loadu_ps(c.add(i * ldc));
                row[1] = _mm256_loadu_ps(c.add(i * ldc + 8));
            }
            for p in 0..kp {
                for q in [2 * p + 1, 2 * p] {
                    let b0 = _mm256_loadu_ps(b.add(q * NR));
                    let b1 = _mm256_loadu_ps(b.add(q * NR + 8));
                    for (i, row) in acc.iter_mut().enumerate() {
                        let ai = _mm256_broadcast_ss(&*a.add(i * lda + q));
                        row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                        row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                _mm256_storeu_ps(c.add(i * ldc), row[0]);
                _mm256_storeu_ps(c.add(i * ldc + 8), row[1]);
            }
        }
    }

    /// [`Tile::tile`] of [`Avx512`].
    ///
    /// # Safety
    /// avx512f available; `a` holds 8 rows of `2·kp` f32 at stride `lda`, `b` `2·kp·32`, `c` 8 rows
    /// of 32 at stride `ldc`.
    #[inline(never)]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_8x32(
        kp: usize,
        (a, lda): (*const f32, usize),
        b: *const f32,
        (c, ldc): (*mut f32, usize),
    ) {
        const MR: usize = 8;
        const NR: usize = 32;
        // SAFETY: the caller's contract bounds every offset below.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            for (i, row) in acc.iter_mut().enumerate() {
                row[0] = _mm512_loadu_ps(c.add(i * ldc));
                row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
            }
            for p in 0..kp {
                for q in [2 * p + 1, 2 * p] {
                    let b0 = _mm512_loadu_ps(b.add(q * NR));
                    let b1 = _mm512_loadu_ps(b.add(q * NR + 16));
                    for (i, row) in acc.iter_mut().enumerate() {
                        let ai = _mm512_set1_ps(*a.add(i * lda + q));
                        row[0] = _mm512_fmadd_ps(ai, b0, row[0]);
                        row[1] = _mm512_fmadd_ps(ai, b1, row[1]);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                _mm512_storeu_ps(c.add(i * ldc), row[0]);
                _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;

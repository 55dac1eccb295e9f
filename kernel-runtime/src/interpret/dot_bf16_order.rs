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
//! `tests::every_path_gives_vdpbf16ps_bits` holds the three kernels (`vdpbf16ps`, the AVX2 kernel,
//! the scalar definition) equal bit for bit on random bit patterns, subnormals, infinities and
//! cancellations included.
//!
//! **The AVX2 kernel** is the f32 FMA form of the same steps: operands widened to f32 (exact) and
//! packed — `a` per 6-row block, `b` per 16-column panel, one k row per step, zeros past the edges —;
//! a 6×16 tile of 12 accumulators takes each k row in the order above. DAZ and FTZ are the CPU's own
//! (MXCSR bits 6 and 15, set for the kernel's call and restored after it, see [`DazFtz`]), so the
//! inner loop is plain FMAs.

use super::dot::View;
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
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_, bf16>,
    b: View<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::math::cpu::avx2() {
        avx2::gemm(m, n, k, a, b, c, accumulate);
        return;
    }
    gemm_scalar(m, n, k, a, b, c, accumulate);
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
mod avx2 {
    use super::super::dot::{edge_tile_load, edge_tile_store};
    use super::{widen, DazFtz, View};
    use half::bf16;
    use std::arch::x86_64::*;

    const MR: usize = 6;
    const NR: usize = 16;
    /// k rows per band (even: whole pairs); a band of a B panel is 16 KiB.
    const KC: usize = 256;

    /// See [`super::gemm`]; `crate::math::cpu::avx2()` must be true.
    pub(super) fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: View<'_, bf16>,
        b: View<'_, bf16>,
        c: &mut [f32],
        accumulate: bool,
    ) {
        let kk = 2 * k.div_ceil(2);
        // A widened whole, row-major with row stride kk, rows padded to a multiple of 6 (zeros).
        let mut pa = vec![0f32; m.div_ceil(MR) * MR * kk];
        for (i, row) in pa.chunks_mut(kk).take(m).enumerate() {
            widen_run(&mut row[..k], a, a.off + i * a.rs, a.cs);
        }
        // With no accumulator the sums start at +0: `c` zeroed, then accumulated into.
        if !accumulate {
            c.fill(0.0);
        }
        // B per 16-column panel and KC-row band: k row q of the band at `q·16`.
        let mut pb = vec![0f32; KC * NR];
        let mut col = vec![0f32; KC];
        let mut tile = [0f32; MR * NR];
        let mut band = vec![0f32; m.div_ceil(MR) * MR * KC.min(kk)];
        let _env = DazFtz::set();
        for k0 in (0..kk).step_by(KC) {
            // Rows k0..k0+kc of the padded k (kc even: whole pairs), of which k0..k0+kr are B's.
            let kc = KC.min(kk - k0);
            let kr = kc.min(k - k0);
            // The band of A per 6-row block, k row q of block g at `(g·kc + q)·6`.
            for (g, block) in band.chunks_mut(kc * MR).take(m.div_ceil(MR)).enumerate() {
                for r in 0..MR {
                    let row = &pa[(g * MR + r) * kk + k0..][..kc];
                    for (q, x) in row.iter().enumerate() {
                        block[q * MR + r] = *x;
                    }
                }
            }
            for j0 in (0..n).step_by(NR) {
                let nc = NR.min(n - j0);
                if nc < NR || kr < kc {
                    pb.fill(0.0);
                }
                if b.cs == 1 && nc == NR {
                    for q in 0..kr {
                        let at = b.off + (k0 + q) * b.rs + j0;
                        widen_run(&mut pb[q * NR..(q + 1) * NR], b, at, 1);
                    }
                } else {
                    // Columns one by one (a transposed operand reads each in order).
                    for jj in 0..nc {
                        let at = b.off + (j0 + jj) * b.cs + k0 * b.rs;
                        widen_run(&mut col[..kr], b, at, b.rs);
                        for (q, x) in col[..kr].iter().enumerate() {
                            pb[q * NR + jj] = *x;
                        }
                    }
                }
                for i0 in (0..m).step_by(MR) {
                    let mr = MR.min(m - i0);
                    let direct = mr == MR && nc == NR;
                    let (out, ldc) = if direct {
                        (c[i0 * n + j0..].as_mut_ptr(), n)
                    } else {
                        edge_tile_load(&mut tile, NR, c, n, (i0, j0), (mr, nc), true);
                        (tile.as_mut_ptr(), NR)
                    };
                    // SAFETY: `avx2()` (avx2 + fma); block i0/6 of the band holds kc·6 f32, pb
                    // kc·16; `out` is 6 rows of 16 f32 at stride ldc: the local tile, or (a whole
                    // tile) rows i0..i0+6, columns j0..j0+16 of the m×n `c`.
                    unsafe {
                        let a_at = band[i0 * kc..].as_ptr();
                        tile_6x16(kc / 2, a_at, pb.as_ptr(), out, ldc)
                    };
                    if !direct {
                        edge_tile_store(&tile, NR, c, n, (i0, j0), (mr, nc));
                    }
                }
            }
        }
    }

    /// `dst[t] = widen(v.data[at + t·stride])` for every t (16 at a time when contiguous).
    fn widen_run(dst: &mut [f32], v: View<'_, bf16>, at: usize, stride: usize) {
        let n = dst.len();
        if stride == 1 {
            let src = &v.data[at..at + n];
            let full = n / 8 * 8;
            for (d, s) in dst[..full].chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                // SAFETY: avx2 (the caller's `avx2()`); 8 u16 read from `s`, 8 f32 written to `d`.
                unsafe { widen8(s.as_ptr().cast(), d.as_mut_ptr()) };
            }
            for (d, s) in dst[full..].iter_mut().zip(&src[full..]) {
                *d = widen(*s);
            }
        } else {
            for (t, d) in dst.iter_mut().enumerate() {
                *d = widen(v.data[at + t * stride]);
            }
        }
    }

    /// Eight bf16 at `s` widened to f32 at `d`.
    ///
    /// # Safety
    /// avx2 available; `s` readable for 8 u16, `d` writable for 8 f32.
    #[target_feature(enable = "avx2")]
    unsafe fn widen8(s: *const u16, d: *mut f32) {
        // SAFETY: the caller's contract; unaligned accesses.
        unsafe {
            let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.cast()));
            _mm256_storeu_si256(d.cast(), _mm256_slli_epi32::<16>(x));
        }
    }

    /// `c (6×16 at row stride ldc) += Σ_p` the odd then the even k row of pair p; A's k row q at
    /// `a + q·6`.
    ///
    /// # Safety
    /// avx2 + fma available; `a` holds `2·kp·6` f32, `b` `2·kp·16`, `c` 6 rows of 16 at stride
    /// `ldc`.
    #[inline(never)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_6x16(kp: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize) {
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
                        let ai = _mm256_broadcast_ss(&*a.add(q * MR + i));
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
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A bf16 from random bits, biased toward the interesting: subnormals, tiny and huge exponents,
    /// zeros of both signs, infinities (no NaN: a NaN's payload is the CPU's choice).
    fn element(state: &mut u64) -> bf16 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = (*state >> 33) as u32;
        let sign = (r & 1) << 15;
        let mant = (r >> 1) & 0x7f;
        let exp = match (r >> 8) % 16 {
            0 => 0,                 // zero or subnormal
            1 => 1 + (r >> 12) % 4, // near the bottom of the normals
            // Huge, now and then infinite.
            2 => {
                if (r >> 12).is_multiple_of(64) {
                    0xff
                } else {
                    250
                }
            }
            _ => 120 + (r >> 12) % 16, // ordinary magnitudes, so sums cancel
        };
        let bits = sign | exp.min(0xff) << 7 | if exp == 0xff { 0 } else { mant };
        bf16::from_bits(bits as u16)
    }

    /// The AVX2 kernel against the definition on ordinary magnitudes (no subnormal input, sum or
    /// result), edge tiles, bands and transposed views included: what `scripts/memcheck.sh` runs,
    /// since valgrind ignores MXCSR's DAZ and FTZ (the subnormal cases are
    /// [`every_path_gives_vdpbf16ps_bits`]'s, run natively).
    #[test]
    fn avx2_kernel_on_ordinary_values() {
        let mut state = 7u64;
        let mut ordinary = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (state >> 33) as u32;
            bf16::from_bits(((r & 1) << 15 | (120 + (r >> 1) % 16) << 7 | (r >> 8) & 0x7f) as u16)
        };
        for (m, n, k, accumulate) in [(13, 33, 517, true), (6, 16, 8, false), (1, 20, 3, false)] {
            let av: Vec<bf16> = (0..m * k).map(|_| ordinary()).collect();
            let bv: Vec<bf16> = (0..k * n).map(|_| ordinary()).collect();
            let init: Vec<f32> = (0..m * n).map(|_| widen(ordinary())).collect();
            for (a, b) in [
                (view(&av, k, 1), view(&bv, n, 1)),
                (view(&av, 1, m), view(&bv, 1, k)),
            ] {
                let (mut want, mut got) = (init.clone(), init.clone());
                gemm_scalar(m, n, k, a, b, &mut want, accumulate);
                avx2::gemm(m, n, k, a, b, &mut got, accumulate);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "({m},{n},{k})");
            }
        }
    }

    /// Fuzz: random shapes (edge tiles, odd k, several k bands), operands at random offsets inside
    /// larger buffers with padded row strides, either layout, with and without an accumulator — every
    /// kernel gives the definition's bits.
    #[test]
    fn random_shapes_and_views_give_the_definitions_bits() {
        let mut state = 0xf022u64;
        let mut next = |below: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as usize) % below
        };
        for round in 0..120 {
            let (m, n, k) = (
                1 + next(30),
                1 + next(40),
                1 + next(if round % 4 == 0 { 700 } else { 70 }),
            );
            let mut bits = 0x5eedu64 + round;
            let mut operand =
                |rows: usize, cols: usize, transposed: bool, pad: usize, off: usize| {
                    // Logical rows × cols; stored row-major with `pad` extra columns, or transposed.
                    let (outer, inner) = if transposed {
                        (cols, rows)
                    } else {
                        (rows, cols)
                    };
                    let stride = inner + pad;
                    let data: Vec<bf16> = (0..off + outer * stride)
                        .map(|_| element(&mut bits))
                        .collect();
                    let (rs, cs) = if transposed { (1, stride) } else { (stride, 1) };
                    (data, off, rs, cs)
                };
            let (ta, tb) = (next(2) == 1, next(2) == 1);
            let (ad, aoff, ars, acs) = operand(m, k, ta, next(3), next(5));
            let (bd, boff, brs, bcs) = operand(k, n, tb, next(3), next(5));
            let a = View {
                data: &ad,
                off: aoff,
                rs: ars,
                cs: acs,
            };
            let b = View {
                data: &bd,
                off: boff,
                rs: brs,
                cs: bcs,
            };
            let accumulate = next(2) == 1;
            let init: Vec<f32> = (0..m * n).map(|_| widen(element(&mut bits))).collect();
            let mut want = init.clone();
            gemm_scalar(m, n, k, a, b, &mut want, accumulate);
            let mut got = init.clone();
            avx2::gemm(m, n, k, a, b, &mut got, accumulate);
            let same =
                |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same(&got, &want),
                "avx2 ({m},{n},{k}) ta {ta} tb {tb} acc {accumulate}"
            );
            if super::super::dot_bf16::available() {
                let mut hw = init.clone();
                super::super::dot_bf16::gemm(m, n, k, a, b, &mut hw, accumulate);
                assert!(
                    same(&hw, &want),
                    "vdpbf16ps ({m},{n},{k}) ta {ta} tb {tb} acc {accumulate}"
                );
            }
        }
    }

    fn view(data: &[bf16], rs: usize, cs: usize) -> View<'_, bf16> {
        View {
            data,
            off: 0,
            rs,
            cs,
        }
    }

    #[test]
    fn every_path_gives_vdpbf16ps_bits() {
        use std::arch::is_x86_feature_detected as has;
        assert!(
            has!("avx2") && has!("fma"),
            "the AVX2 kernel needs avx2 + fma"
        );
        let mut state = 0x5eed;
        for (m, n, k) in [
            (1, 1, 1),
            (7, 17, 3),
            (6, 16, 8),
            (13, 33, 130),
            (8, 32, 64),
            (3, 5, 1),
        ] {
            let av: Vec<bf16> = (0..m * k).map(|_| element(&mut state)).collect();
            let bv: Vec<bf16> = (0..k * n).map(|_| element(&mut state)).collect();
            let init: Vec<f32> = (0..m * n)
                .map(|_| {
                    let e = element(&mut state);
                    // Accumulators with a subnormal now and then (DAZ on the accumulator).
                    f32::from_bits((e.to_bits() as u32) << 16 | (e.to_bits() as u32 & 3))
                })
                .collect();
            // The same matrices stored transposed (read through column-major views, as `dot_nt`).
            let at: Vec<bf16> = (0..m * k).map(|t| av[(t % m) * k + t / m]).collect();
            let bt: Vec<bf16> = (0..k * n).map(|t| bv[(t % k) * n + t / k]).collect();
            let layouts = [
                (view(&av, k, 1), view(&bv, n, 1)),
                (view(&at, 1, m), view(&bt, 1, k)),
            ];
            for ((a, b), accumulate) in layouts.into_iter().flat_map(|l| [(l, false), (l, true)]) {
                let mut want = init.clone();
                gemm_scalar(m, n, k, a, b, &mut want, accumulate);
                let mut got = init.clone();
                avx2::gemm(m, n, k, a, b, &mut got, accumulate);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "avx2 ({m},{n},{k}) acc {accumulate}"
                );
                if super::super::dot_bf16::available() {
                    let mut hw = init.clone();
                    super::super::dot_bf16::gemm(m, n, k, a, b, &mut hw, accumulate);
                    let d = bits(&hw).iter().zip(bits(&want)).position(|(x, y)| *x != y);
                    assert!(
                        d.is_none(),
                        "vdpbf16ps ({m},{n},{k}) acc {accumulate} at {d:?}: {:?} vs {:?}",
                        d.map(|d| hw[d]),
                        d.map(|d| want[d])
                    );
                } else {
                    eprintln!("no avx512bf16 on this CPU: vdpbf16ps not compared here");
                }
            }
        }
    }
}

//! bf16 × bf16 → f32 GEMM with AVX-512 BF16 (`vdpbf16ps`), for CPUs that have it.
//!
//! The MXU multiplies bf16 pairs exactly and accumulates in f32; `vdpbf16ps` does the same per pair of
//! products (each product is exact in f32, each addition rounds to nearest even), with bf16 subnormal
//! inputs read as zero and subnormal results flushed to zero, as the TPU does. Widening to f32 and
//! running an f32 GEMM (the path on other CPUs) gives the same values up to the order of the
//! additions and those subnormals; on one machine every interpreter path calls the same kernel, so
//! fused, unfused and parallel runs stay bit-identical.
//!
//! Layout: B is packed per 32-column panel as pairs along k (`[b(2p, j), b(2p+1, j)]` for the 32 `j`s:
//! two 512-bit registers per pair index `p`); A's pairs `(a(i, 2p), a(i, 2p+1))` are one 32-bit word
//! each, read in place from a row-major A (else packed per 8-row block), broadcast to every lane. An
//! 8×32 tile keeps 16 accumulators in registers; each pair index costs 2 loads, 8 broadcasts and 16
//! `vdpbf16ps` (measured on a 128³ block: 185 GFLOP/s on one core; 12×32 tiles did 157, 14×32 160 —
//! 128-row blocks split evenly into 8-row tiles). An odd k is padded with a zero column; edge tiles
//! are computed whole and written back clipped. A block of at most 4 rows (a decode step's 4 query
//! heads per kv head) runs a 4×32 tile instead of an 8×32 one padded with zero rows; a transposed B
//! (`q kᵀ`: each column's pairs adjacent) is packed 16 columns × 16 pairs at a time through a
//! register transpose. Neither changes a sum: each lane still adds its pairs in order. (On the
//! decode batch of `cargo bench --bench interpret`, `perf record`: the dots' share of the samples
//! 11.7% → 9.0%.) The packing runs with the CPU features its register transposes and interleaves
//! need, so they inline with their rows in registers, and reads a whole panel's rows after one bounds
//! check (a decode step's 4×128 · 128×512 `q kᵀ` over a KV buffer's strided rows: 14.5 → 7.6 µs; its
//! 4×512 · 512×128 `p v`: 8.0 → 7.5 µs).

use super::dot::{edge_tile_load, edge_tile_store, KeepRows};
use half::bf16;
use std::arch::x86_64::*;

const MR: usize = 8;
const NR: usize = 32;

/// Whether this CPU runs the kernel (checked once; `TPU_KERNEL_CPU=avx2` turns it off).
pub(crate) fn available() -> bool {
    crate::math::cpu::avx512_bf16()
}

/// A bf16 operand (see [`super::dot::View`]).
pub(crate) type View<'a> = super::dot::View<'a, bf16>;

impl View<'_> {
    #[inline]
    fn bits(&self, r: usize, c: usize) -> u16 {
        self.data[self.off + r * self.rs + c * self.cs].to_bits()
    }
}

/// `c = a·b + (accumulate ? c : 0)` for `a: m×k`, `b: k×n` and a row-major `m×n` f32 `c`. The
/// views must lie inside their buffers (the caller checks); `available()` must be true.
///
/// Rows of `b` that `keep` drops after its last kept one are not multiplied when `a`'s columns there
/// are finite (see [`Tail`]): a masked `p v` over a KV block the sequence fills only in part.
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    (b, keep): (View<'_>, Option<KeepRows<'_>>),
    c: &mut [f32],
    accumulate: bool,
) {
    debug_assert!(available() && c.len() == m * n);
    match keep.and_then(|keep| Tail::of(m, k, a, keep)) {
        Some(tail) => {
            gemm_rows(m, n, tail.run, a, (b, keep), c, accumulate);
            tail.finish(n, c);
        }
        None => gemm_rows(m, n, k, a, (b, keep), c, accumulate),
    }
}

/// A tail of `b`'s rows that `keep` drops, left out of a product: rows `run..k`, after the last
/// kept row (`run` rounded up to a whole pair, at least one pair, so every output still takes the
/// steps that flush a subnormal accumulator). Each left-out step would add `a(i, r)·(+0)` — a zero
/// when `a(i, r)` is finite, which leaves every sum as it is except a −0, which a +0 product (an
/// `a(i, r)` with its sign clear) turns into +0 (round to nearest even: −0 + +0 = +0; a NaN or
/// infinite sum stays as it is). So the tail is left out only where `a`'s columns there are all
/// finite, and `plus` says which rows' −0 sums become +0: the bits of the whole product.
struct Tail {
    run: usize,
    plus: Vec<bool>,
}

impl Tail {
    fn of(m: usize, k: usize, a: View<'_>, keep: KeepRows<'_>) -> Option<Tail> {
        let end = (0..k).rev().find(|&r| keep.keeps(r)).map_or(0, |r| r + 1);
        let run = end.max(1).next_multiple_of(2).min(k);
        if run == k {
            return None;
        }
        let mut plus = vec![false; m];
        for (i, plus) in plus.iter_mut().enumerate() {
            // (Folded without an early exit, so the loop over a contiguous row vectorizes.)
            let (mut special, mut clear) = (0u16, 0u16);
            let mut see = |x: bf16| {
                let bits = x.to_bits();
                special |= u16::from(bits & 0x7f80 == 0x7f80);
                clear |= u16::from(bits & 0x8000 == 0);
            };
            if a.cs == 1 {
                a.data[a.off + i * a.rs..][run..k]
                    .iter()
                    .for_each(|&x| see(x));
            } else {
                (run..k).for_each(|r| see(a.data[a.off + i * a.rs + r * a.cs]));
            }
            if special != 0 {
                return None;
            }
            *plus = clear != 0;
        }
        Some(Tail { run, plus })
    }

    /// The left-out steps' effect on the row-major `m × n` product `c`.
    fn finish(&self, n: usize, c: &mut [f32]) {
        for (row, _) in c.chunks_mut(n.max(1)).zip(&self.plus).filter(|(_, p)| **p) {
            for x in row.iter_mut().filter(|x| x.to_bits() == 0x8000_0000) {
                *x = 0.0;
            }
        }
    }
}

/// [`gemm`] through all `k` rows.
fn gemm_rows(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    (b, keep): (View<'_>, Option<KeepRows<'_>>),
    c: &mut [f32],
    accumulate: bool,
) {
    let kp = k.div_ceil(2);
    // A row-major with whole pairs (even k, offset and row stride) is read in place: each
    // `(a(i, 2p), a(i, 2p+1))` is one u32 of row i. Otherwise (transposed views, odd k) it is packed.
    let direct =
        a.cs == 1 && k.is_multiple_of(2) && a.off.is_multiple_of(2) && a.rs.is_multiple_of(2);
    // Packed A: all of it, or — when it is read in place — only a trailing block of fewer than 8
    // rows (a tile reads 8 rows; past m, the packed copy supplies zeros).
    let packed_from = if direct { m / MR * MR } else { 0 };
    let pa = pack_a(
        m - packed_from,
        k,
        kp,
        View {
            off: a.off + packed_from * a.rs,
            ..a
        },
    );
    let mut pb = vec![0u32; kp * NR];
    let mut tile = [0f32; MR * NR];
    for j0 in (0..n).step_by(NR) {
        let nc = NR.min(n - j0);
        // SAFETY: `available()` (the caller's contract) includes avx512f and avx512bw.
        unsafe { pack_b_panel(k, kp, j0, nc, (b, keep), &mut pb) };
        for i0 in (0..m).step_by(MR) {
            let mr = MR.min(m - i0);
            let a_at = if i0 < packed_from {
                ARef {
                    // SAFETY: rows i0..i0+8 and pairs 0..kp of A lie in `a.data` (the caller
                    // checked the view; even offset and stride make each pair one u32, read
                    // unaligned).
                    ptr: unsafe { a.data.as_ptr().add(a.off + i0 * a.rs) as *const u32 },
                    row_stride: a.rs / 2,
                    pair_stride: 1,
                }
            } else {
                ARef {
                    ptr: pa[(i0 - packed_from) / MR * kp * MR..].as_ptr(),
                    row_stride: 1,
                    pair_stride: MR,
                }
            };
            // A block of at most 4 rows (a decode step's query heads) runs the 4-row tile: the
            // same sums, half the work of an 8-row tile padded with zero rows.
            let (rows, tile_fn) = if mr <= MR / 2 {
                (MR / 2, tile_rows::<{ MR / 2 }> as TileFn)
            } else {
                (MR, tile_rows::<MR> as TileFn)
            };
            if mr == rows && nc == NR {
                // SAFETY: the CPU has avx512f + avx512bf16 (`available`); `a_at` reaches `rows`
                // rows × kp pairs and the packed panel kp pairs; rows i0..i0+rows, columns
                // j0..j0+32 of `c` are in bounds (full tile), with row stride n.
                unsafe {
                    tile_fn(
                        kp,
                        a_at,
                        pb.as_ptr().cast(),
                        c.as_mut_ptr().add(i0 * n + j0),
                        n,
                        accumulate,
                    )
                };
            } else {
                edge_tile_load(&mut tile, NR, c, n, (i0, j0), (mr, nc), accumulate);
                // SAFETY: as above, into the local 8×32 tile (row stride 32).
                unsafe { tile_fn(kp, a_at, pb.as_ptr().cast(), tile.as_mut_ptr(), NR, true) };
                edge_tile_store(&tile, NR, c, n, (i0, j0), (mr, nc));
            }
        }
    }
}

/// [`tile_rows`] at one row count.
type TileFn = unsafe fn(usize, ARef, *const u16, *mut f32, usize, bool);

/// Where an 8-row block of A's pairs is: u32 `(row i, pair p)` at `ptr + i·row_stride + p·pair_stride`.
#[derive(Clone, Copy)]
struct ARef {
    ptr: *const u32,
    row_stride: usize,
    pair_stride: usize,
}

/// A in 8-row blocks: per block, per pair index, 8 × `(a(i, 2p), a(i, 2p+1))` as u32 (low half
/// first); rows past m and the pad column past an odd k are zero.
fn pack_a(m: usize, k: usize, kp: usize, a: View<'_>) -> Vec<u32> {
    let groups = m.div_ceil(MR);
    let mut out = vec![0u32; groups * kp * MR];
    for g in 0..groups {
        for r in 0..MR.min(m - g * MR) {
            let i = g * MR + r;
            for p in 0..kp {
                let lo = a.bits(i, 2 * p) as u32;
                let hi = if 2 * p + 1 < k {
                    a.bits(i, 2 * p + 1) as u32
                } else {
                    0
                };
                out[(g * kp + p) * MR + r] = lo | (hi << 16);
            }
        }
    }
    out
}

/// A dropped row's panel slice (see [`KeepRows`]).
static ZERO_ROW: [bf16; NR] = [bf16::ZERO; NR];

/// `b(2p, j) | b(2p+1, j) << 16`: one pair of B as the u32 the tile broadcasts against (low half first).
#[inline(always)]
fn pair(lo: bf16, hi: bf16) -> u32 {
    lo.to_bits() as u32 | (hi.to_bits() as u32) << 16
}

/// Columns j0..j0+nc of B: per pair index, 32 × `[b(2p, j), b(2p+1, j)]` (one u32 each, low half
/// first); columns past nc, the pad row past an odd k and the rows `keep` drops are zero.
///
/// # Safety
/// avx512f + avx512bw available (its register transposes and interleaves inline here).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_b_panel(
    k: usize,
    kp: usize,
    j0: usize,
    nc: usize,
    (b, keep): (View<'_>, Option<KeepRows<'_>>),
    out: &mut [u32],
) {
    let kept = |r: usize| keep.is_none_or(|keep| keep.keeps(r));
    if b.rs == 1 {
        // Column-major (a transposed row-major operand, as in `q kᵀ`): each column's pairs are
        // adjacent, one u32 each. Whole panels move 16 columns × 16 pairs at a time through a
        // register transpose; the rest (a partial panel, the pairs past the last 16, an odd k's
        // last element) one pair per u32 written.
        let simd_pairs = if nc == NR && keep.is_none() {
            k / 2 / 16 * 16
        } else {
            0
        };
        // (Only whole panels: a partial one's missing columns have no slices.)
        if simd_pairs > 0 {
            // The panel's 32 columns' first k elements, checked once (the last column's end).
            let panel = &b.data[b.off + j0 * b.cs..][..(NR - 1) * b.cs + k];
            for half in 0..NR / 16 {
                for p0 in (0..simd_pairs).step_by(16) {
                    let to = &mut out[p0 * NR + half * 16..(p0 + 15) * NR + half * 16 + 16];
                    // SAFETY: `available()` (avx512f); column `half·16 + r` of the panel, from
                    // element 2·p0, reaches 32 bf16 (2·p0 + 32 ≤ k, inside `panel`); `to` holds 16
                    // rows of 16 u32 at stride NR (checked by the slice).
                    unsafe {
                        let from = panel.as_ptr().add(half * 16 * b.cs + 2 * p0);
                        transpose_16x16(from, b.cs, to.as_mut_ptr(), NR)
                    };
                }
            }
        }
        for jj in 0..NR {
            if jj >= nc {
                for p in 0..kp {
                    out[p * NR + jj] = 0;
                }
                continue;
            }
            let col = &b.data[b.off + (j0 + jj) * b.cs..][..k];
            let pairs = col.chunks_exact(2);
            let last = pairs
                .remainder()
                .first()
                .map_or(0, |&lo| pair(lo, bf16::ZERO));
            let last = if kept(k - 1) { last } else { 0 };
            let or_zero = |r: usize, x: bf16| if kept(r) { x } else { bf16::ZERO };
            for (p, two) in pairs.enumerate().skip(simd_pairs) {
                out[p * NR + jj] = pair(or_zero(2 * p, two[0]), or_zero(2 * p + 1, two[1]));
            }
            if k % 2 == 1 {
                out[(kp - 1) * NR + jj] = last;
            }
        }
        return;
    }
    // Row-major: row r's `len` elements of the panel (a dropped row: zeros).
    let b_row = |r: usize, len: usize| match kept(r) {
        true => &b.data[b.off + r * b.rs + j0..][..len],
        false => &ZERO_ROW[..len],
    };
    let mut first = 0;
    if b.cs == 1 && nc == NR && keep.is_none() && k >= 2 {
        // Row-major, whole panel, every row kept: each pair of rows interleaved in registers, the
        // panel's rows checked once (the last whole pair's second row).
        let pairs = k / 2;
        let last = b.off + (2 * pairs - 1) * b.rs + j0 + NR;
        assert!(last <= b.data.len() && out.len() >= pairs * NR);
        let (src, dst) = (b.data.as_ptr(), out.as_mut_ptr().cast::<u16>());
        for p in 0..pairs {
            // SAFETY: `available()` (avx512bw); rows 2p and 2p + 1 from column j0 hold 32 bf16
            // each (up to `last`, checked), and pair row p of `out` 64 u16 (checked).
            unsafe {
                let r0 = src.add(b.off + 2 * p * b.rs + j0);
                interleave_32(r0.cast(), r0.add(b.rs).cast(), dst.add(p * 2 * NR));
            }
        }
        first = pairs;
    }
    for p in first..kp {
        let row32 = &mut out[p * NR..(p + 1) * NR];
        // SAFETY: a u32 slice seen as twice as many u16 (same memory, stricter alignment kept).
        let row: &mut [u16] =
            unsafe { std::slice::from_raw_parts_mut(row32.as_mut_ptr().cast::<u16>(), 2 * NR) };
        if b.cs == 1 && nc == NR && 2 * p + 1 < k {
            // Row-major, a whole panel: interleave the two 32-element row slices in registers.
            let (r0, r1) = (b_row(2 * p, NR), b_row(2 * p + 1, NR));
            // SAFETY: `available()` (avx512bw); r0, r1 hold 32 bf16 each, `row` 64 u16.
            unsafe { interleave_32(r0.as_ptr().cast(), r1.as_ptr().cast(), row.as_mut_ptr()) };
            continue;
        }
        if b.cs == 1 {
            // Row-major, a partial panel or the odd last row: interleave two row slices.
            let r0 = b_row(2 * p, nc);
            let r1 = (2 * p + 1 < k).then(|| b_row(2 * p + 1, nc));
            for jj in 0..NR {
                row[2 * jj] = if jj < nc { r0[jj].to_bits() } else { 0 };
                row[2 * jj + 1] = match r1 {
                    Some(r1) if jj < nc => r1[jj].to_bits(),
                    _ => 0,
                };
            }
            continue;
        }
        for jj in 0..NR {
            let (lo, hi) = if jj < nc {
                let j = j0 + jj;
                let bits = |r: usize| if r < k && kept(r) { b.bits(r, j) } else { 0 };
                (bits(2 * p), bits(2 * p + 1))
            } else {
                (0, 0)
            };
            row[2 * jj] = lo;
            row[2 * jj + 1] = hi;
        }
    }
}

/// The lane indices of one butterfly step of [`transpose_16x16`] at distance `d`: for the pair of rows
/// `(i, i + d)`, the first row's result (`hi` false) keeps its lanes `j` with `j & d == 0` and takes
/// the second row's lanes `j - d` for the others; the second's (`hi` true) takes the first's lanes
/// `j + d` where `j & d == 0` and keeps the rest (indices 16.. name the second operand's lanes).
const fn butterfly(d: usize, hi: bool) -> [i32; 16] {
    let mut t = [0i32; 16];
    let mut j = 0;
    while j < 16 {
        t[j] = match (j & d == 0, hi) {
            (true, false) => j as i32,
            (false, false) => (16 + j - d) as i32,
            (true, true) => (j + d) as i32,
            (false, true) => (16 + j) as i32,
        };
        j += 1;
    }
    t
}

/// `out[i · stride + r] = row r[i]` for a 16 × 16 block of u32, row r the 32 bf16 (16 pairs) at
/// `rows + r · row_stride`: the off-diagonal blocks swapped at distances 8, 4, 2 and 1 (one
/// `vpermt2d` per row and step).
///
/// # Safety
/// avx512f available; every row readable for 32 bf16, `out` writable for 16 rows of 16 u32 at
/// row stride `stride`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose_16x16(rows: *const bf16, row_stride: usize, out: *mut u32, stride: usize) {
    // SAFETY: the caller's contract; unaligned loads and stores.
    unsafe {
        let mut r = [_mm512_setzero_si512(); 16];
        for (i, v) in r.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(rows.add(i * row_stride).cast());
        }
        butterfly_step::<8>(&mut r);
        butterfly_step::<4>(&mut r);
        butterfly_step::<2>(&mut r);
        butterfly_step::<1>(&mut r);
        for (i, v) in r.iter().enumerate() {
            _mm512_storeu_si512(out.add(i * stride).cast(), *v);
        }
    }
}

/// The step of [`transpose_16x16`] at distance `D`: a constant, so that the loop unrolls and the 16
/// rows stay in registers (with the distance a loop variable they were kept on the stack, each
/// `vpermt2d` reading and writing memory: 40% of a decode step's `q kᵀ` in `perf`).
///
/// # Safety
/// avx512f available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn butterfly_step<const D: usize>(r: &mut [__m512i; 16]) {
    let (lo, hi) = (const { butterfly(D, false) }, const { butterfly(D, true) });
    // SAFETY: 16 i32 each, unaligned loads.
    let (lo, hi) = unsafe {
        (
            _mm512_loadu_si512(lo.as_ptr().cast()),
            _mm512_loadu_si512(hi.as_ptr().cast()),
        )
    };
    for i in 0..16 {
        if i & D == 0 {
            let (a, b) = (r[i], r[i + D]);
            r[i] = _mm512_permutex2var_epi32(a, lo, b);
            r[i + D] = _mm512_permutex2var_epi32(a, hi, b);
        }
    }
}

/// `out[2j] = r0[j]`, `out[2j + 1] = r1[j]` for 32 j.
///
/// # Safety
/// avx512f + avx512bw available; `r0`, `r1` readable for 32 u16, `out` writable for 64.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn interleave_32(r0: *const u16, r1: *const u16, out: *mut u16) {
    // Indices into the concatenation r0 ++ r1 (0..32 from r0, 32..64 from r1).
    const LO: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut i = 0;
        while i < 16 {
            t[2 * i] = i as u16;
            t[2 * i + 1] = 32 + i as u16;
            i += 1;
        }
        t
    };
    const HI: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut i = 0;
        while i < 16 {
            t[2 * i] = 16 + i as u16;
            t[2 * i + 1] = 48 + i as u16;
            i += 1;
        }
        t
    };
    // SAFETY: the caller's contract; unaligned loads and stores.
    unsafe {
        let a = _mm512_loadu_si512(r0.cast());
        let b = _mm512_loadu_si512(r1.cast());
        let lo = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(LO.as_ptr().cast()), b);
        let hi = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(HI.as_ptr().cast()), b);
        _mm512_storeu_si512(out.cast(), lo);
        _mm512_storeu_si512(out.add(32).cast(), hi);
    }
}

/// One `R`×32 tile (`R` = 8, or 4 for a block of at most 4 rows): `c[i][j] (+)= Σ_p dot(a pair, b
/// pair)`, the pairs in order.
///
/// # Safety
/// avx512f + avx512bf16 available; `a` reaches `R` rows × `kp` pairs, `b` holds `kp·64` u16, `c` is
/// writable for `R` rows of 32 f32 at row stride `ldc`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_rows<const R: usize>(
    kp: usize,
    a: ARef,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: row i of the tile, 32 f32 (the caller's contract).
            unsafe {
                row[0] = _mm512_loadu_ps(c.add(i * ldc));
                row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
            }
        }
    }
    for p in 0..kp {
        // SAFETY: pair index p < kp of the packed panels.
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_si512(b.add(p * 64) as *const _),
                _mm512_loadu_si512(b.add(p * 64 + 32) as *const _),
            )
        };
        // SAFETY: 512-bit integer vectors reinterpreted as 32 bf16 lanes (same size, any bits valid).
        let (b0, b1): (__m512bh, __m512bh) = unsafe {
            (
                std::mem::transmute::<__m512i, __m512bh>(b0),
                std::mem::transmute::<__m512i, __m512bh>(b1),
            )
        };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: pair index p, row i of the packed block; the broadcast reinterpreted as above.
            let ai: __m512bh = unsafe {
                let pair = a
                    .ptr
                    .add(i * a.row_stride + p * a.pair_stride)
                    .read_unaligned();
                std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair as i32))
            };
            row[0] = _mm512_dpbf16_ps(row[0], ai, b0);
            row[1] = _mm512_dpbf16_ps(row[1], ai, b1);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i of the tile (the caller's contract).
        unsafe {
            _mm512_storeu_ps(c.add(i * ldc), row[0]);
            _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
        }
    }
}

#[cfg(test)]
mod tests;

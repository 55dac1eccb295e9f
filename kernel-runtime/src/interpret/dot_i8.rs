//! i8 × i8 → i32 GEMM with AVX-512 VNNI (`vpdpbusd`), for CPUs that have it (elsewhere `dot` runs i8
//! through the f32 GEMM, exactly: see `dot::gemm_i8`). Every product is exact in i32 and the sums wrap
//! (two's complement), so any order of the additions gives the same bits: on every CPU, every path
//! equals the plain triple loop that defines `dot` on integers bit for bit.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, four products per i32 lane (at most 4 · 255 · 128 in
//! magnitude, added to the lane wrapping). A is offset into u8 (`a + 128`, a flipped sign bit), which
//! adds `128 · Σₚ b(p, j)` to column j; each tile starts its accumulators at minus that, so the sums
//! are those of the signed products, modulo 2³².
//!
//! Layout: B is packed per 32-column panel as quads along k, `[b(4q..4q+4, j)]` for the 32 `j`s (two
//! 512-bit registers per quad index `q`); A row-major as one u32 per (row, quad index) holding the four
//! offset bytes `a(i, 4q..4q+4) + 128`, rows padded to a multiple of 8. An 8×32 tile keeps 16
//! accumulators in registers; each quad index costs 2 loads, 8 broadcasts and 16 `vpdpbusd` (64
//! multiply-adds each). k is padded to a multiple of 4 with zeros in B; edge tiles are computed whole
//! and written back clipped.

use super::dot::{edge_tile_load, edge_tile_store};
use super::simd::multiversion;

const MR: usize = 8;
const NR: usize = 32;
/// Bytes of a packed B panel per quad index.
const QUAD: usize = 4 * NR;

/// An i8 operand (see [`super::dot::View`]).
pub(crate) type View<'a> = super::dot::View<'a, i8>;

impl View<'_> {
    #[inline]
    fn at(&self, r: usize, c: usize) -> i8 {
        self.data[self.off + r * self.rs + c * self.cs]
    }
}

/// Whether this CPU runs the kernel (checked once; `TPU_KERNEL_CPU=avx2` turns it off).
pub(crate) fn available() -> bool {
    crate::math::cpu::avx512_vnni()
}

/// `c = a·b + (accumulate ? c : 0)` (wrapping) for `a: m×k`, `b: k×n` and a row-major `m×n` i32 `c`.
/// The views must lie inside their buffers (the caller checks); `available()` must be true.
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [i32],
    accumulate: bool,
) {
    assert!(available() && c.len() == m * n);
    if !accumulate {
        c.fill(0);
    }
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let kq = k.div_ceil(4);
    let pa = pack_a(m, k, kq, a);
    let mut pb = vec![0i8; kq * QUAD];
    let mut tile = [0i32; MR * NR];
    for j0 in (0..n).step_by(NR) {
        let nc = NR.min(n - j0);
        pack_b_panel(k, j0, nc, b, &mut pb);
        // SAFETY: the CPU has avx512f + avx512vnni (asserted above); `pb` holds kq quad rows.
        let bias = unsafe { panel_bias(kq, pb.as_ptr()) };
        for i0 in (0..m).step_by(MR) {
            let mr = MR.min(m - i0);
            let pa = &pa[i0 * kq..(i0 + MR) * kq];
            if mr == MR && nc == NR {
                let dst = &mut c[i0 * n + j0..(i0 + MR - 1) * n + j0 + NR];
                // SAFETY: the CPU has avx512f + avx512vnni (asserted above); `pa` holds 8 rows of
                // kq quads, `pb` kq quad rows of 128 bytes, `bias` 32 i32, and `dst` 8 rows of 32
                // i32 at row stride n (the slices are exactly that long).
                unsafe { tile_8x32(kq, pa.as_ptr(), pb.as_ptr(), &bias, dst.as_mut_ptr(), n) };
                continue;
            }
            edge_tile_load(&mut tile, NR, c, n, (i0, j0), (mr, nc), true);
            // SAFETY: as above, into the local 8×32 tile (row stride 32).
            unsafe { tile_8x32(kq, pa.as_ptr(), pb.as_ptr(), &bias, tile.as_mut_ptr(), NR) };
            edge_tile_store(&tile, NR, c, n, (i0, j0), (mr, nc));
        }
    }
}

/// A offset into u8 as `m` (padded to a multiple of 8) rows of `kq` quads (little-endian u32s);
/// padding reads as `a = 0` (B is zero there anyway).
fn pack_a(m: usize, k: usize, kq: usize, a: View<'_>) -> Vec<u32> {
    let mut out = vec![0x8080_8080u32; m.div_ceil(MR) * MR * kq];
    for (i, row) in out.chunks_exact_mut(kq).take(m).enumerate() {
        if a.cs == 1 {
            offset_row(&a.data[a.off + i * a.rs..][..k], row);
        } else {
            for (q, x) in row.iter_mut().enumerate() {
                let byte = |p: usize| if p < k { a.at(i, p) } else { 0 };
                *x = quad([
                    byte(4 * q),
                    byte(4 * q + 1),
                    byte(4 * q + 2),
                    byte(4 * q + 3),
                ]);
            }
        }
    }
    out
}

/// Four signed bytes offset by 128 (the sign bit flipped), as one little-endian u32.
#[inline(always)]
fn quad(x: [i8; 4]) -> u32 {
    u32::from_le_bytes(x.map(|v| v as u8 ^ 0x80))
}

multiversion! {
    /// A contiguous row as offset quads (`out[q]` = bytes `4q..4q+4`; past the end, `a = 0`).
    fn offset_row[](row: &[i8], out: &mut [u32]) -> () {
        let quads = row.chunks_exact(4);
        let rest = quads.remainder();
        for (o, x) in out.iter_mut().zip(quads) {
            *o = quad([x[0], x[1], x[2], x[3]]);
        }
        if !rest.is_empty() {
            let mut x = [0i8; 4];
            x[..rest.len()].copy_from_slice(rest);
            out[row.len() / 4] = quad(x);
        }
    }
}

/// Columns j0..j0+nc of B: per quad index, 32 × `[b(4q..4q+4, j)]` (rows past k and columns past nc
/// zero).
fn pack_b_panel(k: usize, j0: usize, nc: usize, b: View<'_>, out: &mut [i8]) {
    for (q, quad) in out.chunks_exact_mut(QUAD).enumerate() {
        let rows = 4.min(k - 4 * q);
        if b.cs == 1 {
            let row = |r: usize| {
                let p = 4 * q + r.min(rows - 1);
                &b.data[b.off + p * b.rs + j0..][..nc]
            };
            interleave4([row(0), row(1), row(2), row(3)], rows, quad);
            continue;
        }
        for (jj, x) in quad.chunks_exact_mut(4).enumerate() {
            for (r, x) in x.iter_mut().enumerate() {
                *x = if jj < nc && r < rows {
                    b.at(4 * q + r, j0 + jj)
                } else {
                    0
                };
            }
        }
    }
}

multiversion! {
    /// `out[4j + r] = rows[r][j]` for the first `used` rows (the others zero) and the rows' length in
    /// columns (zero past it).
    fn interleave4[](rows: [&[i8]; 4], used: usize, out: &mut [i8]) -> () {
        if let (4, [Ok(r0), Ok(r1), Ok(r2), Ok(r3)], Ok(out)) =
            (used, rows.map(<&[i8; NR]>::try_from), <&mut [i8; QUAD]>::try_from(&mut *out))
        {
            // A whole quad of whole rows: fixed sizes, so the loop vectorizes.
            for j in 0..NR {
                out[4 * j..4 * j + 4].copy_from_slice(&[r0[j], r1[j], r2[j], r3[j]]);
            }
            return;
        }
        for (j, o) in out.chunks_exact_mut(4).enumerate() {
            for (r, (o, row)) in o.iter_mut().zip(rows).enumerate() {
                *o = if j < row.len() && r < used { row[j] } else { 0 };
            }
        }
    }
}

/// What the offset of A adds to each column of a packed panel, taken back: `-128 · Σₚ b(p, j)`
/// (wrapping), the column sums by `vpdpbusd` against ones.
///
/// # Safety
/// avx512f + avx512vnni available; `b` holds `kq·128` bytes.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn panel_bias(kq: usize, b: *const i8) -> [i32; NR] {
    use std::arch::x86_64::*;
    let ones = _mm512_set1_epi8(1);
    let mut sums = [_mm512_setzero_si512(); 2];
    for q in 0..kq {
        for (h, s) in sums.iter_mut().enumerate() {
            // SAFETY: quad index q < kq of the packed panel, half h.
            let x = unsafe { _mm512_loadu_si512(b.add(q * QUAD + 64 * h).cast()) };
            *s = _mm512_dpbusd_epi32(*s, ones, x);
        }
    }
    let mut out = [0i32; NR];
    for (h, s) in sums.iter().enumerate() {
        let bias = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(*s));
        // SAFETY: 16 i32 of `out` per half.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(16 * h).cast(), bias) };
    }
    out
}

/// One 8×32 tile: `c[i][j] += bias[j] + Σ_q dot(a quad, b quad)` (wrapping), with `vpdpbusd`.
///
/// # Safety
/// avx512f + avx512vnni available; `a` reaches 8 rows × `kq` quads (row stride kq), `b` holds
/// `kq·128` bytes, `c` is writable for 8 rows of 32 i32 at row stride `ldc`.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn tile_8x32(
    kq: usize,
    a: *const u32,
    b: *const i8,
    bias: &[i32; NR],
    c: *mut i32,
    ldc: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: `bias` holds 32 i32; unaligned loads.
    let bias = unsafe {
        [
            _mm512_loadu_si512(bias.as_ptr().cast()),
            _mm512_loadu_si512(bias.as_ptr().add(16).cast()),
        ]
    };
    let mut acc = [[_mm512_setzero_si512(); 2]; MR];
    for (i, row) in acc.iter_mut().enumerate() {
        // SAFETY: row i of the tile, 32 i32 (the caller's contract); unaligned loads.
        unsafe {
            row[0] = _mm512_add_epi32(_mm512_loadu_si512(c.add(i * ldc).cast()), bias[0]);
            row[1] = _mm512_add_epi32(_mm512_loadu_si512(c.add(i * ldc + 16).cast()), bias[1]);
        }
    }
    for q in 0..kq {
        // SAFETY: quad index q < kq of the packed panel.
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_si512(b.add(q * QUAD).cast()),
                _mm512_loadu_si512(b.add(q * QUAD + 64).cast()),
            )
        };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: row i, quad q of the packed A block.
            let ai = _mm512_set1_epi32(unsafe { a.add(i * kq + q).read() } as i32);
            row[0] = _mm512_dpbusd_epi32(row[0], ai, b0);
            row[1] = _mm512_dpbusd_epi32(row[1], ai, b1);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i of the tile (the caller's contract).
        unsafe {
            _mm512_storeu_si512(c.add(i * ldc).cast(), row[0]);
            _mm512_storeu_si512(c.add(i * ldc + 16).cast(), row[1]);
        }
    }
}

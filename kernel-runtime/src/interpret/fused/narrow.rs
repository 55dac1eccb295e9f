//! A fused softmax pass over rows narrower than a reduction group (rows a few lanes wide, e.g. `[256,
//! 8]` blocks): `e = exp(x - m)` with `m` one value per row, and optionally the rows' sums — computed
//! for many rows at once instead of row by row, whose fixed cost per call dominated such rows.
//!
//! Same bits as the row loop (`chain_impl`): `x - m` is one f32 subtraction and `exp` is elementwise
//! (`exp_run` gives `exp_f32`'s bits wherever a row starts), so computing a band of rows in one
//! `exp_run` changes nothing; a row shorter than [`LANES`] puts every element in its accumulator's
//! `rest`, in order, and leaves the lanes at zero, so its sum is `0 + rest` with `rest` the sequential
//! sum from zero, joined to the output's accumulator as the row loop joins it.

use super::super::row_order::LANES;
use super::rows::RowsN;
use super::FData;
use crate::math;

/// The narrow pass of a chain `exp(x - m)` (with the rows' sums when `red` is given), when its
/// operands allow it: f32 `x` and `m`, one outer axis, contiguous rows of fewer than [`LANES`]
/// elements in `x` and in the destination (`ptr` at `out_at`, f32, when `store`; else a scratch
/// buffer), `m` one value per row. Then every row is done, `rows` is left exhausted and the result is
/// true; else nothing is done.
///
/// # Safety
/// The CPU has AVX2 and FMA; when `store`, `ptr` is the chain's f32 destination, valid and exclusively
/// ours for every offset the rows reach (as the row loop uses it).
pub(super) unsafe fn try_pass(
    rows: &mut RowsN,
    offsets: &[usize],
    (x, m): (&FData<'_>, &FData<'_>),
    (ptr, store): (*mut u8, bool),
    red: Option<&mut [f32]>,
) -> bool {
    let (FData::F32(x), FData::F32(m)) = (x, m) else {
        return false;
    };
    let Some((count, outer)) = rows.single_outer() else {
        return false;
    };
    let (len, inner) = (rows.inner, &rows.inner_strides);
    // Operands: x, m, the destination, then the reduction's accumulators.
    let contiguous = |i: usize| inner[i] == 1 && outer[i] == len;
    let red_ok = red.is_none() || (inner.len() == 4 && inner[3] == 0);
    if len >= LANES
        || inner.len() < 3
        || !contiguous(0)
        || inner[1] != 0
        || !contiguous(2)
        || !red_ok
    {
        return false;
    }
    let op = Narrow {
        rows: count,
        len,
        x,
        x_at: offsets[0],
        m,
        m_at: offsets[1],
        m_stride: outer[1],
    };
    let red = red.map(|r| (r, offsets[3], outer[3]));
    let done = if store {
        // SAFETY: the caller's contract (the destination's rows are the ones the row loop writes).
        unsafe { run(&op, ptr as *mut f32, offsets[2], red) }
    } else {
        let mut scratch = vec![0f32; count * len];
        // SAFETY: a buffer of exactly the rows, ours.
        unsafe { run(&op, scratch.as_mut_ptr(), 0, red) }
    };
    if done {
        rows.skip_all();
    }
    done
}

/// The operands of one narrow pass, as element offsets into the buffers (see [`run`]).
pub(super) struct Narrow<'a> {
    /// The rows' count and length (`len < LANES`).
    pub rows: usize,
    pub len: usize,
    /// `x`: row `r` at `x_at + r·len`, contiguous.
    pub x: &'a [f32],
    pub x_at: usize,
    /// `m`: row `r`'s value at `m_at + r·m_stride`.
    pub m: &'a [f32],
    pub m_at: usize,
    pub m_stride: usize,
}

/// Rows per band: a band's `exp` is one `exp_run` over `BAND · len` elements.
const BAND: usize = 128;

/// `out(r) = exp(x(r) - m(r))` for every row, into `out` at `out_at + r·len` (contiguous rows), and,
/// with `red`, `red[red_at + r·red_stride] += 0 + Σ` of the row in order (see the module docs).
///
/// # Safety
/// The CPU has AVX2 and FMA; `out` is valid for writes of `rows · len` f32 from `out_at` and no
/// other reference reaches them; the operand views lie inside their slices (checked, else `false` and
/// nothing written).
pub(super) unsafe fn run(
    op: &Narrow<'_>,
    out: *mut f32,
    out_at: usize,
    mut red: Option<(&mut [f32], usize, usize)>,
) -> bool {
    let Narrow {
        rows,
        len,
        x,
        x_at,
        m,
        m_at,
        m_stride,
    } = *op;
    let n = rows * len;
    let inside = len < LANES
        && x_at + n <= x.len()
        && (rows == 0 || m_at + (rows - 1) * m_stride < m.len())
        && red
            .as_ref()
            .is_none_or(|(r, at, s)| rows == 0 || at + (rows - 1) * s < r.len());
    if !inside {
        return false;
    }
    for r0 in (0..rows).step_by(BAND) {
        let band = BAND.min(rows - r0);
        // SAFETY: rows r0..r0+band of the destination (the caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(out.add(out_at + r0 * len), band * len) };
        for (r, d) in dst.chunks_exact_mut(len).enumerate() {
            let mr = m[m_at + (r0 + r) * m_stride];
            let xs = &x[x_at + (r0 + r) * len..][..len];
            for (o, &v) in d.iter_mut().zip(xs) {
                *o = v - mr;
            }
        }
        // SAFETY: the CPU has AVX2 and FMA (the caller's contract).
        unsafe { math::exp_run(dst, math::ExpIn::InPlace, None) };
        if let Some((red, at, s)) = red.as_mut() {
            for (r, row) in dst.chunks_exact(len).enumerate() {
                let mut rest = 0.0f32;
                for &e in row {
                    rest += e;
                }
                let o = *at + (r0 + r) * *s;
                red[o] += 0.0 + rest;
            }
        }
    }
    true
}

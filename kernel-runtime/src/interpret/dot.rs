//! `dot` on the MXU's terms: bf16/f32 operands multiplied exactly and accumulated in f32 (a bf16 product
//! is exact in f32), i8 (and int4, widened to i8) operands accumulated in wrapping i32; an optional
//! accumulator operand is added in.
//!
//! i8 × i8 → i32 is exact whatever the order of the sums, so its fast paths (`dot_i8` with AVX-512
//! VNNI, else the f32 GEMM below in chunks whose sums f32 holds exactly) give one result on every CPU.
//!
//! f32 GEMM is the `gemm` crate (the kernels behind faer and candle): pure Rust, runtime-detected
//! AVX2/FMA kernels, arbitrary row/column strides — so transposed operands (`dot_nt`,
//! `dot_tn`, `.t()` views) and strided windows are multiplied in place with no copy — and run
//! single-threaded here (the grid supplies the parallelism). On a 128³ block it does 84 GFLOP/s per core
//! here where `matrixmultiply` did 69. bf16 × bf16 has one order of its own on every CPU
//! (`dot_bf16_order`: `vdpbf16ps`'s pairs): `dot_bf16` runs it in hardware with AVX-512 BF16 (~2×
//! the f32 path), `dot_bf16_order` writes it out elsewhere; every path calls [`mul`], so every
//! machine gives the same bits. Other float operands (bf16 × f32, the 8-bit floats) are widened to
//! f32 (exact) and go to the f32 GEMM.

use super::elementwise::cast;
use super::tensor::{internal, recycle, take_vec, Tensor};
use crate::dtype::DType;
use crate::error::{kerr, Result};
use crate::semantics::host::HostData;
use keep::with_kept;
pub(crate) use keep::KeepRows;

mod keep;

/// A 2-D operand as (rows, cols, row stride, col stride) after the optional transpose.
fn matrix(t: &Tensor, transpose: bool) -> Result<(usize, usize, isize, isize)> {
    if t.shape.len() != 2 {
        return Err(internal("dot operand is not 2-D"));
    }
    let (r, c, sr, sc) = (
        t.shape[0],
        t.shape[1],
        t.strides[0] as isize,
        t.strides[1] as isize,
    );
    Ok(if transpose {
        (c, r, sc, sr)
    } else {
        (r, c, sr, sc)
    })
}

/// `lhs · rhs` (each transposed as asked) in `out`, plus `acc` if given; `keep`, if given, drops rows
/// of `rhs` (see [`KeepRows`]).
pub(crate) fn dot(
    lhs: &Tensor,
    rhs: &Tensor,
    keep: Option<KeepRows<'_>>,
    acc: Option<&Tensor>,
    tl: bool,
    tr: bool,
    out: DType,
) -> Result<Tensor> {
    let mut dropped = None;
    let (rhs, keep) = with_kept(lhs, rhs, keep, tr, &mut dropped)?;
    match (lhs.dtype, rhs.dtype, out) {
        // f32/bf16 and the 8-bit floats (widened to f32: their products are exact in f32).
        (a, b, DType::F32) if a.is_float() && b.is_float() => {
            dot_f32(lhs, (rhs, keep), acc, tl, tr)
        }
        (DType::I8, DType::I8, DType::I32) => dot_i8(lhs, rhs, acc, tl, tr),
        // int4 × int4: widened to i8 (exact), then i8's exact product.
        (DType::I4, DType::I4, DType::I32) => {
            dot_i8(&cast(lhs, DType::I8)?, &cast(rhs, DType::I8)?, acc, tl, tr)
        }
        (a, b, o) => Err(kerr!(
            Unsupported,
            "dot of {a} x {b} -> {o} is not supported by the interpreter"
        )),
    }
}

fn widen(t: &Tensor) -> Result<Tensor> {
    if t.dtype == DType::F32 {
        Ok(t.clone())
    } else {
        cast(t, DType::F32)
    }
}

fn dot_f32(
    lhs: &Tensor,
    (rhs, keep): (&Tensor, Option<KeepRows<'_>>),
    acc: Option<&Tensor>,
    tl: bool,
    tr: bool,
) -> Result<Tensor> {
    let (m, k, _, _) = matrix(lhs, tl)?;
    let (k2, n, _, _) = matrix(rhs, tr)?;
    if k != k2 {
        return Err(internal("dot contraction sizes differ"));
    }
    let (c, beta) = match acc {
        Some(t) if t.shape[..] == [m, n] => (widen(t)?.to_vec::<f32>()?, 1.0),
        Some(_) => return Err(internal("dot accumulator shape")),
        None => {
            let mut c = take_vec::<f32>(m * n);
            c.resize(m * n, 0.0);
            (c, 0.0)
        }
    };
    mul(lhs, (rhs, keep), tl, tr, c, beta)
}

/// A `dot` accumulating into `acc` (row-major, `acc_shape`; f32 for float operands, i32 for i8 ones),
/// which becomes the result: the same bits as [`dot`] with that accumulator, without copying it.
pub(crate) fn dot_into(
    lhs: &Tensor,
    (rhs, keep): (&Tensor, Option<KeepRows<'_>>),
    acc_shape: &[usize],
    acc: HostData,
    tl: bool,
    tr: bool,
) -> Result<Tensor> {
    let mut dropped = None;
    let (rhs, keep) = with_kept(lhs, rhs, keep, tr, &mut dropped)?;
    let (m, _, _, _) = matrix(lhs, tl)?;
    let (_, n, _, _) = matrix(rhs, tr)?;
    if acc_shape[..] != [m, n] || acc.len() != m * n {
        return Err(internal("dot accumulator shape"));
    }
    match (lhs.dtype, rhs.dtype, acc) {
        (a, b, HostData::F32(c)) if a.is_float() && b.is_float() => {
            mul(lhs, (rhs, keep), tl, tr, c, 1.0)
        }
        (DType::I8, DType::I8, HostData::I32(c)) => gemm_i8(lhs, rhs, tl, tr, c, true),
        (DType::I4, DType::I4, HostData::I32(c)) => gemm_i8(
            &cast(lhs, DType::I8)?,
            &cast(rhs, DType::I8)?,
            tl,
            tr,
            c,
            true,
        ),
        _ => Err(internal("dot accumulator dtype")),
    }
}

/// `c = lhs·rhs + beta·c` (beta 0 or 1): natively for bf16 × bf16 where the CPU can, else in f32.
/// `keep` is given only for bf16 factors (see [`with_kept`]).
fn mul(
    lhs: &Tensor,
    (rhs, keep): (&Tensor, Option<KeepRows<'_>>),
    tl: bool,
    tr: bool,
    c: Vec<f32>,
    beta: f32,
) -> Result<Tensor> {
    if lhs.dtype == DType::BF16 && rhs.dtype == DType::BF16 {
        return gemm_bf16(lhs, (rhs, keep), tl, tr, c, beta);
    }
    if keep.is_some() {
        return Err(internal("kept rows of a dot the kernel cannot drop"));
    }
    gemm(&widen(lhs)?, &widen(rhs)?, tl, tr, c, beta)
}

/// Whether every element the strides of an `rows x cols` view at `off` reach lies in `len` elements.
fn in_bounds(len: usize, off: usize, rows: usize, cols: usize, rs: isize, cs: isize) -> bool {
    rows * cols == 0
        || (rs >= 0
            && cs >= 0
            && off + (rows - 1) * (rs as usize) + (cols - 1) * (cs as usize) < len)
}

/// An operand of the native GEMMs (`dot_bf16`, `dot_i8`): element (r, c) of the logical matrix is
/// `data[off + r·rs + c·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a, T> {
    pub data: &'a [T],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

/// The edge tiles of the GEMM kernels (`dot_bf16`, `dot_bf16_order`, `dot_i8`), which compute whole
/// `rows × nr` tiles: the `mr × nc` corner of the row-major `c` (row stride `n`) at `at` copied into a
/// local `tile` of `nr` columns, zeros elsewhere (and everywhere when `accumulate` is false)...
pub(crate) fn edge_tile_load<T: Copy + Default>(
    tile: &mut [T],
    nr: usize,
    c: &[T],
    n: usize,
    (i0, j0): (usize, usize),
    (mr, nc): (usize, usize),
    accumulate: bool,
) {
    for (r, row) in tile.chunks_mut(nr).enumerate() {
        for (cc, t) in row.iter_mut().enumerate() {
            *t = if accumulate && r < mr && cc < nc {
                c[(i0 + r) * n + j0 + cc]
            } else {
                T::default()
            };
        }
    }
}

/// ...and the corner written back from the tile once computed.
pub(crate) fn edge_tile_store<T: Copy>(
    tile: &[T],
    nr: usize,
    c: &mut [T],
    n: usize,
    (i0, j0): (usize, usize),
    (mr, nc): (usize, usize),
) {
    for r in 0..mr {
        c[(i0 + r) * n + j0..][..nc].copy_from_slice(&tile[r * nr..][..nc]);
    }
}

/// `(m, n, k)` and the two factors of a product.
type CheckedViews<'a, T> = ((usize, usize, usize), View<'a, T>, View<'a, T>);

/// The operands of `lhs · rhs` (each transposed as asked) as views checked to lie inside their
/// buffers, with `(m, n, k)`; `c_len`, the result's length, must be `m · n`.
fn checked_views<'a, T: crate::semantics::host::HostElement>(
    lhs: &'a Tensor,
    rhs: &'a Tensor,
    tl: bool,
    tr: bool,
    c_len: usize,
) -> Result<CheckedViews<'a, T>> {
    let (m, k, rsa, csa) = matrix(lhs, tl)?;
    let (k2, n, rsb, csb) = matrix(rhs, tr)?;
    if k != k2 || c_len != m * n {
        return Err(internal("dot contraction sizes differ"));
    }
    let (ad, bd) = (lhs.data::<T>()?, rhs.data::<T>()?);
    if !in_bounds(ad.len(), lhs.offset, m, k, rsa, csa)
        || !in_bounds(bd.len(), rhs.offset, k, n, rsb, csb)
    {
        return Err(internal("dot operand view out of its buffer"));
    }
    // In bounds means non-negative strides (or an empty view, which no GEMM reads).
    let view = |data, off, rs: isize, cs: isize| View {
        data,
        off,
        rs: rs as usize,
        cs: cs as usize,
    };
    Ok((
        (m, n, k),
        view(ad, lhs.offset, rsa, csa),
        view(bd, rhs.offset, rsb, csb),
    ))
}

/// bf16 × bf16 in the one order of `dot_bf16_order` (whose `gemm` picks the kernel).
fn gemm_bf16(
    a: &Tensor,
    (b, keep): (&Tensor, Option<KeepRows<'_>>),
    tl: bool,
    tr: bool,
    mut c: Vec<f32>,
    beta: f32,
) -> Result<Tensor> {
    let ((m, n, k), va, vb) = checked_views::<half::bf16>(a, b, tl, tr, c.len())?;
    if m * n > 0 && k > 0 {
        super::dot_bf16_order::gemm(m, n, k, va, (vb, keep), &mut c, beta != 0.0)?;
    } else if beta == 0.0 {
        c.iter_mut().for_each(|x| *x = 0.0);
    }
    Ok(Tensor::from_vec(vec![m, n], c))
}

/// `c = a·b + beta·c` for f32 views `a`, `b` and a row-major `m x n` buffer `c`; returns `c`.
fn gemm(a: &Tensor, b: &Tensor, tl: bool, tr: bool, mut c: Vec<f32>, beta: f32) -> Result<Tensor> {
    let (m, k, rsa, csa) = matrix(a, tl)?;
    let (k2, n, rsb, csb) = matrix(b, tr)?;
    if k != k2 || c.len() != m * n {
        return Err(internal("dot contraction sizes differ"));
    }
    let (ad, bd) = (a.data::<f32>()?, b.data::<f32>()?);
    let a = F32View {
        data: ad,
        off: a.offset,
        rs: rsa,
        cs: csa,
    };
    let b = F32View {
        data: bd,
        off: b.offset,
        rs: rsb,
        cs: csb,
    };
    sgemm(m, n, k, a, b, &mut c, beta)?;
    Ok(Tensor::from_vec(vec![m, n], c))
}

/// An f32 operand: element (r, c) is `data[off + r·rs + c·cs]`.
#[derive(Clone, Copy)]
struct F32View<'a> {
    data: &'a [f32],
    off: usize,
    rs: isize,
    cs: isize,
}

/// `c = a·b + beta·c` for `a: m×k`, `b: k×n` and a row-major `m×n` `c`, through the `gemm` crate.
fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: F32View<'_>,
    b: F32View<'_>,
    c: &mut [f32],
    beta: f32,
) -> Result<()> {
    // Every element the strides reach must be inside the buffers (views are built in bounds; this
    // re-check makes the unsafe call below sound whatever produced them).
    if !in_bounds(a.data.len(), a.off, m, k, a.rs, a.cs)
        || !in_bounds(b.data.len(), b.off, k, n, b.rs, b.cs)
        || c.len() != m * n
    {
        return Err(internal("dot operand view out of its buffer"));
    }
    if m * n > 0 {
        // SAFETY: a/b point into live buffers and every (i, p) / (p, j) index reached through the strides
        // was checked above to be in bounds; c has exactly m*n elements with row stride n.
        unsafe {
            // dst = alpha·dst + beta·lhs·rhs, dst read only when alpha is used.
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                beta != 0.0,
                a.data.as_ptr().add(a.off),
                a.cs,
                a.rs,
                b.data.as_ptr().add(b.off),
                b.cs,
                b.rs,
                beta,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
    Ok(())
}

fn dot_i8(lhs: &Tensor, rhs: &Tensor, acc: Option<&Tensor>, tl: bool, tr: bool) -> Result<Tensor> {
    let (m, _, _, _) = matrix(lhs, tl)?;
    let (_, n, _, _) = matrix(rhs, tr)?;
    let c = match acc {
        Some(t) if t.shape[..] == [m, n] && t.dtype == DType::I32 => t.to_vec::<i32>()?,
        Some(_) => return Err(internal("dot accumulator shape")),
        None => {
            let mut c = take_vec::<i32>(m * n);
            c.resize(m * n, 0);
            c
        }
    };
    gemm_i8(lhs, rhs, tl, tr, c, acc.is_some())
}

/// `c = lhs·rhs + (accumulate ? c : 0)` in wrapping i32 for i8 views and a row-major `m x n` `c`: with
/// AVX-512 VNNI in integers (`dot_i8`), else through the f32 GEMM — exactly, as long as no sum can
/// leave f32's integers: |a·b| ≤ 2¹⁴, so every partial sum of at most [`EXACT_K`] products, in any
/// order, is an integer of magnitude ≤ 2²⁴, which f32 holds. k is split into chunks of that many;
/// each chunk's sum is converted to i32 and added wrapping. Both equal the definition bit for bit.
fn gemm_i8(
    lhs: &Tensor,
    rhs: &Tensor,
    tl: bool,
    tr: bool,
    c: Vec<i32>,
    accumulate: bool,
) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if super::dot_i8::available() {
        return gemm_i8_vnni(lhs, rhs, tl, tr, c, accumulate);
    }
    gemm_i8_f32(lhs, rhs, tl, tr, c, accumulate)
}

/// The most products an f32 sum of i8 × i8 products holds exactly (2²⁴ / 2¹⁴).
const EXACT_K: usize = 1 << 10;

fn gemm_i8_f32(
    lhs: &Tensor,
    rhs: &Tensor,
    tl: bool,
    tr: bool,
    mut c: Vec<i32>,
    accumulate: bool,
) -> Result<Tensor> {
    let (m, k, _, _) = matrix(lhs, tl)?;
    let (k2, n, _, _) = matrix(rhs, tr)?;
    if k != k2 || c.len() != m * n {
        return Err(internal("dot contraction sizes differ"));
    }
    if !accumulate {
        c.fill(0);
    }
    // Widened copies are contiguous in the operands' own layout; only the strides transpose.
    let (a, b) = (cast(lhs, DType::F32)?, cast(rhs, DType::F32)?);
    let ((_, _, rsa, csa), (_, _, rsb, csb)) = (matrix(&a, tl)?, matrix(&b, tr)?);
    let (ad, bd) = (a.data::<f32>()?, b.data::<f32>()?);
    let mut part = take_vec::<f32>(m * n);
    part.resize(m * n, 0.0);
    for k0 in (0..k).step_by(EXACT_K) {
        let kc = EXACT_K.min(k - k0);
        let a = F32View {
            data: ad,
            off: a.offset + k0 * csa as usize,
            rs: rsa,
            cs: csa,
        };
        let b = F32View {
            data: bd,
            off: b.offset + k0 * rsb as usize,
            rs: rsb,
            cs: csb,
        };
        sgemm(m, n, kc, a, b, &mut part, 0.0)?;
        for (c, p) in c.iter_mut().zip(&part) {
            *c = c.wrapping_add(*p as i32);
        }
    }
    recycle(Tensor::from_vec(vec![m, n], part));
    Ok(Tensor::from_vec(vec![m, n], c))
}

#[cfg(target_arch = "x86_64")]
fn gemm_i8_vnni(
    lhs: &Tensor,
    rhs: &Tensor,
    tl: bool,
    tr: bool,
    mut c: Vec<i32>,
    accumulate: bool,
) -> Result<Tensor> {
    let ((m, n, k), va, vb) = checked_views::<i8>(lhs, rhs, tl, tr, c.len())?;
    super::dot_i8::gemm(m, n, k, va, vb, &mut c, accumulate);
    Ok(Tensor::from_vec(vec![m, n], c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition of `dot` on i8: `c[i][j] (+)= Σ_p a[i][p]·b[p][j]` in wrapping i32, one product
    /// at a time, on the logical (possibly transposed) operands.
    fn definition(a: &Tensor, b: &Tensor, tl: bool, tr: bool, c: &mut [i32]) {
        let (m, k, rsa, csa) = matrix(a, tl).expect("2-D");
        let (_, n, rsb, csb) = matrix(b, tr).expect("2-D");
        let (ad, bd) = (a.data::<i8>().expect("i8"), b.data::<i8>().expect("i8"));
        let at = |d: &[i8], off: usize, r: usize, c: usize, rs: isize, cs: isize| {
            d[off + r * rs as usize + c * cs as usize] as i32
        };
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let x = at(ad, a.offset, i, p, rsa, csa) * at(bd, b.offset, p, j, rsb, csb);
                    c[i * n + j] = c[i * n + j].wrapping_add(x);
                }
            }
        }
    }

    /// Both i8 paths (VNNI where the CPU has it, the exact f32 chunks everywhere) equal the definition
    /// bit for bit: edge tiles, odd k, k past one f32 chunk with extreme products, transposed operands, and
    /// accumulators that wrap.
    #[test]
    fn i8_paths_equal_the_definition() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (m, n, k) in [
            (8, 32, 2),
            (13, 33, 7),
            (1, 1, 1),
            (40, 70, 129),
            (128, 128, 128),
            (9, 40, 2 * EXACT_K + 3),
        ] {
            let random: Vec<i8> = (0..m * k).map(|_| next() as i8).collect();
            let b_data: Vec<i8> = (0..k * n).map(|_| next() as i8).collect();
            // Random values; the largest product (-128 · -128: a full chunk sums to 2²⁴); and large
            // products with random low bits (120..=127 squared), whose sums f32 would round past one
            // chunk.
            let large: Vec<i8> = (0..m * k + k * n)
                .map(|_| 120 + (next() % 8) as i8)
                .collect();
            for extreme in [None, Some(-128i8), Some(127)] {
                let (a, b) = match extreme {
                    None => (random.clone(), b_data.clone()),
                    Some(-128) => (vec![-128; m * k], vec![-128; k * n]),
                    Some(_) => (large[..m * k].to_vec(), large[m * k..].to_vec()),
                };
                let (a, b) = (
                    Tensor::from_vec(vec![m, k], a),
                    Tensor::from_vec(vec![k, n], b),
                );
                // The same operands stored transposed, read through `dot`'s transpose flags.
                let at = a
                    .permute(&[1, 0])
                    .and_then(|t| t.materialize())
                    .expect("a^T");
                let bt = b
                    .permute(&[1, 0])
                    .and_then(|t| t.materialize())
                    .expect("b^T");
                let init: Vec<i32> = (0..m * n)
                    .map(|i| match i % 3 {
                        0 => i32::MAX - (next() % 1000) as i32,
                        1 => i32::MIN + (next() % 1000) as i32,
                        _ => next() as i32,
                    })
                    .collect();
                for ((l, tl), (r, tr)) in [((&a, false), (&b, false)), ((&at, true), (&bt, true))] {
                    for accumulate in [false, true] {
                        let mut want = if accumulate {
                            init.clone()
                        } else {
                            vec![0; m * n]
                        };
                        definition(l, r, tl, tr, &mut want);
                        let f32_path = gemm_i8_f32(l, r, tl, tr, init.clone(), accumulate)
                            .and_then(|t| t.to_vec::<i32>())
                            .expect("f32 path");
                        let best = gemm_i8(l, r, tl, tr, init.clone(), accumulate)
                            .and_then(|t| t.to_vec::<i32>())
                            .expect("best path");
                        let what = format!(
                            "({m},{n},{k}) extreme {extreme:?} transposed {tl} acc {accumulate}"
                        );
                        assert!(f32_path == want, "f32 chunks {what}");
                        assert!(best == want, "best path {what}");
                    }
                }
            }
        }
    }
}

//! `dot` on the MXU's terms: bf16/f32 operands multiplied exactly and accumulated in f32 (a bf16 product
//! is exact in f32), i8 operands accumulated in wrapping i32; an optional accumulator operand is added in.
//!
//! f32 GEMM is the `gemm` crate (the kernels behind faer and candle): pure Rust, runtime-detected
//! AVX2/FMA kernels, arbitrary row/column strides — so transposed operands (`dot_nt`,
//! `dot_tn`, `.t()` views) and strided windows are multiplied in place with no copy — and run
//! single-threaded here (the grid supplies the parallelism). On a 128³ block it does 84 GFLOP/s per core
//! here where `matrixmultiply` did 69. bf16 operands are widened to f32 first — except on CPUs with
//! AVX-512 BF16, where bf16 × bf16 goes to `dot_bf16` (the MXU's pairwise bf16 products in hardware,
//! ~2× the f32 path): every path calls [`mul`], so on one machine all give the same bits.

use super::elementwise::cast;
use super::tensor::{internal, take_vec, Tensor};
use crate::dtype::DType;
use crate::error::{kerr, Result};

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

pub(crate) fn dot(
    lhs: &Tensor,
    rhs: &Tensor,
    acc: Option<&Tensor>,
    tl: bool,
    tr: bool,
    out: DType,
) -> Result<Tensor> {
    match (lhs.dtype, rhs.dtype, out) {
        (DType::F32 | DType::BF16, DType::F32 | DType::BF16, DType::F32) => {
            dot_f32(lhs, rhs, acc, tl, tr)
        }
        (DType::I8, DType::I8, DType::I32) => dot_i8(lhs, rhs, acc, tl, tr),
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

/// Whether bf16 × bf16 products run natively (then bf16 operands must not be widened first).
pub(crate) fn bf16_native() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::dot_bf16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn dot_f32(lhs: &Tensor, rhs: &Tensor, acc: Option<&Tensor>, tl: bool, tr: bool) -> Result<Tensor> {
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
    mul(lhs, rhs, tl, tr, c, beta)
}

/// An f32 `dot` accumulating into `acc` (row-major, `acc_shape`), which becomes the result: the same
/// bits as [`dot`] with that accumulator, without copying it.
pub(crate) fn dot_f32_into(
    lhs: &Tensor,
    rhs: &Tensor,
    acc_shape: &[usize],
    acc: Vec<f32>,
    tl: bool,
    tr: bool,
) -> Result<Tensor> {
    let (m, _, _, _) = matrix(lhs, tl)?;
    let (_, n, _, _) = matrix(rhs, tr)?;
    if acc_shape[..] != [m, n] || acc.len() != m * n {
        return Err(internal("dot accumulator shape"));
    }
    mul(lhs, rhs, tl, tr, acc, 1.0)
}

/// `c = lhs·rhs + beta·c` (beta 0 or 1): natively for bf16 × bf16 where the CPU can, else in f32.
fn mul(lhs: &Tensor, rhs: &Tensor, tl: bool, tr: bool, c: Vec<f32>, beta: f32) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if lhs.dtype == DType::BF16 && rhs.dtype == DType::BF16 && bf16_native() {
        return gemm_bf16(lhs, rhs, tl, tr, c, beta);
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

#[cfg(target_arch = "x86_64")]
fn gemm_bf16(
    a: &Tensor,
    b: &Tensor,
    tl: bool,
    tr: bool,
    mut c: Vec<f32>,
    beta: f32,
) -> Result<Tensor> {
    use super::dot_bf16::{gemm, View};
    let (m, k, rsa, csa) = matrix(a, tl)?;
    let (k2, n, rsb, csb) = matrix(b, tr)?;
    if k != k2 || c.len() != m * n {
        return Err(internal("dot contraction sizes differ"));
    }
    let (ad, bd) = (a.data::<half::bf16>()?, b.data::<half::bf16>()?);
    if !in_bounds(ad.len(), a.offset, m, k, rsa, csa)
        || !in_bounds(bd.len(), b.offset, k, n, rsb, csb)
    {
        return Err(internal("dot operand view out of its buffer"));
    }
    if m * n > 0 && k > 0 {
        let view = |data, off, rs: isize, cs: isize| View {
            data,
            off,
            rs: rs as usize,
            cs: cs as usize,
        };
        gemm(
            m,
            n,
            k,
            view(ad, a.offset, rsa, csa),
            view(bd, b.offset, rsb, csb),
            &mut c,
            beta != 0.0,
        );
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
    // Every element the strides reach must be inside the buffers (views are built in bounds; this
    // re-check makes the unsafe call below sound whatever produced them).
    if !in_bounds(ad.len(), a.offset, m, k, rsa, csa)
        || !in_bounds(bd.len(), b.offset, k, n, rsb, csb)
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
                ad.as_ptr().add(a.offset),
                csa,
                rsa,
                bd.as_ptr().add(b.offset),
                csb,
                rsb,
                beta,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
    Ok(Tensor::from_vec(vec![m, n], c))
}

fn dot_i8(lhs: &Tensor, rhs: &Tensor, acc: Option<&Tensor>, tl: bool, tr: bool) -> Result<Tensor> {
    let (m, k, _, _) = matrix(lhs, tl)?;
    let (k2, n, _, _) = matrix(rhs, tr)?;
    if k != k2 {
        return Err(internal("dot contraction sizes differ"));
    }
    let mut c = match acc {
        Some(t) if t.shape[..] == [m, n] && t.dtype == DType::I32 => t.to_vec::<i32>()?,
        Some(_) => return Err(internal("dot accumulator shape")),
        None => vec![0i32; m * n],
    };
    let (a, b) = (lhs.to_vec::<i8>()?, rhs.to_vec::<i8>()?);
    // Re-index the contiguous copies with the (possibly transposed) logical strides.
    let (rsa, csa) = if tl { (1, m) } else { (k, 1) };
    let (rsb, csb) = if tr { (1, k) } else { (n, 1) };
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * rsa + p * csa] as i32;
            for (j, r) in row.iter_mut().enumerate() {
                *r = r.wrapping_add(x.wrapping_mul(b[p * rsb + j * csb] as i32));
            }
        }
    }
    Ok(Tensor::from_vec(vec![m, n], c))
}

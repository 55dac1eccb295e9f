//! Values built from other values in a grid step: `concatenate`, `roll`, `argmax`/`argmin`. Each result is a fresh contiguous
//! tensor; the parts may be any views.

use crate::dtype::DType;
use crate::error::Result;
use crate::interpret::elementwise::with_dtype;
use crate::interpret::tensor::{internal, Tensor};
use crate::semantics::host::HostElement;

/// The parts joined along `dim`: for each index of the dimensions before `dim`, every part's
/// contiguous run of `dim` and the dimensions after it, in operand order.
pub(super) fn concatenate(parts: &[Tensor], dim: usize, out_shape: &[usize]) -> Result<Tensor> {
    let first = parts
        .first()
        .ok_or_else(|| internal("concatenate of nothing"))?;
    let outer: usize = out_shape[..dim].iter().product();
    let data = with_dtype!(first.dtype, T => {
        let rows: Vec<(Vec<T>, usize)> = parts
            .iter()
            .map(|p| Ok((p.to_vec::<T>()?, p.shape[dim..].iter().product())))
            .collect::<Result<_>>()?;
        let mut out: Vec<T> = Vec::with_capacity(out_shape.iter().product());
        for o in 0..outer {
            for (v, run) in &rows {
                out.extend_from_slice(&v[o * run..(o + 1) * run]);
            }
        }
        T::wrap(out)
    });
    Ok(Tensor::from_data(out_shape, data))
}

/// `x` rotated along `dim` by `shift` (taken mod n, any sign): `out[i] = x[(i - shift) mod n]`.
pub(super) fn roll(x: &Tensor, dim: usize, shift: i64) -> Result<Tensor> {
    let shape: Vec<usize> = x.shape.to_vec();
    let n = *shape.get(dim).ok_or_else(|| internal("roll dimension"))?;
    let s = shift.rem_euclid(n as i64) as usize;
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let data = with_dtype!(x.dtype, T => {
        let v = x.to_vec::<T>()?;
        let mut out: Vec<T> = Vec::with_capacity(v.len());
        for o in 0..outer {
            let base = o * n * inner;
            for i in 0..n {
                let from = base + ((i + n - s) % n) * inner;
                out.extend_from_slice(&v[from..from + inner]);
            }
        }
        T::wrap(out)
    });
    Ok(Tensor::from_data(&shape, data))
}

/// The `i32` index of the first maximum (`max`) or minimum over `dim` of an f32 `x`, that dimension
/// dropped. A NaN is the extreme either way: the first NaN's index (jnp's rule).
pub(super) fn arg_reduce(x: &Tensor, dim: usize, max: bool) -> Result<Tensor> {
    let shape: Vec<usize> = x.shape.to_vec();
    let n = *shape.get(dim).ok_or_else(|| internal("argmax dimension"))?;
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let v = x.to_vec::<f32>()?;
    let mut out: Vec<i32> = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for k in 0..inner {
            let at = |i: usize| v[(o * n + i) * inner + k];
            let mut best = 0usize;
            for i in 1..n {
                let (b, c) = (at(best), at(i));
                if b.is_nan() {
                    break;
                }
                if c.is_nan() || (max && c > b) || (!max && c < b) {
                    best = i;
                }
            }
            out.push(best as i32);
        }
    }
    let mut out_shape = shape;
    out_shape.remove(dim);
    Ok(Tensor::from_vec(&out_shape, out))
}

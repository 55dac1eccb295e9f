//! Reductions (sum/max/min over any axes). Floats accumulate in f32 (bf16 is rounded once at the end,
//! like `jnp.sum` on bf16); integers wrap. Rows along the last axis use 16 independent lanes so the loop
//! vectorizes; other axes combine whole rows elementwise.

use super::elementwise::FloatElem;
use super::host::HostElement;
use super::math::{self, IntOps};
use super::tensor::{for_each_row, internal, row_major_strides, Tensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::ReduceKind;
use half::bf16;

/// How a reduction combines two accumulator values, with its identity.
trait Combine: Copy {
    type Acc: Copy + Send + Sync + 'static;
    fn identity(self) -> Self::Acc;
    fn combine(self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

#[derive(Clone, Copy)]
struct FloatComb(ReduceKind);
impl Combine for FloatComb {
    type Acc = f32;
    #[inline(always)]
    fn identity(self) -> f32 {
        match self.0 {
            ReduceKind::Sum => 0.0,
            ReduceKind::Max => f32::NEG_INFINITY,
            ReduceKind::Min => f32::INFINITY,
        }
    }
    #[inline(always)]
    fn combine(self, a: f32, b: f32) -> f32 {
        match self.0 {
            ReduceKind::Sum => a + b,
            ReduceKind::Max => math::max_f32(a, b),
            ReduceKind::Min => math::min_f32(a, b),
        }
    }
}

#[derive(Clone, Copy)]
struct IntComb<T>(ReduceKind, std::marker::PhantomData<T>);
impl<T: IntOps + Send + Sync + 'static> Combine for IntComb<T> {
    type Acc = T;
    #[inline(always)]
    fn identity(self) -> T {
        match self.0 {
            ReduceKind::Sum => T::ZERO,
            ReduceKind::Max => T::MIN,
            ReduceKind::Min => T::MAX,
        }
    }
    #[inline(always)]
    fn combine(self, a: T, b: T) -> T {
        match self.0 {
            ReduceKind::Sum => a.wadd(b),
            ReduceKind::Max => {
                if b > a {
                    b
                } else {
                    a
                }
            }
            ReduceKind::Min => {
                if b < a {
                    b
                } else {
                    a
                }
            }
        }
    }
}

/// Reduce `t` over `axes`; the result has `out_shape` (the IR's result shape, keepdims or not).
pub(crate) fn reduce(
    t: &Tensor,
    kind: ReduceKind,
    axes: &[usize],
    out_shape: &[usize],
) -> Result<Tensor> {
    if axes.iter().any(|&a| a >= t.shape.len()) {
        return Err(internal("reduction axis out of range"));
    }
    match t.dtype {
        DType::F32 => reduce_with::<f32, _>(t, axes, out_shape, FloatComb(kind), |x| x, |x| x),
        DType::BF16 => reduce_with::<bf16, _>(
            t,
            axes,
            out_shape,
            FloatComb(kind),
            |x: bf16| x.f(),
            bf16::from_f,
        ),
        DType::I32 => int_reduce::<i32>(t, kind, axes, out_shape),
        DType::I8 => int_reduce::<i8>(t, kind, axes, out_shape),
        DType::U8 => int_reduce::<u8>(t, kind, axes, out_shape),
        DType::U32 => int_reduce::<u32>(t, kind, axes, out_shape),
        DType::Bool => Err(internal("reduction of bool values")),
    }
}

fn int_reduce<T: HostElement + IntOps>(
    t: &Tensor,
    kind: ReduceKind,
    axes: &[usize],
    out: &[usize],
) -> Result<Tensor> {
    reduce_with::<T, _>(
        t,
        axes,
        out,
        IntComb::<T>(kind, std::marker::PhantomData),
        |x| x,
        |x| x,
    )
}

fn reduce_with<T: HostElement, C: Combine>(
    t: &Tensor,
    axes: &[usize],
    out_shape: &[usize],
    comb: C,
    load: impl Fn(T) -> C::Acc,
    finish: impl Fn(C::Acc) -> T,
) -> Result<Tensor> {
    let data = t.data::<T>()?;
    let rank = t.shape.len();
    let kept: Vec<usize> = (0..rank)
        .map(|d| if axes.contains(&d) { 1 } else { t.shape[d] })
        .collect();
    let mut out_strides = row_major_strides(&kept);
    for &a in axes {
        out_strides[a] = 0;
    }
    let n_out: usize = kept.iter().product();
    let mut acc = vec![comb.identity(); n_out];
    for_each_row(
        &t.shape,
        [&t.strides, &out_strides],
        [t.offset, 0],
        |[oi, oo], len, [si, so]| {
            if so == 0 {
                // The innermost (merged) axis is reduced: reduce the row, then fold into one output.
                let r = if si == 1 {
                    reduce_row(&data[oi..oi + len], comb, &load)
                } else {
                    (0..len).fold(comb.identity(), |a, i| {
                        comb.combine(a, load(data[oi + i * si]))
                    })
                };
                acc[oo] = comb.combine(acc[oo], r);
            } else {
                // The innermost axis is kept: fold the row into the output row elementwise.
                let dst = &mut acc[oo..oo + len * so];
                if si == 1 && so == 1 {
                    for (d, &x) in dst.iter_mut().zip(&data[oi..oi + len]) {
                        *d = comb.combine(*d, load(x));
                    }
                } else {
                    for i in 0..len {
                        dst[i * so] = comb.combine(dst[i * so], load(data[oi + i * si]));
                    }
                }
            }
        },
    );
    let out: Vec<T> = acc.into_iter().map(finish).collect();
    if out.len() != out_shape.iter().product::<usize>() {
        return Err(internal("reduction result shape"));
    }
    Ok(Tensor::from_vec(out_shape.to_vec(), out))
}

/// A contiguous row reduced with 16 independent lanes (vectorizes; the summation order differs from a
/// sequential loop, as it does on the TPU).
#[inline(always)]
fn reduce_row<T: Copy, C: Combine>(row: &[T], comb: C, load: &impl Fn(T) -> C::Acc) -> C::Acc {
    const L: usize = 16;
    let mut lanes = [comb.identity(); L];
    let chunks = row.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..L {
            lanes[i] = comb.combine(lanes[i], load(c[i]));
        }
    }
    let mut r = comb.identity();
    for x in rest {
        r = comb.combine(r, load(*x));
    }
    // Pairwise tree over the lanes.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            lanes[i] = comb.combine(lanes[i], lanes[i + w]);
        }
    }
    comb.combine(lanes[0], r)
}

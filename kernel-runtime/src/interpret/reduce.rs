//! Reductions (sum/max/min over any axes). Floats accumulate in f32 (bf16 is rounded once at the end,
//! like `jnp.sum` on bf16); integers wrap. Rows along the last axis use 16 independent lanes so the loop
//! vectorizes; other axes combine whole rows elementwise.

use super::elementwise::FloatElem;
use super::simd::multiversion;
use super::tensor::{internal, row_major_strides, Rows, Tensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::ReduceKind;
use crate::math::IntOps;
use crate::semantics::host::HostElement;
use half::bf16;

/// How a reduction combines two accumulator values, with its identity.
trait Combine: Copy {
    type Acc: Copy + Send + Sync + 'static;
    fn identity(self) -> Self::Acc;
    fn combine(self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// A contiguous f32 row reduced with explicit SIMD, when this combiner has such a path.
    fn row_f32(self, _row: &[f32]) -> Option<Self::Acc> {
        None
    }
}

use super::row_order::{comb_f32, identity_f32, RowAcc};
pub(crate) use super::row_order::{MAX, MIN, SUM};

/// Float combiners; the kind is a const parameter so the hot loop has no branch on it.
#[derive(Clone, Copy)]
struct FloatComb<const K: u8>;
impl<const K: u8> Combine for FloatComb<K> {
    type Acc = f32;
    #[inline(always)]
    fn identity(self) -> f32 {
        identity_f32::<K>()
    }
    #[inline(always)]
    fn combine(self, a: f32, b: f32) -> f32 {
        comb_f32::<K>(a, b)
    }
    #[inline(always)]
    fn row_f32(self, row: &[f32]) -> Option<f32> {
        Some(super::row_order::row_f32::<K>(row))
    }
}

#[derive(Clone, Copy)]
struct IntComb<T, const K: u8>(std::marker::PhantomData<T>);
impl<T: IntOps + Send + Sync + 'static, const K: u8> Combine for IntComb<T, K> {
    type Acc = T;
    #[inline(always)]
    fn identity(self) -> T {
        match K {
            SUM => T::ZERO,
            MAX => T::MIN,
            _ => T::MAX,
        }
    }
    #[inline(always)]
    fn combine(self, a: T, b: T) -> T {
        match K {
            SUM => a.wadd(b),
            MAX => {
                if b > a {
                    b
                } else {
                    a
                }
            }
            _ => {
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
    macro_rules! by_kind {
        (|$K:ident| $e:expr) => {
            match kind {
                ReduceKind::Sum => {
                    const $K: u8 = SUM;
                    $e
                }
                ReduceKind::Max => {
                    const $K: u8 = MAX;
                    $e
                }
                ReduceKind::Min => {
                    const $K: u8 = MIN;
                    $e
                }
            }
        };
    }
    match t.dtype {
        DType::F32 => {
            by_kind!(|K| reduce_with::<f32, _>(t, axes, out_shape, FloatComb::<K>, |x| x, |x| x))
        }
        DType::BF16 => {
            by_kind!(|K| reduce_with::<bf16, _>(
                t,
                axes,
                out_shape,
                FloatComb::<K>,
                |x: bf16| x.f(),
                bf16::from_f
            ))
        }
        DType::I32 => by_kind!(|K| int_reduce::<i32, K>(t, axes, out_shape)),
        DType::I8 => by_kind!(|K| int_reduce::<i8, K>(t, axes, out_shape)),
        DType::U8 => by_kind!(|K| int_reduce::<u8, K>(t, axes, out_shape)),
        DType::U32 => by_kind!(|K| int_reduce::<u32, K>(t, axes, out_shape)),
        DType::Bool => Err(internal("reduction of bool values")),
        // Storage dtypes: `check` refuses their arithmetic before a kernel runs.
        DType::F16 | DType::F8E4M3FN | DType::F8E5M2 | DType::I4 => {
            Err(internal("reduction of a storage dtype"))
        }
    }
}

fn int_reduce<T: HostElement + IntOps, const K: u8>(
    t: &Tensor,
    axes: &[usize],
    out: &[usize],
) -> Result<Tensor> {
    reduce_with::<T, _>(
        t,
        axes,
        out,
        IntComb::<T, K>(std::marker::PhantomData),
        |x| x,
        |x| x,
    )
}

multiversion! {
fn reduce_with[T: HostElement, C: Combine](
    t: &Tensor,
    axes: &[usize],
    out_shape: &[usize],
    comb: C,
    load: impl Fn(T) -> C::Acc,
    finish: impl Fn(C::Acc) -> T,
) -> Result<Tensor> {
    reduce_impl(t, axes, out_shape, comb, load, finish)
}
}

#[inline(always)]
fn reduce_impl<T: HostElement, C: Combine>(
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
    let f32_data = if T::DTYPE == DType::F32 {
        t.data::<f32>().ok()
    } else {
        None
    };
    let rows = Rows::new(&t.shape, [&t.strides, &out_strides], [t.offset, 0]);
    let (len, [si, so]) = (rows.inner, rows.inner_strides);
    for [oi, oo] in rows {
        if so == 0 {
            // The innermost (merged) axis is reduced: reduce the row, then fold into one output.
            let simd = match f32_data {
                Some(fd) if si == 1 => comb.row_f32(&fd[oi..oi + len]),
                _ => None,
            };
            let r = if let Some(r) = simd {
                r
            } else if si == 1 {
                reduce_row(&data[oi..oi + len], comb, &load)
            } else {
                (0..len).fold(comb.identity(), |a, i| {
                    comb.combine(a, load(data[oi + i * si]))
                })
            };
            acc[oo] = comb.combine(acc[oo], r);
        } else if si == 1 && so == 1 {
            // The innermost axis is kept: fold the row into the output row elementwise.
            for (d, &x) in acc[oo..oo + len].iter_mut().zip(&data[oi..oi + len]) {
                *d = comb.combine(*d, load(x));
            }
        } else {
            for i in 0..len {
                acc[oo + i * so] = comb.combine(acc[oo + i * so], load(data[oi + i * si]));
            }
        }
    }
    let out: Vec<T> = acc.into_iter().map(finish).collect();
    if out.len() != out_shape.iter().product::<usize>() {
        return Err(internal("reduction result shape"));
    }
    Ok(Tensor::from_vec(out_shape, out))
}

/// A contiguous row reduced in [`super::row_order`]'s order.
#[inline(always)]
fn reduce_row<T: Copy, C: Combine>(row: &[T], comb: C, load: &impl Fn(T) -> C::Acc) -> C::Acc {
    let mut acc = RowAcc::new(comb.identity());
    acc.fold(row, load, |a, b| comb.combine(a, b));
    acc.finish(|a, b| comb.combine(a, b))
}

//! Values built from other values: `concatenate` (`jnp.concatenate` → `tpu.concatenate`), `roll`
//! (`pltpu.roll` → `tpu.dynamic_rotate`), `argmax`/`argmin` (`jnp.argmax` → `tpu.reduce_index`), each
//! in the form Pallas emits.

use super::array::{normalize_axis, storage_only, Array, IntoArg};
use super::{emit, Arg, Val};
use crate::dtype::{DType, Element};
use crate::error::{kerr, SourceLoc};
use crate::ir::{ArgKind, OpKind, Type};

/// The operands of [`concatenate`]: a tuple of 1 to 8 `Array<T>`, an array `[Array<T>; N]`, or a
/// `Vec<Array<T>>` (built in an `unroll` loop).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a list of arrays to concatenate",
    label = "expected a tuple `(a, b, ..)`, an array `[a, b, ..]` or a `Vec` of `Array<{T}>`",
    note = "every part must have the element type `{T}`; cast the others first, e.g. `y.cast::<{T}>()`"
)]
pub trait ConcatParts<T> {
    #[doc(hidden)]
    fn part_vals(self) -> Vec<Val>;
}

impl<T, const N: usize> ConcatParts<T> for [Array<T>; N] {
    fn part_vals(self) -> Vec<Val> {
        self.iter().map(|a| a.v).collect()
    }
}
impl<T> ConcatParts<T> for Vec<Array<T>> {
    fn part_vals(self) -> Vec<Val> {
        self.iter().map(|a| a.v).collect()
    }
}
impl<T> ConcatParts<T> for &[Array<T>] {
    fn part_vals(self) -> Vec<Val> {
        self.iter().map(|a| a.v).collect()
    }
}

macro_rules! tuple_parts {
    ($($a:ident)+) => {
        impl<T> ConcatParts<T> for ($(tuple_parts!(@ty $a T),)+) {
            #[allow(non_snake_case)]
            fn part_vals(self) -> Vec<Val> {
                let ($($a,)+) = self;
                vec![$($a.v),+]
            }
        }
    };
    (@ty $a:ident $T:ident) => { Array<$T> };
}
tuple_parts!(A);
tuple_parts!(A B);
tuple_parts!(A B C);
tuple_parts!(A B C D);
tuple_parts!(A B C D E);
tuple_parts!(A B C D E F);
tuple_parts!(A B C D E F G);
tuple_parts!(A B C D E F G H);

/// The parts joined along `axis` (`jnp.concatenate(parts, axis)`; negative counts from the end): equal
/// in every other dimension, `axis` the last (lanes) or the second-to-last (sublanes). Lowers to
/// `tpu.concatenate`, as Pallas lowers `jnp.concatenate`.
#[track_caller]
pub fn concatenate<T: Element>(parts: impl ConcatParts<T>, axis: isize) -> Array<T> {
    let loc = SourceLoc::caller();
    let parts = parts.part_vals();
    Array::from_val(emit(loc, |t| {
        storage_only("concatenate", T::DTYPE)?;
        let first = parts
            .first()
            .ok_or_else(|| kerr!(Shape, "`concatenate` needs at least one array"))?;
        let shape = match t.ty(*first)? {
            Type::Vector(s, _) => s.clone(),
            other => return Err(kerr!(Shape, "`concatenate` needs arrays, got {other}")),
        };
        let rank = shape.len();
        let dim = normalize_axis(axis, rank)?;
        if dim + 2 < rank {
            return Err(kerr!(
                Shape,
                "`concatenate` joins along the last two axes (lanes or sublanes) of a rank-{rank} array, got axis {axis}; reshape so the joined axis is one of the last two"
            ));
        }
        let mut ids = Vec::with_capacity(parts.len());
        let mut out = shape.clone();
        out[dim] = 0;
        for (k, p) in parts.iter().enumerate() {
            let s = t.ty(*p)?.shape().to_vec();
            let fits = s.len() == rank && (0..rank).all(|d| d == dim || s[d] == shape[d]);
            if !fits {
                return Err(kerr!(
                    Shape,
                    "`concatenate` along axis {dim}: part {k} has shape {s:?}, part 0 {shape:?}; every part must match in every other dimension"
                ));
            }
            out[dim] += s[dim];
            ids.push(t.check(*p)?);
        }
        if ids.len() == 1 {
            return Ok(t.val(ids[0]));
        }
        Ok(t.push1(
            OpKind::Concatenate { dim },
            ids,
            Type::Vector(out, T::DTYPE),
            loc,
        ))
    }))
}

/// `x` rotated by `shift` along `axis` (`pltpu.roll`, the same as `jnp.roll`): element `i` of the
/// result is element `(i - shift) mod n` of `x`. `shift` is an `i32` literal (non-negative, as
/// `pltpu.roll` asks) or a traced `Scalar<i32>` (any value, taken mod n); `axis` is the last or the
/// second-to-last. Lowers to `tpu.dynamic_rotate`, as Pallas lowers `pltpu.roll`.
#[track_caller]
pub fn roll<T: Element>(x: Array<T>, shift: impl IntoArg<i32>, axis: isize) -> Array<T> {
    let loc = SourceLoc::caller();
    let shift = shift.into_arg();
    Array::from_val(emit(loc, |t| {
        storage_only("roll", T::DTYPE)?;
        // libtpu 0.0.51 on v5e, v6e, tpu7x: "Not implemented: changeBitwidth when src bitwidth and dst
        // bitwidth differs too much" for a rotated i1 vector (concatenated ones compile).
        if T::DTYPE == DType::Bool {
            return Err(kerr!(
                DType,
                "`roll` of a bool array does not compile for TPU (libtpu cannot rotate i1 vectors); roll the values the mask is computed from, or roll `mask.cast::<i32>()` and compare with 0"
            ));
        }
        let shape = match t.ty(x.v)? {
            Type::Vector(s, _) => s.clone(),
            other => return Err(kerr!(Shape, "`roll` needs an array, got {other}")),
        };
        let rank = shape.len();
        let dim = normalize_axis(axis, rank)?;
        if dim + 2 < rank {
            return Err(kerr!(
                Shape,
                "`roll` rotates along the last two axes (lanes or sublanes) of a rank-{rank} array, got axis {axis}"
            ));
        }
        if let Arg::Lit(l) = shift {
            let s = l.as_i64();
            if s < 0 {
                let n = shape[dim] as i64;
                return Err(kerr!(
                    Shape,
                    "`roll` shift must be non-negative (as `pltpu.roll`), got {s}; rolling by {} is the same along an axis of {n}",
                    s.rem_euclid(n)
                ));
            }
        }
        let id = t.check(x.v)?;
        let s = t.materialize(shift, &Type::Scalar(DType::I32), loc)?;
        Ok(t.push1(
            OpKind::Roll { dim },
            vec![id, s],
            Type::Vector(shape, T::DTYPE),
            loc,
        ))
    }))
}

impl Array<f32> {
    /// The index of the first maximum over `axis` (`jnp.argmax`; negative counts from the end), that
    /// dimension dropped: `i32` indices. A NaN is the maximum (the first NaN's index, as jnp). Lowers to
    /// `tpu.reduce_index`, as Pallas lowers `jnp.argmax`.
    #[track_caller]
    pub fn argmax(self, axis: isize) -> Array<i32> {
        Array::from_val(arg_reduce(self.v, ArgKind::Max, axis, SourceLoc::caller()))
    }
    /// The index of the first minimum over `axis` (`jnp.argmin`), as [`Array::argmax`].
    #[track_caller]
    pub fn argmin(self, axis: isize) -> Array<i32> {
        Array::from_val(arg_reduce(self.v, ArgKind::Min, axis, SourceLoc::caller()))
    }
}

fn arg_reduce(x: Val, kind: ArgKind, axis: isize, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let shape = match t.ty(x)? {
            Type::Vector(s, _) => s.clone(),
            other => {
                return Err(kerr!(
                    Shape,
                    "`{}` needs an array, got {other}",
                    kind.name()
                ))
            }
        };
        let rank = shape.len();
        if rank < 2 {
            return Err(kerr!(
                Shape,
                "`{}` of a rank-{rank} array: Mosaic reduces indices of arrays of rank 2 or more; reshape to `[1, n]` first",
                kind.name()
            ));
        }
        let dim = normalize_axis(axis, rank)?;
        if dim + 2 < rank {
            return Err(kerr!(
                Shape,
                "`{}` reduces along the last two axes (lanes or sublanes) of a rank-{rank} array, got axis {axis}",
                kind.name()
            ));
        }
        let id = t.check(x)?;
        let mut out = shape;
        out.remove(dim);
        Ok(t.push1(
            OpKind::ArgReduce { kind, dim },
            vec![id],
            Type::Vector(out, DType::I32),
            loc,
        ))
    })
}

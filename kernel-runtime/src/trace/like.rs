//! `full_like` / `zeros_like` (`jnp.full_like`, `jnp.zeros_like`): arrays shaped like a value or a ref,
//! made of ops that exist already (a splat constant, or a broadcast of a traced fill value).

use super::array::{Array, IntoArg};
use super::refs::{Ref, RefMut};
use super::{emit, Arg, Val};
use crate::dtype::{Element, Literal};
use crate::error::{kerr, SourceLoc};
use crate::ir::Type;

/// What `full_like` / `zeros_like` take the shape and element type from: an `Array<T>` or a ref.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no shape to copy",
    label = "expected an Array<T>, a Ref<T> or a RefMut<T>",
    note = "`full_like(x, v)` and `zeros_like(x)` copy the shape and element type of a kernel value or ref; for a shape of your own use `full(shape, v)`"
)]
pub trait Like<T> {
    #[doc(hidden)]
    fn like_val(self) -> Val;
}
impl<T> Like<T> for Array<T> {
    fn like_val(self) -> Val {
        self.v
    }
}
impl<T> Like<T> for Ref<T> {
    fn like_val(self) -> Val {
        self.v
    }
}
impl<T> Like<T> for RefMut<T> {
    fn like_val(self) -> Val {
        self.v
    }
}

/// An array of `like`'s shape and element type filled with `value` (`jnp.full_like(x, v)`): a literal,
/// a traced `Scalar<T>`, or an `Array<T>` that broadcasts to the shape.
#[track_caller]
pub fn full_like<T: Element>(like: impl Like<T>, value: impl IntoArg<T>) -> Array<T> {
    fill::<T>(like.like_val(), value.into_arg(), SourceLoc::caller())
}

/// Zeros of `like`'s shape and element type (`jnp.zeros_like(x)`); see also `zeros()`, which takes its
/// shape from the ref it is stored into.
#[track_caller]
pub fn zeros_like<T: Element>(like: impl Like<T>) -> Array<T> {
    let zero = Arg::Lit(Literal::zero(T::DTYPE));
    fill::<T>(like.like_val(), zero, SourceLoc::caller())
}

fn fill<T: Element>(of: Val, value: Arg, loc: SourceLoc) -> Array<T> {
    Array::from_val(emit(loc, |t| {
        let shape = match t.ty(of)? {
            Type::Vector(s, _) | Type::Ref(s, _, _) => s.clone(),
            other => {
                return Err(kerr!(
                    Shape,
                    "`full_like` needs an array or a ref, got {other}"
                ))
            }
        };
        let id = t.materialize(value, &Type::Vector(shape, T::DTYPE), loc)?;
        Ok(t.val(id))
    }))
}

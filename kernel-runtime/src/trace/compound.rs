//! Compound assignment on refs (Pallas's `o_ref[...] += v`): `o += v` on a writable VMEM ref,
//! `o.at((ds(i, 8), ..)) += v` on a window of one, `count.at(0) += 1` on an SMEM element — each a load,
//! the op, and a store at the user's line (the same IR as `o.store(o.load() + v)`).
//!
//! - `o += v` is Rust's own `+=`: `RefMut` implements `AddAssign` & co. It needs a mutable binding,
//!   which the macro gives every `RefMut<..>` parameter (`#[allow(unused_mut)] mut o`), so a kernel
//!   writes `o: RefMut<f32>` as always. Inside a traced `if`/`for`/`while` the ref is a carried
//!   variable that passes through unchanged (`Carry for RefMut`).
//! - `o.at(..) += v` has no place on its left, which Rust refuses; the macro rewrites a compound
//!   assignment whose left side is not a place into `TraceCompoundAssign::<AddOp, _>::trace_compound_assign(o.at(..), v)`,
//!   taking the window by value.
//!
//! Misuse is a compile error at the user's tokens with the ref API's messages: a read-only `Ref` or
//! `View` (`Writable`), a whole SMEM or ANY ref (`VectorMemory`), an operand of another dtype
//! (`ArithRhs`), and a left side that is neither a place nor a window (`TraceCompoundAssign`'s own).

use super::array::{Array, Scalar};
use super::refs::{MemorySpace, Ref, RefMut, VectorMemory, View, ViewMut, Writable};
use crate::dtype::Element;
use crate::launch::{Any, Smem, Vmem};
use std::ops;

macro_rules! compound {
    ($Marker:ident, $Op:ident, $op:ident, $Assign:ident, $assign:ident) => {
        /// The operator of a compound assignment, as a type ([`TraceCompoundAssign`]'s `Op`).
        #[doc(hidden)]
        pub struct $Marker;
        impl<L: ops::$Op<R, Output = L>, R> CompoundOp<L, R> for $Marker {
            #[track_caller]
            fn apply(lhs: L, rhs: R) -> L {
                ops::$Op::$op(lhs, rhs)
            }
        }

        /// `o += v` on a whole VMEM ref: `o.store(o.load() + v)`.
        impl<T: Element, R> ops::$Assign<R> for RefMut<T, Vmem>
        where
            Array<T>: ops::$Op<R, Output = Array<T>>,
        {
            #[track_caller]
            fn $assign(&mut self, rhs: R) {
                self.store(ops::$Op::$op(self.load(), rhs))
            }
        }

        /// Not callable (the bound never holds): a whole SMEM ref holds scalars, index one element.
        impl<T: Element, R> ops::$Assign<R> for RefMut<T, Smem>
        where
            Self: VectorMemory,
        {
            fn $assign(&mut self, _: R) {}
        }

        /// Not callable (the bound never holds): an ANY ref is reached by DMA only.
        impl<T: Element, R> ops::$Assign<R> for RefMut<T, Any>
        where
            Self: VectorMemory,
        {
            fn $assign(&mut self, _: R) {}
        }

        /// Not callable (the bound never holds): inputs are read-only.
        impl<T: Element, S: MemorySpace, R> ops::$Assign<R> for Ref<T, S>
        where
            Self: Writable,
        {
            fn $assign(&mut self, _: R) {}
        }
    };
}
compound!(AddOp, Add, add, AddAssign, add_assign);
compound!(SubOp, Sub, sub, SubAssign, sub_assign);
compound!(MulOp, Mul, mul, MulAssign, mul_assign);
compound!(DivOp, Div, div, DivAssign, div_assign);
compound!(RemOp, Rem, rem, RemAssign, rem_assign);

/// `lhs op rhs` for the operator `Self` of a compound assignment.
#[doc(hidden)]
pub trait CompoundOp<L, R> {
    #[doc(hidden)]
    fn apply(lhs: L, rhs: R) -> L;
}

/// What the macro turns `w op= v` into when `w` is not a place (a window `o.at(..)`, which Rust
/// refuses as an assignee): `TraceCompoundAssign::<AddOp, _>::trace_compound_assign(w, v)`, the window
/// taken by value. (Written out, not generated, so that a wrong left side names no macro.)
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "cannot assign to `{Self}` with a compound operator (`+=`, `-=`, `*=`, `/=`, `%=`)",
    label = "not a variable, nor a window of a writable ref",
    note = "the left side of `+=` is a variable (`acc += v`, declared `let mut acc`), a writable ref (`o += v`) or a window of one (`o.at((ds(i, 8), ..)) += v`)"
)]
pub trait TraceCompoundAssign<Op, R> {
    #[doc(hidden)]
    fn trace_compound_assign(self, rhs: R);
}

/// `o.at((ds(i, 8), ..)) += v`: a VMEM window.
impl<T: Element, Op: CompoundOp<Array<T>, R>, R> TraceCompoundAssign<Op, R> for ViewMut<T, Vmem> {
    #[track_caller]
    fn trace_compound_assign(self, rhs: R) {
        self.store(Op::apply(self.load(), rhs))
    }
}

/// `count.at(0) += 1`: one SMEM element.
impl<T: Element, Op: CompoundOp<Scalar<T>, R>, R> TraceCompoundAssign<Op, R> for ViewMut<T, Smem> {
    #[track_caller]
    fn trace_compound_assign(self, rhs: R) {
        self.store(Op::apply(self.load(), rhs))
    }
}

/// Not callable (the bound never holds): an ANY window is reached by DMA only.
impl<T: Element, Op, R> TraceCompoundAssign<Op, R> for ViewMut<T, Any>
where
    Self: VectorMemory,
{
    fn trace_compound_assign(self, _: R) {}
}

/// Not callable (the bound never holds): inputs are read-only.
impl<T: Element, S: MemorySpace, Op, R> TraceCompoundAssign<Op, R> for View<T, S>
where
    Self: Writable,
{
    fn trace_compound_assign(self, _: R) {}
}

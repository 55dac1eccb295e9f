//! Free functions of the kernel language: grid queries, constructors, `dot`, `select`, elementwise helpers.

use super::array::{binary, IntoArg};
use super::{emit, with, Arg, Array, Scalar};
use crate::dtype::{DType, DotElement, Element, Float, Numeric};
use crate::error::{kerr, SourceLoc};
use crate::ir::{BinaryOp, OpKind, Type};

/// The index of the current grid step along `axis` (`pl.program_id`).
#[track_caller]
pub fn program_id(axis: usize) -> Scalar<i32> {
    Scalar::from_val(emit(SourceLoc::caller(), |t| match t.grid_args.get(axis) {
        Some(id) => Ok(t.val(*id)),
        None => Err(kerr!(
            Grid,
            "program_id({axis}) but the grid has {} axes ({:?})",
            t.grid.len(),
            t.grid
        )),
    }))
}

/// The grid size along `axis` (`pl.num_programs`); a compile-time value since grids are static.
#[track_caller]
pub fn num_programs(axis: usize) -> i32 {
    with(SourceLoc::caller(), |t| match t.grid.get(axis) {
        Some(n) => Ok(*n as i32),
        None => Err(kerr!(
            Grid,
            "num_programs({axis}) but the grid has {} axes ({:?})",
            t.grid.len(),
            t.grid
        )),
    })
    .unwrap_or(1)
}

/// A value to broadcast into whatever it is stored to: `acc.store(zeros())`.
#[derive(Clone, Copy, Debug)]
pub struct Fill(pub(crate) f64);

/// Zeros shaped like the ref they are stored into (`jnp.zeros_like(acc_ref)`).
pub fn zeros() -> Fill {
    Fill(0.0)
}

/// What [`full`] fills with: a literal `T`, or a traced `Scalar<T>` (`jnp.full(shape, x)` with a traced
/// `x`: a broadcast of the scalar, `vector.broadcast` in Mosaic).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot fill an array of element type `{T}`",
    label = "expected a `{T}` literal or a `Scalar<{T}>`",
    note = "cast a scalar of another element type first, e.g. `s.cast::<{T}>()`; to broadcast an array use `full_like`"
)]
pub trait FillValue<T> {
    #[doc(hidden)]
    fn fill_arg(self) -> Arg;
}
impl<T: Element> FillValue<T> for T {
    fn fill_arg(self) -> Arg {
        Arg::Lit(self.literal())
    }
}
impl<T> FillValue<T> for Scalar<T> {
    fn fill_arg(self) -> Arg {
        Arg::Val(self.v)
    }
}

/// An array of `shape` filled with `value`: a literal (a splat constant) or a traced `Scalar<T>` (a
/// broadcast of it).
#[track_caller]
pub fn full<T: Element>(shape: impl AsRef<[usize]>, value: impl FillValue<T>) -> Array<T> {
    let loc = SourceLoc::caller();
    let shape = shape.as_ref().to_vec();
    let value = value.fill_arg();
    Array::from_val(emit(loc, |t| {
        if shape.is_empty() || shape.contains(&0) {
            return Err(kerr!(
                Shape,
                "`full` needs a non-empty shape without zero dimensions, got {shape:?}"
            ));
        }
        let id = t.materialize(value, &Type::Vector(shape, T::DTYPE), loc)?;
        Ok(t.val(id))
    }))
}

/// A traced scalar constant, e.g. the initial value of a `while` loop counter: `let mut n = scalar(0);`.
#[track_caller]
pub fn scalar<T: Element>(value: T) -> Scalar<T> {
    let loc = SourceLoc::caller();
    Scalar::from_val(emit(loc, |t| {
        Ok(t.push1(
            OpKind::Const(value.literal()),
            vec![],
            Type::Scalar(T::DTYPE),
            loc,
        ))
    }))
}

/// `broadcasted_iota`: an integer array whose values count along `dim`.
#[track_caller]
pub fn iota<T: Numeric>(shape: impl AsRef<[usize]>, dim: usize) -> Array<T> {
    let loc = SourceLoc::caller();
    let shape = shape.as_ref().to_vec();
    Array::from_val(emit(loc, |t| {
        if T::DTYPE != DType::I32 {
            return Err(kerr!(
                DType,
                "iota produces i32 values on TPU; write `iota::<i32>(..)` and cast"
            ));
        }
        if dim >= shape.len() {
            return Err(kerr!(
                Shape,
                "iota dimension {dim} is out of range for shape {shape:?}"
            ));
        }
        Ok(t.push1(
            OpKind::Iota { dim },
            vec![],
            Type::Vector(shape, T::DTYPE),
            loc,
        ))
    }))
}

fn dot_impl<T: DotElement>(
    a: Array<T>,
    b: Array<T>,
    tl: bool,
    tr: bool,
    loc: SourceLoc,
) -> Array<T::Acc> {
    Array::from_val(emit(loc, |t| {
        let (sa, sb) = (t.ty(a.v)?.shape().to_vec(), t.ty(b.v)?.shape().to_vec());
        if sa.len() != 2 || sb.len() != 2 {
            return Err(kerr!(
                Shape,
                "dot multiplies 2-D blocks, got shapes {sa:?} and {sb:?}"
            ));
        }
        let (m, ka) = if tl { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
        let (kb, n) = if tr { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
        if ka != kb {
            return Err(kerr!(
                Shape,
                "dot contraction dimensions differ: lhs {sa:?}{} contracts {ka}, rhs {sb:?}{} contracts {kb}",
                if tl { " (transposed)" } else { "" },
                if tr { " (transposed)" } else { "" }
            ));
        }
        let ids = vec![t.check(a.v)?, t.check(b.v)?];
        let ty = Type::Vector(vec![m, n], <T::Acc as Element>::DTYPE);
        Ok(t.push1(
            OpKind::Dot {
                transpose_lhs: tl,
                transpose_rhs: tr,
            },
            ids,
            ty,
            loc,
        ))
    }))
}

/// Matrix product `a @ b` on the MXU, accumulating in f32 (i32 for i8): `jnp.dot(.., preferred_element_type=f32)`.
#[track_caller]
pub fn dot<T: DotElement>(a: Array<T>, b: Array<T>) -> Array<T::Acc> {
    dot_impl(a, b, false, false, SourceLoc::caller())
}

/// `a @ b.T` without materializing the transpose.
#[track_caller]
pub fn dot_nt<T: DotElement>(a: Array<T>, b: Array<T>) -> Array<T::Acc> {
    dot_impl(a, b, false, true, SourceLoc::caller())
}

/// `a.T @ b` without materializing the transpose.
#[track_caller]
pub fn dot_tn<T: DotElement>(a: Array<T>, b: Array<T>) -> Array<T::Acc> {
    dot_impl(a, b, true, false, SourceLoc::caller())
}

/// A [`select`] condition: an `Array<bool>` chooses element by element; a traced `Scalar<bool>` chooses
/// one branch for the whole array (`jnp.where(pred, a, b)` with a scalar `pred`: `arith.select` on the
/// `i1` itself, as Pallas lowers it).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `select` condition",
    label = "expected an `Array<bool>` or a `Scalar<bool>`",
    note = "a condition is a comparison of kernel values, e.g. `x > 0.0` or `program_id(0) == 0`; a Rust `bool` is decided at trace time: use `if`"
)]
pub trait SelectCond {
    #[doc(hidden)]
    fn cond_val(self) -> super::Val;
}
impl SelectCond for Array<bool> {
    fn cond_val(self) -> super::Val {
        self.v
    }
}
impl SelectCond for Scalar<bool> {
    fn cond_val(self) -> super::Val {
        self.v
    }
}

/// `cond ? on_true : on_false` (`jnp.where`): elementwise for an `Array<bool>` condition, one choice for a
/// `Scalar<bool>`; scalars and literals broadcast.
#[track_caller]
pub fn select<T: Element>(
    cond: impl SelectCond,
    on_true: impl IntoArg<T>,
    on_false: impl IntoArg<T>,
) -> Array<T> {
    Array::from_val(select_args::<T>(
        cond.cond_val(),
        on_true.into_arg(),
        on_false.into_arg(),
        SourceLoc::caller(),
    ))
}

/// [`select`] on traced arguments (also the trace-time compositions' select).
pub(crate) fn select_args<T: Element>(
    cond: super::Val,
    a: Arg,
    b: Arg,
    loc: SourceLoc,
) -> super::Val {
    emit(loc, |t| {
        // (libtpu's verdict on a select of 8-bit floats is unmeasured: refused until it is.)
        super::array::storage_only("select", T::DTYPE)?;
        let ct = t.ty(cond)?.clone();
        let shape = super::broadcast_shapes(ct.shape(), t.arg_type(a)?.shape())?;
        let shape = super::broadcast_shapes(&shape, t.arg_type(b)?.shape())?;
        if shape.is_empty() {
            return Err(kerr!(
                Shape,
                "`select` makes an array: with a `Scalar<bool>` condition at least one branch must be an array (for scalars use `if`)"
            ));
        }
        for arg in [a, b] {
            if let Arg::Val(v) = arg {
                let d = t.ty(v)?.dtype();
                if d != T::DTYPE {
                    return Err(kerr!(
                        DType,
                        "select branches must both be {}, got {d}",
                        T::DTYPE
                    ));
                }
            }
        }
        // A scalar condition stays a scalar: `arith.select %i1, %a, %b`, as Pallas emits `jnp.where`
        // with a scalar predicate (no broadcast of the i1).
        let c = if matches!(ct, Type::Scalar(_)) {
            if ct.dtype() != DType::Bool {
                return Err(kerr!(
                    DType,
                    "a select condition must be bool, got {}",
                    ct.dtype()
                ));
            }
            t.check(cond)?
        } else {
            t.materialize(
                Arg::Val(cond),
                &Type::Vector(shape.clone(), DType::Bool),
                loc,
            )?
        };
        let x = t.materialize(a, &Type::Vector(shape.clone(), T::DTYPE), loc)?;
        let y = t.materialize(b, &Type::Vector(shape.clone(), T::DTYPE), loc)?;
        Ok(t.push1(
            OpKind::Select,
            vec![c, x, y],
            Type::Vector(shape, T::DTYPE),
            loc,
        ))
    })
}

/// `jnp.where`: an alias of [`select`].
#[track_caller]
pub fn where_<T: Element>(
    cond: impl SelectCond,
    on_true: impl IntoArg<T>,
    on_false: impl IntoArg<T>,
) -> Array<T> {
    select(cond, on_true, on_false)
}

/// Elementwise maximum (NaN-propagating for floats, like `jnp.maximum`).
#[track_caller]
pub fn maximum<T: Numeric>(a: Array<T>, b: impl IntoArg<T>) -> Array<T> {
    Array::from_val(binary(
        BinaryOp::Max,
        a.v.into(),
        b.into_arg(),
        SourceLoc::caller(),
    ))
}

/// Elementwise minimum (NaN-propagating for floats, like `jnp.minimum`).
#[track_caller]
pub fn minimum<T: Numeric>(a: Array<T>, b: impl IntoArg<T>) -> Array<T> {
    Array::from_val(binary(
        BinaryOp::Min,
        a.v.into(),
        b.into_arg(),
        SourceLoc::caller(),
    ))
}

/// Elementwise `a ** b` for floats.
#[track_caller]
pub fn pow<T: Float>(a: Array<T>, b: impl IntoArg<T>) -> Array<T> {
    Array::from_val(binary(
        BinaryOp::Pow,
        a.v.into(),
        b.into_arg(),
        SourceLoc::caller(),
    ))
}

/// Tell the compiler an `i32` index is a multiple of `m` (`pl.multiple_of`), e.g. for aligned dynamic slices.
#[track_caller]
pub fn multiple_of(x: Scalar<i32>, m: u32) -> Scalar<i32> {
    let loc = SourceLoc::caller();
    Scalar::from_val(emit(loc, |t| {
        if m == 0 {
            return Err(kerr!(
                Shape,
                "multiple_of(.., 0): the multiple must be positive"
            ));
        }
        let id = t.check(x.v)?;
        Ok(t.push1(
            OpKind::MultipleOf(m),
            vec![id],
            Type::Scalar(DType::I32),
            loc,
        ))
    }))
}

/// A free function per traced unary method of the op table (`exp(x)` = `x.exp()`, as `jnp.exp`),
/// generated from the table; the prelude has them all.
pub mod unary {
    use crate::dtype::{Float, Signed};
    use crate::trace::Array;

    macro_rules! free_unary {
    ($( ($V:ident, $name:literal, $method:tt, $ops:ident, [$($doc:literal),*]) )*) => {
        $( free_unary!(@one $method, $ops); )*
    };
    (@one -, $ops:ident) => {};
    (@one $name:ident, Float) => { free_unary!(@fn $name, Float); };
    (@one $name:ident, Signed) => { free_unary!(@fn $name, Signed); };
    (@fn $name:ident, $bound:ident) => {
        #[doc = concat!("Elementwise `", stringify!($name), "` (same as the method `x.", stringify!($name), "()`).")]
        #[track_caller]
        pub fn $name<T: $bound>(x: Array<T>) -> Array<T> {
            x.$name()
        }
    };
    }
    crate::ir::for_each_unary!(free_unary);
}

/// Open a named trace region (`with jax.named_scope(name):` in a Pallas kernel) until the returned
/// guard is dropped — at the end of the enclosing block: `let _scope = named_scope("softmax");`. On
/// TPU it is a region of the kernel's XProf trace (`tpu.trace_start` / `tpu.trace_stop`); elsewhere it
/// changes nothing. Regions nest. `name` is plain text: letters, digits and `_-./: `. (Bind the guard
/// to a name: `let _ = ..` would close the region at once.)
#[track_caller]
#[must_use = "the region closes when this guard is dropped: bind it, `let _scope = named_scope(..);`"]
pub fn named_scope(name: &str) -> NamedScope {
    let loc = SourceLoc::caller();
    with(loc, |t| {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./: ".contains(c));
        if !ok {
            return Err(kerr!(
                Trace,
                "trace region name {name:?}: use a non-empty name of letters, digits and `_-./: `"
            ));
        }
        t.push(
            OpKind::TraceStart(name.to_string()),
            vec![],
            vec![],
            vec![],
            loc,
        );
        Ok(())
    });
    NamedScope { loc }
}

/// An open trace region (see [`named_scope`]); dropping it closes the region.
#[derive(Debug)]
pub struct NamedScope {
    loc: SourceLoc,
}

impl Drop for NamedScope {
    fn drop(&mut self) {
        let loc = self.loc;
        with(loc, |t| {
            t.push(OpKind::TraceStop, vec![], vec![], vec![], loc);
            Ok(())
        });
    }
}

/// Panics inside the library: lets tests show that a bug in tpu-kernel is reported as an internal error
/// at the panic's place, not blamed on the kernel body. Not for kernels.
#[doc(hidden)]
pub fn __library_panic_for_tests() {
    panic!("a deliberate library panic (test hook)");
}

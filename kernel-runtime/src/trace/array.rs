//! Traced values: [`Array`] (a vector block value) and [`Scalar`] (an `i32` index, a condition, ...), with
//! operator overloading and the elementwise, reduction and shape methods.

use super::{emit, join_types, Arg, Tracer, Val};
use crate::dtype::{DType, Element, Float, Integer, Literal, Numeric, Signed};
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{BinaryOp, CmpOp, CompositeOp, OpKind, ReduceKind, Type, UnaryOp};
use half::bf16;
use std::marker::PhantomData;
use std::ops;

/// A traced vector value with element type `T` (shape known at trace time).
pub struct Array<T> {
    pub(crate) v: Val,
    _t: PhantomData<T>,
}

/// A traced scalar value (grid index, loop counter, condition, ...).
pub struct Scalar<T> {
    pub(crate) v: Val,
    _t: PhantomData<T>,
}

macro_rules! handle_impls {
    ($H:ident) => {
        impl<T> Clone for $H<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $H<T> {}
        impl<T> std::fmt::Debug for $H<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:?})", stringify!($H), self.v)
            }
        }
        impl<T> $H<T> {
            #[doc(hidden)]
            pub fn from_val(v: Val) -> Self {
                $H { v, _t: PhantomData }
            }
            #[doc(hidden)]
            pub fn val(self) -> Val {
                self.v
            }
        }
    };
}
handle_impls!(Array);
handle_impls!(Scalar);

// ---------------------------------------------------------------------------------------------- emission

fn check_dtype_op(name: &str, operands: crate::ir::Operands, d: DType) -> Result<()> {
    use crate::ir::Accepts;
    storage_only(name, d)?;
    if operands.accepts(d) {
        Ok(())
    } else {
        Err(kerr!(DType, "`{name}` is not defined for {d} values"))
    }
}

/// The dtype table's `Storage` dtypes take no elementwise op: an error naming the op and the dtype.
pub(crate) fn storage_only(name: &str, d: DType) -> Result<()> {
    if d.ops() == crate::dtype::DTypeOps::Storage {
        return Err(kerr!(
            DType,
            "`{name}` is not defined for {d} values: {d} is a storage dtype (loads, stores, casts and `dot`); cast to f32 or bf16 first, e.g. `.cast::<f32>()`"
        ));
    }
    Ok(())
}

pub(crate) fn binary(op: BinaryOp, a: Arg, b: Arg, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (ta, tb) = (t.arg_type(a)?, t.arg_type(b)?);
        let dtype = value_dtype(&ta, &tb, a, b)?;
        check_dtype_op(op.name(), op.operands(), dtype)?;
        let ty = join_types(&ta, &tb, dtype)?;
        let x = t.materialize(a, &ty, loc)?;
        let y = t.materialize(b, &ty, loc)?;
        Ok(t.push1(OpKind::Binary(op), vec![x, y], ty, loc))
    })
}

/// The dtype of an elementwise op: literals take the dtype of the traced side.
fn value_dtype(ta: &Type, tb: &Type, a: Arg, b: Arg) -> Result<DType> {
    match (a, b) {
        (Arg::Lit(_), Arg::Val(_)) => Ok(tb.dtype()),
        (Arg::Val(_), Arg::Lit(_)) => Ok(ta.dtype()),
        _ if ta.dtype() == tb.dtype() => Ok(ta.dtype()),
        _ => Err(kerr!(
            DType,
            "element types differ: {} vs {}; cast one side first, e.g. `.cast::<{}>()`",
            ta.dtype(),
            tb.dtype(),
            ta.dtype()
        )),
    }
}

pub(crate) fn compare(op: CmpOp, a: Arg, b: Arg, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (ta, tb) = (t.arg_type(a)?, t.arg_type(b)?);
        let dtype = value_dtype(&ta, &tb, a, b)?;
        storage_only("a comparison", dtype)?;
        let operand_ty = join_types(&ta, &tb, dtype)?;
        let x = t.materialize(a, &operand_ty, loc)?;
        let y = t.materialize(b, &operand_ty, loc)?;
        Ok(t.push1(
            OpKind::Compare(op),
            vec![x, y],
            operand_ty.with_dtype(DType::Bool),
            loc,
        ))
    })
}

pub(crate) fn unary(op: UnaryOp, a: Val, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let ty = t.ty(a)?.clone();
        let id = t.check(a)?;
        check_dtype_op(op.name(), op.operands(), ty.dtype())?;
        Ok(t.push1(OpKind::Unary(op), vec![id], ty, loc))
    })
}

pub(crate) fn composite(op: CompositeOp, a: Val, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let ty = t.ty(a)?.clone();
        let id = t.check(a)?;
        check_dtype_op(op.name(), op.operands(), ty.dtype())?;
        Ok(t.push1(OpKind::Composite(op), vec![id], ty, loc))
    })
}

pub(crate) fn cast(a: Val, to: DType, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let ty = t.ty(a)?.clone();
        let id = t.check(a)?;
        if ty.dtype() == to {
            return Ok(a);
        }
        Ok(t.push1(OpKind::Cast(to), vec![id], ty.with_dtype(to), loc))
    })
}

fn vector_type(t: &Tracer, a: Val, what: &str) -> Result<(Vec<usize>, DType)> {
    match t.ty(a)? {
        Type::Vector(s, d) => Ok((s.clone(), *d)),
        other => Err(kerr!(Shape, "{what} needs an array, got {other}")),
    }
}

pub(crate) fn normalize_axis(axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if axis >= r || axis < -r {
        return Err(kerr!(
            Shape,
            "axis {axis} is out of range for an array of rank {rank}"
        ));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

fn reduce(a: Val, kind: ReduceKind, axis: isize, keepdims: bool, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (shape, d) = vector_type(t, a, "a reduction")?;
        if d == DType::Bool {
            return Err(kerr!(DType, "cannot reduce bool values; cast to i32 first"));
        }
        storage_only("a reduction", d)?;
        let ax = normalize_axis(axis, shape.len())?;
        let mut out: Vec<usize> = shape.clone();
        if keepdims {
            out[ax] = 1;
        } else {
            out.remove(ax);
        }
        let ty = if out.is_empty() {
            Type::Scalar(d)
        } else {
            Type::Vector(out, d)
        };
        let id = t.check(a)?;
        Ok(t.push1(
            OpKind::Reduce {
                kind,
                axes: vec![ax],
                keepdims,
            },
            vec![id],
            ty,
            loc,
        ))
    })
}

// ---------------------------------------------------------------------------------------------- methods

impl<T: Element> Array<T> {
    /// The static shape of this value.
    #[track_caller]
    pub fn shape(self) -> Vec<usize> {
        super::with(SourceLoc::caller(), |t| Ok(t.ty(self.v)?.shape().to_vec())).unwrap_or_default()
    }
    pub fn dtype(self) -> DType {
        T::DTYPE
    }
    #[track_caller]
    pub fn rank(self) -> usize {
        self.shape().len()
    }
    /// Convert the element type (`bf16`↔`f32`, int↔float, widen/narrow ints, bool→int).
    #[track_caller]
    pub fn cast<U: Element>(self) -> Array<U> {
        Array::from_val(cast(self.v, U::DTYPE, SourceLoc::caller()))
    }
    /// Broadcast (numpy rules) to a larger shape.
    #[track_caller]
    pub fn broadcast_to(self, shape: impl AsRef<[usize]>) -> Array<T> {
        let loc = SourceLoc::caller();
        let shape = shape.as_ref().to_vec();
        Array::from_val(emit(loc, |t| {
            let id = t.check(self.v)?;
            t.materialize(self.v.into(), &Type::Vector(shape.clone(), T::DTYPE), loc)
                .map(|x| if x == id { self.v } else { t.val(x) })
        }))
    }
    /// Reshape to a shape with the same number of elements.
    #[track_caller]
    pub fn reshape(self, shape: impl AsRef<[usize]>) -> Array<T> {
        let loc = SourceLoc::caller();
        let shape = shape.as_ref().to_vec();
        Array::from_val(emit(loc, |t| {
            let (from, d) = vector_type(t, self.v, "reshape")?;
            let n0 = from.iter().product::<usize>(); // a traced value: checked when it was made
            let Some(n1) = crate::size::elements(&shape) else {
                return Err(kerr!(
                    Shape,
                    "cannot reshape {from:?} ({n0} elements) to {shape:?}: its element count overflows"
                ));
            };
            if n0 != n1 || shape.is_empty() {
                return Err(kerr!(
                    Shape,
                    "cannot reshape {from:?} ({n0} elements) to {shape:?} ({n1} elements)"
                ));
            }
            let id = t.check(self.v)?;
            Ok(t.push1(OpKind::Reshape, vec![id], Type::Vector(shape, d), loc))
        }))
    }
    /// Permute dimensions.
    #[track_caller]
    pub fn transpose(self, perm: impl AsRef<[usize]>) -> Array<T> {
        let loc = SourceLoc::caller();
        let perm = perm.as_ref().to_vec();
        Array::from_val(emit(loc, |t| {
            let (from, d) = vector_type(t, self.v, "transpose")?;
            let mut seen = vec![false; from.len()];
            if perm.len() != from.len()
                || perm
                    .iter()
                    .any(|&p| p >= from.len() || std::mem::replace(&mut seen[p], true))
            {
                return Err(kerr!(
                    Shape,
                    "{perm:?} is not a permutation of the {} dimensions of {from:?}",
                    from.len()
                ));
            }
            let shape = perm.iter().map(|&p| from[p]).collect();
            let id = t.check(self.v)?;
            Ok(t.push1(
                OpKind::Transpose { perm },
                vec![id],
                Type::Vector(shape, d),
                loc,
            ))
        }))
    }
    /// Swap the last two dimensions (`x.T` for a 2-D block).
    #[track_caller]
    pub fn t(self) -> Array<T> {
        let rank = self.rank();
        let mut perm: Vec<usize> = (0..rank).collect();
        if rank >= 2 {
            perm.swap(rank - 1, rank - 2);
        }
        self.transpose(perm)
    }
}

// The dtype bounds of the reductions and elementwise methods sit on the methods, not on the impl: then calling
// one on the wrong element type reports the bound's note ("cast first, e.g. `x.cast::<f32>()`") instead of a bare
// "the method exists but its trait bounds were not satisfied".
macro_rules! reductions {
    ($($name:ident, $keep:ident, $kind:ident, $doc:literal;)*) => {
        impl<T: Element> Array<T> {
            $(
                #[doc = concat!($doc, " over `axis` (negative counts from the end), dropping that dimension.")]
                #[track_caller]
                pub fn $name(self, axis: isize) -> Array<T> where T: Numeric {
                    Array::from_val(reduce(self.v, ReduceKind::$kind, axis, false, SourceLoc::caller()))
                }
                #[doc = concat!($doc, " over `axis`, keeping it with size 1.")]
                #[track_caller]
                pub fn $keep(self, axis: isize) -> Array<T> where T: Numeric {
                    Array::from_val(reduce(self.v, ReduceKind::$kind, axis, true, SourceLoc::caller()))
                }
            )*
        }
    };
}
reductions! {
    sum, sum_keepdims, Sum, "Sum";
    max, max_keepdims, Max, "Maximum";
    min, min_keepdims, Min, "Minimum";
}

impl<T: Float> Array<T> {
    /// Mean over `axis`, dropping it.
    #[track_caller]
    pub fn mean(self, axis: isize) -> Array<T> {
        let n = self.axis_len(axis);
        self.sum(axis) / Array::<T>::lit_f(n as f64)
    }
    /// Mean over `axis`, keeping it with size 1.
    #[track_caller]
    pub fn mean_keepdims(self, axis: isize) -> Array<T> {
        let n = self.axis_len(axis);
        self.sum_keepdims(axis) / Array::<T>::lit_f(n as f64)
    }
    #[track_caller]
    fn axis_len(self, axis: isize) -> usize {
        let shape = self.shape();
        normalize_axis(axis, shape.len())
            .map(|a| shape[a])
            .unwrap_or(1)
    }
    fn lit_f(v: f64) -> FloatLit<T> {
        FloatLit(Literal::from_f64(T::DTYPE, v), PhantomData)
    }
}

/// A float literal already converted to `T` (used by `mean`).
#[doc(hidden)]
pub struct FloatLit<T>(Literal, PhantomData<T>);

// The traced unary methods: one per row of the op table that has a method (`ir::ops`), bounded by
// its operand class.
macro_rules! unary_methods {
    ($( ($V:ident, $name:literal, $method:tt, $ops:ident, [$($doc:literal),*]) )*) => {
        $( unary_methods!(@one $V, $method, $ops, [$($doc),*]); )*
    };
    (@one $V:ident, -, $ops:ident, [$($doc:literal),*]) => {};
    (@one $V:ident, $method:ident, Float, [$($doc:literal),*]) => {
        unary_methods!(@impl $V, $method, Float, [$($doc),*]);
    };
    (@one $V:ident, $method:ident, Signed, [$($doc:literal),*]) => {
        unary_methods!(@impl $V, $method, Signed, [$($doc),*]);
    };
    (@impl $V:ident, $method:ident, $bound:ident, [$($doc:literal),*]) => {
        impl<T: Element> Array<T> {
            $(#[doc = $doc])*
            #[track_caller]
            pub fn $method(self) -> Array<T> where T: $bound {
                Array::from_val(unary(UnaryOp::$V, self.v, SourceLoc::caller()))
            }
        }
        impl<T: Element> Scalar<T> {
            $(#[doc = $doc])*
            #[track_caller]
            pub fn $method(self) -> Scalar<T> where T: $bound {
                Scalar::from_val(unary(UnaryOp::$V, self.v, SourceLoc::caller()))
            }
        }
    };
}
crate::ir::for_each_unary!(unary_methods);

// The traced composite methods: one per row of the composite table, bounded by its operand class; the
// op is expanded for the launch's target in `build()` (`crate::expand`).
macro_rules! composite_methods {
    ($( ($V:ident, $name:literal, $method:ident, $ops:ident, [$($doc:literal),*]) )*) => {
        $(
            impl<T: Element> Array<T> {
                $(#[doc = $doc])*
                #[track_caller]
                pub fn $method(self) -> Array<T> where T: $ops {
                    Array::from_val(composite(CompositeOp::$V, self.v, SourceLoc::caller()))
                }
            }
        )*
    };
}
crate::ir::for_each_composite!(composite_methods);

// Sugar: ops that are one table op or a fixed pair of them, as Pallas lowers them (`lax.clamp` as max
// then min, `x != x`).
impl<T: Element> Array<T> {
    /// Same as [`Array::logistic`].
    #[track_caller]
    pub fn sigmoid(self) -> Array<T>
    where
        T: Float,
    {
        self.logistic()
    }
    /// `min(max(x, lo), hi)` (`jnp.clip`, `lax.clamp`).
    #[track_caller]
    pub fn clamp(self, lo: impl IntoArg<T>, hi: impl IntoArg<T>) -> Array<T>
    where
        T: Numeric,
    {
        let loc = SourceLoc::caller();
        let low = binary(BinaryOp::Max, self.v.into(), lo.into_arg(), loc);
        Array::from_val(binary(BinaryOp::Min, low.into(), hi.into_arg(), loc))
    }
    /// Whether each element is NaN (`jnp.isnan`): `x != x`.
    #[track_caller]
    pub fn isnan(self) -> Array<bool>
    where
        T: Float,
    {
        Array::from_val(compare(
            CmpOp::Ne,
            self.v.into(),
            self.v.into(),
            SourceLoc::caller(),
        ))
    }
}

macro_rules! shift_op {
    ($Tr:ident, $m:ident, $op:ident, $doc:literal) => {
        #[doc = $doc]
        impl<T: Integer, R: IntoArg<T>> ops::$Tr<R> for Array<T> {
            type Output = Array<T>;
            #[track_caller]
            fn $m(self, r: R) -> Array<T> {
                Array::from_val(binary(
                    BinaryOp::$op,
                    self.v.into(),
                    r.into_arg(),
                    SourceLoc::caller(),
                ))
            }
        }
        #[doc = $doc]
        impl<T: Integer> ops::$Tr<Scalar<T>> for Scalar<T> {
            type Output = Scalar<T>;
            #[track_caller]
            fn $m(self, r: Scalar<T>) -> Scalar<T> {
                Scalar::from_val(binary(
                    BinaryOp::$op,
                    self.v.into(),
                    r.v.into(),
                    SourceLoc::caller(),
                ))
            }
        }
    };
}
shift_op!(
    Shl,
    shl,
    Shl,
    "`x << n` (a shift by the bit width or more gives 0, as XLA's `shift_left`)."
);
shift_op!(
    Shr,
    shr,
    Shr,
    "`x >> n`: arithmetic for signed, logical for unsigned element types, as XLA's `shift_right_*`."
);

impl<T: Numeric> Scalar<T> {
    /// The smaller of two scalars (`jnp.minimum`; NaN-propagating for floats) — in index maps too, e.g.
    /// to clamp a block index so that steps whose block is not needed fetch nothing new.
    #[track_caller]
    pub fn min(self, other: impl ScalarOperand<T>) -> Scalar<T> {
        Scalar::from_val(binary(
            BinaryOp::Min,
            self.v.into(),
            other.scalar_arg(),
            SourceLoc::caller(),
        ))
    }
    /// The larger of two scalars (`jnp.maximum`; NaN-propagating for floats).
    #[track_caller]
    pub fn max(self, other: impl ScalarOperand<T>) -> Scalar<T> {
        Scalar::from_val(binary(
            BinaryOp::Max,
            self.v.into(),
            other.scalar_arg(),
            SourceLoc::caller(),
        ))
    }
}

/// The other operand of [`Scalar::min`] / [`Scalar::max`]: a scalar or a Rust literal — not an array
/// (use `minimum`/`maximum` for arrays), so the result is a scalar.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the other operand of a scalar min/max",
    note = "pass a Scalar<{T}> or a literal; for arrays use `minimum(a, b)` / `maximum(a, b)`"
)]
pub trait ScalarOperand<T> {
    #[doc(hidden)]
    fn scalar_arg(self) -> Arg;
}
impl<T> ScalarOperand<T> for Scalar<T> {
    fn scalar_arg(self) -> Arg {
        Arg::Val(self.v)
    }
}
impl<T: Element> ScalarOperand<T> for T {
    #[track_caller]
    fn scalar_arg(self) -> Arg {
        self.into_arg()
    }
}
impl ScalarOperand<i32> for usize {
    #[track_caller]
    fn scalar_arg(self) -> Arg {
        self.into_arg()
    }
}

impl<T: Element> Scalar<T> {
    #[track_caller]
    pub fn cast<U: Element>(self) -> Scalar<U> {
        Scalar::from_val(cast(self.v, U::DTYPE, SourceLoc::caller()))
    }
    pub fn dtype(self) -> DType {
        T::DTYPE
    }
}

// ---------------------------------------------------------------------------------------------- operators

/// Anything usable as an elementwise operand of element type `T`: arrays, scalars and Rust literals.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a kernel value of element type `{T}`",
    note = "use an Array<{T}>, a Scalar<{T}> or a literal; cast other element types with `.cast::<{T}>()`"
)]
pub trait IntoArg<T> {
    #[doc(hidden)]
    fn into_arg(self) -> Arg;
}

impl<T> IntoArg<T> for Array<T> {
    fn into_arg(self) -> Arg {
        Arg::Val(self.v)
    }
}
impl<T> IntoArg<T> for Scalar<T> {
    fn into_arg(self) -> Arg {
        Arg::Val(self.v)
    }
}
impl<T: Element> IntoArg<T> for T {
    fn into_arg(self) -> Arg {
        Arg::Lit(self.literal())
    }
}
impl IntoArg<bf16> for f32 {
    fn into_arg(self) -> Arg {
        Arg::Lit(Literal::from_f64(DType::BF16, self as f64))
    }
}
impl IntoArg<i32> for usize {
    #[track_caller]
    fn into_arg(self) -> Arg {
        super::i32_arg(self as i128, SourceLoc::caller())
    }
}

/// The right-hand side of an arithmetic operator (`+ - * / %`) whose left side is an `Array<T>`: an `Array<T>`, a
/// `Scalar<T>`, a literal `T` (an `f32` literal for bf16). Exactly the operands `Array<T>` accepted before this
/// trait; it only exists so that a wrong operand gets the message below (and `bool` the [`Numeric`] note).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an operand of arithmetic on `Array<{T}>`",
    label = "expected an `Array<{T}>`, a `Scalar<{T}>` or a literal",
    note = "both operands need the same element type; cast the other operand first, e.g. `y.cast::<{T}>()`"
)]
pub trait ArithRhs<T> {
    #[doc(hidden)]
    fn rhs_arg(self) -> Arg;
}
impl<T: Numeric> ArithRhs<T> for Array<T> {
    fn rhs_arg(self) -> Arg {
        Arg::Val(self.v)
    }
}
impl<T: Numeric> ArithRhs<T> for Scalar<T> {
    fn rhs_arg(self) -> Arg {
        Arg::Val(self.v)
    }
}
impl<T: Numeric> ArithRhs<T> for T {
    fn rhs_arg(self) -> Arg {
        Arg::Lit(self.literal())
    }
}
/// `Array<bf16> * 2.0`.
impl ArithRhs<bf16> for f32 {
    fn rhs_arg(self) -> Arg {
        IntoArg::<bf16>::into_arg(self)
    }
}
/// `mean`'s divisor.
impl<T: Numeric> ArithRhs<T> for FloatLit<T> {
    fn rhs_arg(self) -> Arg {
        Arg::Lit(self.0)
    }
}

/// A literal right-hand side of an arithmetic operator on a `Scalar<T>`: a literal `T`, a `usize`
/// compile-time value for `i32` (a block size), an `f32` literal for bf16. (Arrays take no usize
/// operand: a second integer impl would make `(a % 3).cast::<f32>()` ambiguous.) Implemented for
/// each element type of the dtype table.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an operand of arithmetic on `Scalar<{T}>`",
    label = "expected an `Array<{T}>`, a `Scalar<{T}>` or a literal",
    note = "both operands need the same element type; cast the other operand first, e.g. `y.cast::<{T}>()`"
)]
pub trait ScalarLit<T> {
    #[doc(hidden)]
    fn lit_arg(self) -> Arg;
}
macro_rules! scalar_lits {
    ($( ($V:ident, $name:literal, $rust:ty, $($rest:tt)*) )*) => {$(
        impl ScalarLit<$rust> for $rust {
            fn lit_arg(self) -> Arg {
                Arg::Lit(self.literal())
            }
        }
    )*};
}
crate::dtype::for_each_dtype!(scalar_lits);
impl ScalarLit<i32> for usize {
    #[track_caller]
    fn lit_arg(self) -> Arg {
        IntoArg::<i32>::into_arg(self)
    }
}
impl ScalarLit<bf16> for f32 {
    fn lit_arg(self) -> Arg {
        IntoArg::<bf16>::into_arg(self)
    }
}

macro_rules! arith_op {
    ($Tr:ident, $m:ident, $ATr:ident, $am:ident, $op:ident, $bound:ident) => {
        // A single impl for `Array<T> op rhs` (the accepted right-hand sides are the impls of `ArithRhs`), so that
        // rustc explains a wrong operand with the `ArithRhs`/`Numeric` notes instead of a bare "cannot add".
        impl<T, R: ArithRhs<T>> ops::$Tr<R> for Array<T> {
            type Output = Array<T>;
            #[track_caller]
            fn $m(self, r: R) -> Array<T> {
                Array::from_val(binary(BinaryOp::$op, self.v.into(), r.rhs_arg(), SourceLoc::caller()))
            }
        }
        impl<T: $bound> ops::$Tr<Array<T>> for Scalar<T> {
            type Output = Array<T>;
            #[track_caller]
            fn $m(self, r: Array<T>) -> Array<T> {
                Array::from_val(binary(BinaryOp::$op, self.v.into(), r.v.into(), SourceLoc::caller()))
            }
        }
        impl<T: $bound> ops::$Tr<Scalar<T>> for Scalar<T> {
            type Output = Scalar<T>;
            #[track_caller]
            fn $m(self, r: Scalar<T>) -> Scalar<T> {
                Scalar::from_val(binary(BinaryOp::$op, self.v.into(), r.v.into(), SourceLoc::caller()))
            }
        }
        arith_op!(@lit $Tr, $m, $op; f32, bf16, i32, i8, u8, u32);
        arith_op!(@rev $Tr, $m, $op, $bound; f32, bf16, i32, i8, u8, u32);
        impl<T, R> ops::$ATr<R> for Array<T>
        where
            Array<T>: ops::$Tr<R, Output = Array<T>>,
        {
            #[track_caller]
            fn $am(&mut self, r: R) {
                *self = ops::$Tr::$m(*self, r);
            }
        }
        impl<T, R> ops::$ATr<R> for Scalar<T>
        where
            Scalar<T>: ops::$Tr<R, Output = Scalar<T>>,
        {
            #[track_caller]
            fn $am(&mut self, r: R) {
                *self = ops::$Tr::$m(*self, r);
            }
        }
    };
    // One impl per element type for every literal right-hand side (the impls of `ScalarLit`), so an
    // integer literal next to a `Scalar<i32>` stays an `{integer}` that falls back to i32 — an impl
    // each for `i32` and `usize` would leave `(i * hb - 1).max(0)` ambiguous (E0282). Per element type,
    // not over `T`: a downstream crate could implement `ScalarLit<Its>` for `Array<Its>`, which would
    // overlap the `Array<T>` operand impl.
    (@lit $Tr:ident, $m:ident, $op:ident; $($t:ty),*) => {$(
        impl<L: ScalarLit<$t>> ops::$Tr<L> for Scalar<$t> {
            type Output = Scalar<$t>;
            #[track_caller]
            fn $m(self, r: L) -> Scalar<$t> {
                Scalar::from_val(binary(BinaryOp::$op, self.v.into(), r.lit_arg(), SourceLoc::caller()))
            }
        }
    )*};
    // `2.0 * x`
    (@rev $Tr:ident, $m:ident, $op:ident, $bound:ident; $($t:ty),*) => {$(
        impl ops::$Tr<Array<$t>> for $t {
            type Output = Array<$t>;
            #[track_caller]
            fn $m(self, r: Array<$t>) -> Array<$t> {
                Array::from_val(binary(BinaryOp::$op, Arg::Lit(self.literal()), r.v.into(), SourceLoc::caller()))
            }
        }
        impl ops::$Tr<Scalar<$t>> for $t {
            type Output = Scalar<$t>;
            #[track_caller]
            fn $m(self, r: Scalar<$t>) -> Scalar<$t> {
                Scalar::from_val(binary(BinaryOp::$op, Arg::Lit(self.literal()), r.v.into(), SourceLoc::caller()))
            }
        }
    )*};
}
arith_op!(Add, add, AddAssign, add_assign, Add, Numeric);
arith_op!(Sub, sub, SubAssign, sub_assign, Sub, Numeric);
arith_op!(Mul, mul, MulAssign, mul_assign, Mul, Numeric);
arith_op!(Div, div, DivAssign, div_assign, Div, Numeric);
arith_op!(Rem, rem, RemAssign, rem_assign, Rem, Numeric);

macro_rules! bit_op {
    ($Tr:ident, $m:ident, $op:ident) => {
        impl<T: Element, R: IntoArg<T>> ops::$Tr<R> for Array<T> {
            type Output = Array<T>;
            #[track_caller]
            fn $m(self, r: R) -> Array<T> {
                Array::from_val(binary(
                    BinaryOp::$op,
                    self.v.into(),
                    r.into_arg(),
                    SourceLoc::caller(),
                ))
            }
        }
        impl<T: Element> ops::$Tr<Scalar<T>> for Scalar<T> {
            type Output = Scalar<T>;
            #[track_caller]
            fn $m(self, r: Scalar<T>) -> Scalar<T> {
                Scalar::from_val(binary(
                    BinaryOp::$op,
                    self.v.into(),
                    r.v.into(),
                    SourceLoc::caller(),
                ))
            }
        }
    };
}
bit_op!(BitAnd, bitand, And);
bit_op!(BitOr, bitor, Or);
bit_op!(BitXor, bitxor, Xor);

impl<T: Signed> ops::Neg for Array<T> {
    type Output = Array<T>;
    #[track_caller]
    fn neg(self) -> Array<T> {
        Array::from_val(unary(UnaryOp::Neg, self.v, SourceLoc::caller()))
    }
}
impl<T: Signed> ops::Neg for Scalar<T> {
    type Output = Scalar<T>;
    #[track_caller]
    fn neg(self) -> Scalar<T> {
        Scalar::from_val(unary(UnaryOp::Neg, self.v, SourceLoc::caller()))
    }
}
impl ops::Not for Array<bool> {
    type Output = Array<bool>;
    #[track_caller]
    fn not(self) -> Array<bool> {
        Array::from_val(unary(UnaryOp::Not, self.v, SourceLoc::caller()))
    }
}
impl ops::Not for Scalar<bool> {
    type Output = Scalar<bool>;
    #[track_caller]
    fn not(self) -> Scalar<bool> {
        Scalar::from_val(unary(UnaryOp::Not, self.v, SourceLoc::caller()))
    }
}

/// Marker so integer-only APIs can name the bound.
#[doc(hidden)]
pub fn _assert_integer<T: Integer>() {}

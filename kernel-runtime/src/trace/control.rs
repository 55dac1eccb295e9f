//! What the `#[tpu_kernel]` macro routes through the runtime: comparisons, `&&`/`||`, and `if`/`for`/`while`
//! (→ `scf.if` / `scf.for` / `scf.while`, with variables assigned inside becoming carried values).
//! On plain Rust values (compile-time) everything behaves like ordinary Rust.

use super::array::{compare, Array, IntoArg, Scalar};
use super::{with, Arg, Val};
use crate::dtype::{DType, Element, Numeric};
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{BinaryOp, CmpOp, OpKind, Type};

// ---------------------------------------------------------------------------------------------- comparisons

/// `==` / `!=` in kernels: traced values give `Scalar<bool>`/`Array<bool>`, Rust values give `bool`.
#[diagnostic::on_unimplemented(
    message = "cannot compare `{Self}` with `{Rhs}` in a kernel",
    note = "both sides must have the same element type; cast with `.cast::<T>()`"
)]
pub trait TraceEq<Rhs = Self> {
    type Output;
    fn trace_eq(self, rhs: Rhs) -> Self::Output;
    fn trace_ne(self, rhs: Rhs) -> Self::Output;
}

/// `< <= > >=` in kernels.
#[diagnostic::on_unimplemented(
    message = "cannot order `{Self}` and `{Rhs}` in a kernel",
    note = "both sides must have the same element type; cast with `.cast::<T>()`"
)]
pub trait TraceOrd<Rhs = Self> {
    type Output;
    fn trace_lt(self, rhs: Rhs) -> Self::Output;
    fn trace_le(self, rhs: Rhs) -> Self::Output;
    fn trace_gt(self, rhs: Rhs) -> Self::Output;
    fn trace_ge(self, rhs: Rhs) -> Self::Output;
}

impl<T: PartialEq> TraceEq<T> for T {
    type Output = bool;
    fn trace_eq(self, rhs: T) -> bool {
        self == rhs
    }
    fn trace_ne(self, rhs: T) -> bool {
        self != rhs
    }
}
impl<T: PartialOrd> TraceOrd<T> for T {
    type Output = bool;
    fn trace_lt(self, rhs: T) -> bool {
        self < rhs
    }
    fn trace_le(self, rhs: T) -> bool {
        self <= rhs
    }
    fn trace_gt(self, rhs: T) -> bool {
        self > rhs
    }
    fn trace_ge(self, rhs: T) -> bool {
        self >= rhs
    }
}

macro_rules! traced_cmp {
    ($L:ident, $R:ty, $Out:ident, [$($g:tt)*], $E:ty) => {
        impl<$($g)*> TraceEq<$R> for $L<$E> {
            type Output = $Out<bool>;
            #[track_caller]
            fn trace_eq(self, rhs: $R) -> $Out<bool> {
                $Out::from_val(compare(CmpOp::Eq, self.v.into(), IntoArg::<$E>::into_arg(rhs), SourceLoc::caller()))
            }
            #[track_caller]
            fn trace_ne(self, rhs: $R) -> $Out<bool> {
                $Out::from_val(compare(CmpOp::Ne, self.v.into(), IntoArg::<$E>::into_arg(rhs), SourceLoc::caller()))
            }
        }
        impl<$($g)*> TraceOrd<$R> for $L<$E> {
            type Output = $Out<bool>;
            #[track_caller]
            fn trace_lt(self, rhs: $R) -> $Out<bool> {
                $Out::from_val(compare(CmpOp::Lt, self.v.into(), IntoArg::<$E>::into_arg(rhs), SourceLoc::caller()))
            }
            #[track_caller]
            fn trace_le(self, rhs: $R) -> $Out<bool> {
                $Out::from_val(compare(CmpOp::Le, self.v.into(), IntoArg::<$E>::into_arg(rhs), SourceLoc::caller()))
            }
            #[track_caller]
            fn trace_gt(self, rhs: $R) -> $Out<bool> {
                $Out::from_val(compare(CmpOp::Gt, self.v.into(), IntoArg::<$E>::into_arg(rhs), SourceLoc::caller()))
            }
            #[track_caller]
            fn trace_ge(self, rhs: $R) -> $Out<bool> {
                $Out::from_val(compare(CmpOp::Ge, self.v.into(), IntoArg::<$E>::into_arg(rhs), SourceLoc::caller()))
            }
        }
    };
}
traced_cmp!(Array, Array<T>, Array, [T: Numeric], T);
traced_cmp!(Array, Scalar<T>, Array, [T: Numeric], T);
traced_cmp!(Array, T, Array, [T: Numeric], T);
traced_cmp!(Scalar, Scalar<T>, Scalar, [T: Numeric], T);
traced_cmp!(Scalar, T, Scalar, [T: Numeric], T);
traced_cmp!(Scalar, Array<T>, Array, [T: Numeric], T);
traced_cmp!(Scalar, usize, Scalar, [], i32);
traced_cmp!(Array, f32, Array, [], half::bf16);

/// `&&` / `||` in kernels (both sides are evaluated; on traced values they become `arith.andi`/`ori`).
#[diagnostic::on_unimplemented(
    message = "`&&`/`||` need two bools, two `Scalar<bool>` or two `Array<bool>`, got `{Self}` and `{Rhs}`",
    note = "make each side a condition, e.g. `program_id(0) == 0 && program_id(1) == 0`"
)]
pub trait TraceLogic<Rhs = Self> {
    type Output;
    fn trace_and(self, rhs: Rhs) -> Self::Output;
    fn trace_or(self, rhs: Rhs) -> Self::Output;
}
impl TraceLogic for bool {
    type Output = bool;
    fn trace_and(self, rhs: bool) -> bool {
        self && rhs
    }
    fn trace_or(self, rhs: bool) -> bool {
        self || rhs
    }
}
macro_rules! traced_logic {
    ($L:ident, $R:ident, $Out:ident) => {
        impl TraceLogic<$R<bool>> for $L<bool> {
            type Output = $Out<bool>;
            #[track_caller]
            fn trace_and(self, rhs: $R<bool>) -> $Out<bool> {
                $Out::from_val(super::array::binary(
                    BinaryOp::And,
                    self.v.into(),
                    rhs.v.into(),
                    SourceLoc::caller(),
                ))
            }
            #[track_caller]
            fn trace_or(self, rhs: $R<bool>) -> $Out<bool> {
                $Out::from_val(super::array::binary(
                    BinaryOp::Or,
                    self.v.into(),
                    rhs.v.into(),
                    SourceLoc::caller(),
                ))
            }
        }
    };
}
traced_logic!(Scalar, Scalar, Scalar);
traced_logic!(Array, Array, Array);
traced_logic!(Array, Scalar, Array);
traced_logic!(Scalar, Array, Array);

// ---------------------------------------------------------------------------------------------- carried values

/// Values that can flow out of a traced `if` or around a traced loop: traced handles and tuples of them.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be carried through a traced `if`/`for`/`while`",
    label = "assigned inside traced control flow",
    note = "only traced values (Array<T>, Scalar<T>) may be assigned inside a traced `if`/`for`/`while` or be the value of a traced `if`; compute compile-time values outside the loop"
)]
pub trait Carry: Sized {
    #[doc(hidden)]
    fn flatten(&self, out: &mut Vec<Val>);
    #[doc(hidden)]
    fn rebuild(vals: &mut dyn Iterator<Item = Val>) -> Self;
    /// [`Carry::rebuild`] knowing what entered the region: refs pass through by identity (a ref is a
    /// place, not a value: `o += v` inside a loop changes what `o` points at, not `o`).
    #[doc(hidden)]
    fn rebuild_from(&self, vals: &mut dyn Iterator<Item = Val>) -> Self {
        Self::rebuild(vals)
    }
    /// The refs among the carried variables, to check that a region leaves them as they came in.
    #[doc(hidden)]
    fn refs(&self, _: &mut Vec<Val>) {}
}

impl Carry for () {
    fn flatten(&self, _: &mut Vec<Val>) {}
    fn rebuild(_: &mut dyn Iterator<Item = Val>) -> Self {}
}
impl<T> Carry for Array<T> {
    fn flatten(&self, out: &mut Vec<Val>) {
        out.push(self.v)
    }
    fn rebuild(vals: &mut dyn Iterator<Item = Val>) -> Self {
        Array::from_val(vals.next().unwrap_or(Val::POISON))
    }
}
impl<T> Carry for Scalar<T> {
    fn flatten(&self, out: &mut Vec<Val>) {
        out.push(self.v)
    }
    fn rebuild(vals: &mut dyn Iterator<Item = Val>) -> Self {
        Scalar::from_val(vals.next().unwrap_or(Val::POISON))
    }
}
/// Refs flow through control flow unchanged: no loop value, the same handle after the region.
macro_rules! carry_ref {
    ($H:ident) => {
        impl<T: Element, S: super::refs::MemorySpace> Carry for super::refs::$H<T, S> {
            fn flatten(&self, _: &mut Vec<Val>) {}
            fn rebuild(_: &mut dyn Iterator<Item = Val>) -> Self {
                <Self as super::refs::KernelParam>::from_val(Val::POISON)
            }
            fn rebuild_from(&self, _: &mut dyn Iterator<Item = Val>) -> Self {
                *self
            }
            fn refs(&self, out: &mut Vec<Val>) {
                out.push(self.v)
            }
        }
    };
}
carry_ref!(Ref);
carry_ref!(RefMut);

macro_rules! carry_tuple {
    ($($n:ident),*) => {
        impl<$($n: Carry),*> Carry for ($($n,)*) {
            #[allow(non_snake_case)]
            fn flatten(&self, out: &mut Vec<Val>) {
                let ($($n,)*) = self;
                $($n.flatten(out);)*
            }
            fn rebuild(vals: &mut dyn Iterator<Item = Val>) -> Self {
                ($($n::rebuild(vals),)*)
            }
            #[allow(non_snake_case)]
            fn rebuild_from(&self, vals: &mut dyn Iterator<Item = Val>) -> Self {
                let ($($n,)*) = self;
                ($($n.rebuild_from(vals),)*)
            }
            #[allow(non_snake_case)]
            fn refs(&self, out: &mut Vec<Val>) {
                let ($($n,)*) = self;
                $($n.refs(out);)*
            }
        }
    };
}
carry_tuple!(A);
carry_tuple!(A, B);
carry_tuple!(A, B, C);
carry_tuple!(A, B, C, D);
carry_tuple!(A, B, C, D, E);
carry_tuple!(A, B, C, D, E, F);
carry_tuple!(A, B, C, D, E, F, G);
carry_tuple!(A, B, C, D, E, F, G, H);

fn flat<C: Carry>(c: &C) -> Vec<Val> {
    let mut v = Vec::new();
    c.flatten(&mut v);
    v
}

/// A carried ref must leave a region as it entered it (its handle passes through unchanged).
fn check_same_refs<C: Carry>(entry: &C, exit: &C, what: &str) -> Result<()> {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    entry.refs(&mut before);
    exit.refs(&mut after);
    if before != after {
        return Err(kerr!(
            Trace,
            "{what} assigns another ref to a ref variable; refs pass through traced control flow unchanged (store into the ref instead: `o.store(v)`, `o += v`)"
        ));
    }
    Ok(())
}

fn types_of(t: &super::Tracer, vals: &[Val]) -> Result<Vec<Type>> {
    vals.iter().map(|v| Ok(t.ty(*v)?.clone())).collect()
}

fn ids_of(t: &super::Tracer, vals: &[Val]) -> Result<Vec<crate::ir::ValueId>> {
    vals.iter().map(|v| t.check(*v)).collect()
}

/// Check that a region yields what it was entered with (or what the other branch yields).
fn check_same_types(expected: &[Type], got: &[Type], what: &str) -> Result<()> {
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        if e != g {
            return Err(kerr!(Shape, "{what}: value {i} is {e} on entry but {g} at the end; a carried value must keep its shape and element type"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------- if

/// An `if` condition: a Rust `bool` (decided now) or a traced `Scalar<bool>` (→ `scf.if`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an `if` condition in a kernel",
    note = "use a Rust `bool` or a traced scalar condition such as `program_id(0) == 0`; array masks go through `select(mask, a, b)`"
)]
pub trait Cond<V, R> {
    #[doc(hidden)]
    fn branch(
        self,
        vars: V,
        then_: impl FnOnce(V) -> (V, R),
        else_: impl FnOnce(V) -> (V, R),
        loc: SourceLoc,
    ) -> (V, R);
}

impl<V, R> Cond<V, R> for bool {
    fn branch(
        self,
        vars: V,
        then_: impl FnOnce(V) -> (V, R),
        else_: impl FnOnce(V) -> (V, R),
        _: SourceLoc,
    ) -> (V, R) {
        if self {
            then_(vars)
        } else {
            else_(vars)
        }
    }
}

impl<V: Carry + Copy, R: Carry> Cond<V, R> for Scalar<bool> {
    fn branch(
        self,
        vars: V,
        then_: impl FnOnce(V) -> (V, R),
        else_: impl FnOnce(V) -> (V, R),
        loc: SourceLoc,
    ) -> (V, R) {
        let cond = self.v;
        let Some(depth) = with(loc, |t| {
            let ty = t.ty(cond)?;
            if *ty != Type::Scalar(DType::Bool) {
                return Err(kerr!(
                    DType,
                    "an `if` condition must be a bool scalar, got {ty}"
                ));
            }
            Ok(t.depth())
        }) else {
            return poison_pair();
        };
        let mut branches = Vec::new();
        let mut yielded_types: Vec<Vec<Type>> = Vec::new();
        for body in [
            Box::new(then_) as Box<dyn FnOnce(V) -> (V, R)>,
            Box::new(else_),
        ] {
            if with(loc, |t| {
                t.open_region(&[]);
                Ok(())
            })
            .is_none()
            {
                return poison_pair();
            }
            let (v, r) = body(vars);
            let mut out = flat(&v);
            r.flatten(&mut out);
            let closed = with(loc, |t| {
                check_same_refs(&vars, &v, "a branch of this `if`")?;
                let tys = types_of(t, &out)?;
                let ids = ids_of(t, &out)?;
                Ok((t.close_region(OpKind::Yield, ids, loc), tys))
            });
            let Some((region, tys)) = closed else {
                restore_depth(loc, depth);
                return poison_pair();
            };
            branches.push(region);
            yielded_types.push(tys);
        }
        let out = with(loc, |t| {
            check_same_types(
                &yielded_types[0],
                &yielded_types[1],
                "the two branches of this `if` differ",
            )?;
            let c = t.check(cond)?;
            let ids = t.push(OpKind::If, vec![c], yielded_types[0].clone(), branches, loc);
            Ok(ids.iter().map(|i| t.val(*i)).collect::<Vec<_>>())
        });
        match out {
            Some(vals) => {
                let mut it = vals.into_iter();
                let v = vars.rebuild_from(&mut it);
                let r = R::rebuild(&mut it);
                (v, r)
            }
            None => poison_pair(),
        }
    }
}

/// Handles standing for the results of a control-flow op that failed (its error is already recorded).
fn poisoned<V: Carry>() -> V {
    V::rebuild(&mut std::iter::repeat(Val::POISON))
}

/// Close the regions a failed control-flow op left open, so the trace stays balanced.
fn restore_depth(loc: SourceLoc, depth: usize) {
    with(loc, |t| {
        t.truncate(depth);
        Ok(())
    });
}

fn poison_pair<V: Carry, R: Carry>() -> (V, R) {
    let mut it = std::iter::repeat(Val::POISON);
    (V::rebuild(&mut it), R::rebuild(&mut it))
}

/// `if cond { .. } else { .. }` as generated by the macro: `vars` are the variables assigned in either branch.
#[track_caller]
pub fn if_else<C: Cond<V, R>, V, R>(
    cond: C,
    vars: V,
    then_: impl FnOnce(V) -> (V, R),
    else_: impl FnOnce(V) -> (V, R),
) -> (V, R) {
    cond.branch(vars, then_, else_, SourceLoc::caller())
}

// ---------------------------------------------------------------------------------------------- for

/// A loop bound: a Rust integer (compile-time) or a traced `Scalar<i32>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a loop bound",
    note = "loop bounds are integers (i32/usize) or traced `Scalar<i32>` values"
)]
pub trait Bound {
    #[doc(hidden)]
    fn bound(self) -> Arg;
}
impl Bound for i32 {
    fn bound(self) -> Arg {
        Arg::Lit(self.literal())
    }
}
impl Bound for usize {
    #[track_caller]
    fn bound(self) -> Arg {
        super::i32_arg(self as i128, SourceLoc::caller())
    }
}
impl Bound for u32 {
    #[track_caller]
    fn bound(self) -> Arg {
        super::i32_arg(self as i128, SourceLoc::caller())
    }
}
impl Bound for Scalar<i32> {
    fn bound(self) -> Arg {
        Arg::Val(self.v)
    }
}

/// `for i in lo..hi { .. }` → `scf.for` over `i32`, with `vars` carried around the loop.
#[track_caller]
pub fn for_range<V: Carry>(
    lo: impl Bound,
    hi: impl Bound,
    vars: V,
    body: impl FnOnce(Scalar<i32>, V) -> V,
) -> V {
    for_loop(
        lo.bound(),
        hi.bound(),
        Arg::Lit(1i32.literal()),
        vars,
        body,
        SourceLoc::caller(),
    )
}

/// `for i in (lo..hi).step_by(step) { .. }`.
#[track_caller]
pub fn for_range_step<V: Carry>(
    lo: impl Bound,
    hi: impl Bound,
    step: impl Bound,
    vars: V,
    body: impl FnOnce(Scalar<i32>, V) -> V,
) -> V {
    for_loop(
        lo.bound(),
        hi.bound(),
        step.bound(),
        vars,
        body,
        SourceLoc::caller(),
    )
}

fn for_loop<V: Carry>(
    lo: Arg,
    hi: Arg,
    step: Arg,
    vars: V,
    body: impl FnOnce(Scalar<i32>, V) -> V,
    loc: SourceLoc,
) -> V {
    let inits = flat(&vars);
    let i32_ty = Type::Scalar(DType::I32);
    let opened = with(loc, |t| {
        if let Arg::Lit(s) = step {
            if s.as_i64() <= 0 {
                return Err(kerr!(
                    Grid,
                    "loop step must be positive, got {}",
                    s.as_i64()
                ));
            }
        }
        let mut bounds = Vec::new();
        for b in [lo, hi, step] {
            bounds.push(t.materialize(b, &i32_ty, loc)?);
        }
        let tys = types_of(t, &inits)?;
        let depth = t.depth();
        let mut arg_tys = vec![i32_ty.clone()];
        arg_tys.extend(tys.iter().cloned());
        let args = t.open_region(&arg_tys);
        Ok((bounds, tys, depth, args))
    });
    let Some((bounds, tys, depth, args)) = opened else {
        return poisoned::<V>();
    };
    let iv = Scalar::from_val(args[0]);
    let carried = vars.rebuild_from(&mut args[1..].iter().copied());
    let exit = body(iv, carried);
    let out = flat(&exit);
    let done = with(loc, |t| {
        check_same_refs(&vars, &exit, "this `for` loop")?;
        let out_tys = types_of(t, &out)?;
        check_same_types(
            &tys,
            &out_tys,
            "a value carried around this `for` loop changes",
        )?;
        let ids = ids_of(t, &out)?;
        let region = t.close_region(OpKind::Yield, ids, loc);
        let mut operands = bounds.clone();
        operands.extend(ids_of(t, &inits)?);
        let res = t.push(OpKind::For, operands, tys.clone(), vec![region], loc);
        Ok(res.iter().map(|i| t.val(*i)).collect::<Vec<_>>())
    });
    match done {
        Some(vals) => vars.rebuild_from(&mut vals.into_iter()),
        None => {
            restore_depth(loc, depth);
            poisoned::<V>()
        }
    }
}

// ---------------------------------------------------------------------------------------------- while

/// A `while` condition: must be traced (a loop on a Rust `bool` would not terminate at trace time).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the condition of a traced `while` loop",
    note = "the condition must be a traced `Scalar<bool>` computed from the loop's carried values (→ scf.while); for a compile-time count use `for i in 0..n`"
)]
pub trait WhileCond {
    #[doc(hidden)]
    fn cond_val(self) -> Val;
}
impl WhileCond for Scalar<bool> {
    fn cond_val(self) -> Val {
        self.v
    }
}

/// `while cond { .. }` → `scf.while`, with `vars` carried.
#[track_caller]
pub fn while_loop<V: Carry, C: WhileCond>(
    vars: V,
    cond: impl FnOnce(V) -> C,
    body: impl FnOnce(V) -> V,
) -> V {
    let loc = SourceLoc::caller();
    let inits = flat(&vars);
    let opened = with(loc, |t| {
        let tys = types_of(t, &inits)?;
        let depth = t.depth();
        let args = t.open_region(&tys);
        Ok((tys, depth, args))
    });
    let Some((tys, depth, before_args)) = opened else {
        return poisoned::<V>();
    };
    let c = cond(vars.rebuild_from(&mut before_args.iter().copied())).cond_val();
    let before = with(loc, |t| {
        if *t.ty(c)? != Type::Scalar(DType::Bool) {
            return Err(kerr!(
                DType,
                "a `while` condition must be a bool scalar, got {}",
                t.ty(c)?
            ));
        }
        let mut ops = vec![t.check(c)?];
        ops.extend(ids_of(t, &before_args)?);
        let region = t.close_region(OpKind::Condition, ops, loc);
        let after_args = t.open_region(&tys);
        Ok((region, after_args))
    });
    let Some((before, after_args)) = before else {
        restore_depth(loc, depth);
        return poisoned::<V>();
    };
    let exit = body(vars.rebuild_from(&mut after_args.iter().copied()));
    let out = flat(&exit);
    let done = with(loc, |t| {
        check_same_refs(&vars, &exit, "this `while` loop")?;
        let out_tys = types_of(t, &out)?;
        check_same_types(
            &tys,
            &out_tys,
            "a value carried around this `while` loop changes",
        )?;
        let ids = ids_of(t, &out)?;
        let after = t.close_region(OpKind::Yield, ids, loc);
        let operands = ids_of(t, &inits)?;
        let res = t.push(
            OpKind::While,
            operands,
            tys.clone(),
            vec![before, after],
            loc,
        );
        Ok(res.iter().map(|i| t.val(*i)).collect::<Vec<_>>())
    });
    match done {
        Some(vals) => vars.rebuild_from(&mut vals.into_iter()),
        None => {
            restore_depth(loc, depth);
            poisoned::<V>()
        }
    }
}

#[allow(dead_code)]
fn _assert_element<T: Element>() {}

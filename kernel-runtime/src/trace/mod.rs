//! Tracing: running a kernel's Rust body with handle-typed arguments records kernel IR.
//!
//! The `#[tpu_kernel]` macro leaves most of a body alone: the handle types ([`Array`], [`Scalar`], [`Ref`],
//! [`RefMut`]) overload operators, every API function is `#[track_caller]` (so each op carries the user's
//! `file:line:col`), and the macro only routes comparisons and `if`/`for`/`while` through `control`.
//!
//! Errors never panic: the first error of a trace is kept (with its location) and later ops return poisoned
//! handles; `build()` reports the error as a value.

mod api;
mod array;
mod compound;
mod control;
mod dma;
mod like;
mod pipeline;
mod refs;
mod remote;
mod slice;
mod unroll;
mod values;
mod views;

pub use api::*;
pub use array::{Array, Scalar, ScalarOperand};
pub use compound::{AddOp, CompoundOp, DivOp, MulOp, RemOp, SubOp, TraceCompoundAssign};
pub use control::{
    for_range, for_range_step, if_else, while_loop, Bound, Carry, Cond, TraceEq, TraceLogic,
    TraceOrd, WhileCond,
};
pub use dma::{
    async_copy, run_scoped, sync_copy, AsyncCopy, DmaSem, DmaSource, DmaTarget, ScopeArgs,
    ScopedScratch, Sem, SemScratch,
};
pub use like::{full_like, zeros_like, Like};
pub use pipeline::{PipeBody, PipeRefs, Pipeline};
pub use refs::{
    ds, Ds, IntoSliceSpec, KernelParam, MemorySpace, ParamKind, Ref, RefMut, SliceArg, SliceSpec,
    View, ViewMut,
};
pub use remote::{
    async_remote_copy, axis_index, axis_size, barrier_semaphore, DeviceId, IntoDeviceId, RemoteCopy,
};
pub use unroll::{unroll, unroll_range, unroll_range_step, UnrollBound};
pub use values::{concatenate, roll, ConcatParts};

use crate::dtype::{DType, Literal};
use crate::error::{kerr, KernelError, Result, SourceLoc};
use crate::ir::{Func, Op, OpKind, Region, Type, ValueId};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};

/// A traced value handle: an SSA value of one trace (generation), or poison after an error.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Val {
    id: u32,
    gen: u32,
}

const POISON_GEN: u32 = 0;

impl Val {
    pub(crate) const POISON: Val = Val {
        id: 0,
        gen: POISON_GEN,
    };
}

/// Something that becomes an operand: a traced value or a literal to materialize.
#[derive(Clone, Copy, Debug)]
#[doc(hidden)]
pub enum Arg {
    Val(Val),
    Lit(Literal),
}

impl From<Val> for Arg {
    fn from(v: Val) -> Self {
        Arg::Val(v)
    }
}

static NEXT_GEN: AtomicU32 = AtomicU32::new(1);

/// The state of one trace: the function being built.
pub(crate) struct Tracer {
    gen: u32,
    values: Vec<Type>,
    /// Open regions, innermost last; the first is the function body.
    stack: Vec<Region>,
    error: Option<KernelError>,
    /// Grid size, for `program_id` / `num_programs`.
    pub(crate) grid: Vec<usize>,
    /// The function parameters that are grid indices (kernel) or grid indices (index maps).
    pub(crate) grid_args: Vec<ValueId>,
    /// The device mesh (`axis_index`, remote device ids) and collective id (the barrier
    /// semaphore) of the launch, set by [`communication`].
    pub(crate) mesh: Option<crate::mesh::Mesh>,
    pub(crate) collective_id: Option<u32>,
}

thread_local! {
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
    /// Set when a traced API is used with no trace running; reported by the next `build()`.
    static STRAY_USE: Cell<Option<SourceLoc>> = const { Cell::new(None) };
}

/// The trace this thread runs, from [`begin`] to [`finish`]: dropped before `finish` (an early return
/// on an error), it ends the trace, so a failed `build()` leaves nothing behind on its thread. During
/// a panic it leaves the trace for `build()`'s handler, which collects its first error ([`abort`]).
#[must_use = "a trace ends at `finish` or when its guard drops"]
pub(crate) struct TraceGuard(());

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            TRACER.with(|cell| {
                if let Ok(mut slot) = cell.try_borrow_mut() {
                    slot.take();
                }
            });
        }
    }
}

/// Start a trace of a function with the given parameter types; returns its guard and their handles.
pub(crate) fn begin(
    grid: &[usize],
    params: &[Type],
    n_grid_args: usize,
) -> Result<(TraceGuard, Vec<Val>)> {
    let gen = NEXT_GEN.fetch_add(1, Ordering::Relaxed).max(1);
    let mut t = Tracer {
        gen,
        values: Vec::new(),
        stack: vec![Region::default()],
        error: None,
        grid: grid.to_vec(),
        grid_args: Vec::new(),
        mesh: None,
        collective_id: None,
    };
    let mut vals = Vec::new();
    for ty in params {
        let id = t.new_value(ty.clone());
        t.stack[0].args.push(id);
        vals.push(Val { id: id.0, gen });
    }
    t.grid_args = t.stack[0].args[..n_grid_args].to_vec();
    TRACER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_some() {
            return Err(kerr!(
                Trace,
                "a kernel trace is already running on this thread (pallas_call(..).build() called from inside a kernel?)"
            ));
        }
        *slot = Some(t);
        Ok(())
    })?;
    Ok((TraceGuard(()), vals))
}

/// Tell the running trace the launch's mesh and collective id (before the body is traced).
pub(crate) fn communication(mesh: Option<crate::mesh::Mesh>, collective_id: Option<u32>) {
    TRACER.with(|cell| {
        if let Some(t) = cell.borrow_mut().as_mut() {
            t.mesh = mesh;
            t.collective_id = collective_id;
        }
    });
}

/// End the current trace, producing the function (or the first error recorded).
pub(crate) fn finish(
    _trace: TraceGuard,
    name: &str,
    results: Vec<Val>,
    loc: SourceLoc,
) -> Result<Func> {
    let t = TRACER.with(|cell| cell.borrow_mut().take());
    let Some(mut t) = t else {
        return Err(kerr!(Trace, "no kernel trace is running"));
    };
    if let Some(e) = t.error.take() {
        return Err(e);
    }
    if let Some(stray) = STRAY_USE.with(|s| s.take()) {
        return Err(kerr!(
            Trace,
            "a traced kernel operation was used outside of a kernel trace; kernel APIs only work inside a #[tpu_kernel] body or an index map"
        )
        .at(stray));
    }
    if t.stack.len() != 1 {
        return Err(kerr!(
            Trace,
            "unbalanced regions at the end of the trace (internal error)"
        ));
    }
    let mut result_ids = Vec::new();
    let mut result_types = Vec::new();
    for v in &results {
        let id = t.check(*v)?;
        result_types.push(t.values[id.0 as usize].clone());
        result_ids.push(id);
    }
    let mut body = t.stack.pop().unwrap_or_default();
    body.ops.push(Op {
        kind: OpKind::Return,
        operands: result_ids,
        results: vec![],
        regions: vec![],
        loc,
    });
    Ok(Func {
        name: name.to_string(),
        values: t.values,
        body,
        result_types,
        loc,
    })
}

/// Abort a trace (after a panic or an early error), leaving the thread clean.
/// Drop the current trace (after a panic in the traced body), returning the first error it recorded.
pub(crate) fn abort() -> Option<crate::error::KernelError> {
    TRACER
        .with(|cell| cell.borrow_mut().take())
        .and_then(|mut t| t.error.take())
}

/// Run `f` against the current trace. Errors are recorded (the first one wins) and `None` returned.
pub(crate) fn with<R>(loc: SourceLoc, f: impl FnOnce(&mut Tracer) -> Result<R>) -> Option<R> {
    TRACER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(t) = slot.as_mut() else {
            STRAY_USE.with(|s| {
                if s.get().is_none() {
                    s.set(Some(loc))
                }
            });
            return None;
        };
        match f(t) {
            Ok(r) => Some(r),
            Err(e) => {
                t.record(e.at(loc));
                None
            }
        }
    })
}

/// Like [`with`], for ops producing one value; poison on failure.
pub(crate) fn emit(loc: SourceLoc, f: impl FnOnce(&mut Tracer) -> Result<Val>) -> Val {
    with(loc, f).unwrap_or(Val::POISON)
}

/// A Rust integer (a Rust index, bound or operand next to `Scalar<i32>`s) as an i32 kernel constant.
/// Outside i32's range it is an error at `loc` — never a wrapped value (`1 << 32` is not block 0).
pub(crate) fn i32_arg(v: i128, loc: SourceLoc) -> Arg {
    match i32::try_from(v) {
        Ok(x) => Arg::Lit(Literal::from_i64(DType::I32, x as i64)),
        Err(_) => Arg::Val(emit(loc, |_| {
            Err(kerr!(
                OutOfBounds,
                "the integer {v} does not fit the kernel's i32 indices and constants (i32::MAX = {})",
                i32::MAX
            ))
        })),
    }
}

/// An error that only says "an earlier error already happened"; never shown because the first error wins.
fn poisoned() -> KernelError {
    kerr!(Trace, "use of a value produced by a failed operation")
}

impl Tracer {
    pub(crate) fn record(&mut self, e: KernelError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    fn new_value(&mut self, ty: Type) -> ValueId {
        self.values.push(ty);
        ValueId(self.values.len() as u32 - 1)
    }

    pub(crate) fn val(&self, id: ValueId) -> Val {
        Val {
            id: id.0,
            gen: self.gen,
        }
    }

    /// Validate a handle against this trace.
    pub(crate) fn check(&self, v: Val) -> Result<ValueId> {
        if v.gen == POISON_GEN {
            return Err(poisoned());
        }
        if v.gen != self.gen || v.id as usize >= self.values.len() {
            return Err(kerr!(
                Trace,
                "a traced value from another kernel trace was used here; values cannot be shared between kernels or index maps"
            ));
        }
        Ok(ValueId(v.id))
    }

    pub(crate) fn ty(&self, v: Val) -> Result<&Type> {
        let id = self.check(v)?;
        Ok(&self.values[id.0 as usize])
    }

    pub(crate) fn ty_of(&self, id: ValueId) -> &Type {
        &self.values[id.0 as usize]
    }

    /// Append an op to the innermost open region; returns its result ids.
    pub(crate) fn push(
        &mut self,
        kind: OpKind,
        operands: Vec<ValueId>,
        result_types: Vec<Type>,
        regions: Vec<Region>,
        loc: SourceLoc,
    ) -> Vec<ValueId> {
        let results: Vec<ValueId> = result_types
            .into_iter()
            .map(|t| self.new_value(t))
            .collect();
        let op = Op {
            kind,
            operands,
            results: results.clone(),
            regions,
            loc,
        };
        if let Some(r) = self.stack.last_mut() {
            r.ops.push(op);
        }
        results
    }

    pub(crate) fn push1(
        &mut self,
        kind: OpKind,
        operands: Vec<ValueId>,
        ty: Type,
        loc: SourceLoc,
    ) -> Val {
        let ids = self.push(kind, operands, vec![ty], vec![], loc);
        self.val(ids[0])
    }

    /// Open a nested region with arguments of the given types.
    pub(crate) fn open_region(&mut self, arg_types: &[Type]) -> Vec<Val> {
        let args: Vec<ValueId> = arg_types
            .iter()
            .map(|t| self.new_value(t.clone()))
            .collect();
        let vals = args.iter().map(|a| self.val(*a)).collect();
        self.stack.push(Region { args, ops: vec![] });
        vals
    }

    /// Close the innermost nested region, terminating it with `terminator(operands)`.
    pub(crate) fn close_region(
        &mut self,
        terminator: OpKind,
        operands: Vec<ValueId>,
        loc: SourceLoc,
    ) -> Region {
        let mut r = self.stack.pop().unwrap_or_default();
        r.ops.push(Op {
            kind: terminator,
            operands,
            results: vec![],
            regions: vec![],
            loc,
        });
        r
    }

    /// Number of open regions (used to restore balance after a failed region body).
    pub(crate) fn depth(&self) -> usize {
        self.stack.len()
    }

    pub(crate) fn truncate(&mut self, depth: usize) {
        self.stack.truncate(depth.max(1));
    }

    /// Materialize an operand as a value of `target` type (constants splat, scalars/vectors broadcast).
    pub(crate) fn materialize(&mut self, a: Arg, target: &Type, loc: SourceLoc) -> Result<ValueId> {
        match a {
            Arg::Lit(l) => {
                let v = self.push1(
                    OpKind::Const(l.convert(target.dtype())),
                    vec![],
                    target.clone(),
                    loc,
                );
                self.check(v)
            }
            Arg::Val(v) => {
                let id = self.check(v)?;
                let ty = self.ty_of(id).clone();
                if ty.dtype() != target.dtype() {
                    return Err(kerr!(
                        DType,
                        "element types differ: {} vs {}; cast one side with `.cast::<{}>()`",
                        ty.dtype(),
                        target.dtype(),
                        target.dtype()
                    ));
                }
                if ty.shape() == target.shape()
                    && matches!(ty, Type::Scalar(_)) == matches!(target, Type::Scalar(_))
                {
                    return Ok(id);
                }
                broadcast_compatible(ty.shape(), target.shape())?;
                let v = self.push1(OpKind::Broadcast, vec![id], target.clone(), loc);
                self.check(v)
            }
        }
    }

    /// The type of an operand (literals are scalars of their dtype).
    pub(crate) fn arg_type(&self, a: Arg) -> Result<Type> {
        match a {
            Arg::Lit(l) => Ok(Type::Scalar(l.dtype)),
            Arg::Val(v) => Ok(self.ty(v)?.clone()),
        }
    }
}

/// Numpy broadcasting of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(kerr!(
                Shape,
                "shapes {a:?} and {b:?} cannot be broadcast together (dimension {i}: {da} vs {db})"
            ));
        };
    }
    Ok(out)
}

fn broadcast_compatible(from: &[usize], to: &[usize]) -> Result<()> {
    if from.len() > to.len() || broadcast_shapes(from, to)? != to {
        return Err(kerr!(Shape, "cannot broadcast shape {from:?} to {to:?}"));
    }
    Ok(())
}

/// Result type of combining operand types elementwise.
pub(crate) fn join_types(a: &Type, b: &Type, dtype: DType) -> Result<Type> {
    match (a, b) {
        (Type::Scalar(_), Type::Scalar(_)) => Ok(Type::Scalar(dtype)),
        _ => Ok(Type::Vector(broadcast_shapes(a.shape(), b.shape())?, dtype)),
    }
}

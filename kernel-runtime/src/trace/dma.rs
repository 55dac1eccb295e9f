//! DMA and semaphores (Pallas's `pltpu.make_async_copy`, `pltpu.sync_copy`, `pl.semaphore_signal` /
//! `semaphore_wait` / `semaphore_read`): a copy between two refs or windows of refs — typically an
//! ANY (HBM) array and a VMEM buffer — started and waited on explicitly, completion counted by a DMA
//! semaphore; regular semaphores counted by the kernel itself.
//!
//! ```ignore
//! let copy = async_copy(x_hbm.at(ds(i * 128, 128)), buf.at(slot), sems.at(slot));
//! copy.start();
//! // ... other work ...
//! copy.wait();
//! ```

use super::array::{IntoArg, Scalar};
use super::refs::{view_in, IntoSliceSpec, KernelParam, ParamKind, SliceSpec};
use super::refs::{MemorySpace, Ref, RefMut, View, ViewMut};
use super::{emit, with, Arg, Val};
use crate::dtype::DType;
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{MemSpace, OpKind, SemKind, Type};

/// DMA semaphores (`pltpu.SemaphoreType.DMA`): the kernel parameter for a [`DmaSem::one`] or
/// [`DmaSem::array`] scratch. A copy signals one when it completes; [`AsyncCopy::wait`] waits for it.
#[derive(Clone, Copy, Debug)]
pub struct DmaSem {
    pub(crate) v: Val,
}

/// Regular semaphores (`pltpu.SemaphoreType.REGULAR`): the kernel parameter for a [`Sem::one`] or
/// [`Sem::array`] scratch, signalled and waited on by the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Sem {
    pub(crate) v: Val,
}

/// A semaphore scratch operand (`scratch_shapes=[pltpu.SemaphoreType.DMA((2,))]`).
#[derive(Clone, Debug, PartialEq)]
pub struct SemScratch {
    pub shape: Vec<usize>,
    pub kind: SemKind,
}

impl crate::launch::Scratch for SemScratch {
    fn decl(self) -> (crate::launch::ArrayType, MemSpace) {
        (
            crate::launch::ArrayType::new(self.shape, DType::I32),
            MemSpace::Sem(self.kind),
        )
    }
}

macro_rules! semaphore_handle {
    ($H:ident, $kind:expr, $what:literal) => {
        impl KernelParam for $H {
            const KIND: ParamKind = ParamKind::RefMut;
            const DTYPE: DType = DType::I32;
            const SPACE: MemSpace = MemSpace::Sem($kind);
            fn from_val(v: Val) -> Self {
                $H { v }
            }
            fn to_val(self) -> Val {
                self.v
            }
        }
        impl $H {
            #[doc = concat!("One ", $what, " as a scratch operand (`.scratch(", stringify!($H), "::one())`).")]
            pub fn one() -> SemScratch {
                SemScratch {
                    shape: vec![],
                    kind: $kind,
                }
            }
            #[doc = concat!("An array of ", $what, "s as a scratch operand (`.scratch(", stringify!($H), "::array([2]))`).")]
            pub fn array(shape: impl AsRef<[usize]>) -> SemScratch {
                SemScratch {
                    shape: shape.as_ref().to_vec(),
                    kind: $kind,
                }
            }
            /// One semaphore of an array of them (`sems.at[slot]`).
            #[track_caller]
            pub fn at(self, idx: impl IntoSliceSpec) -> $H {
                let loc = SourceLoc::caller();
                let spec = idx.into_spec();
                let v = emit(loc, |t| {
                    let id = view_in(t, self.v, Some(&spec), loc)?;
                    Ok(t.val(id))
                });
                $H { v }
            }
        }
    };
}
semaphore_handle!(DmaSem, SemKind::Dma, "DMA semaphore");
semaphore_handle!(Sem, SemKind::Regular, "semaphore");

/// The semaphore operand `v`, checked to be a single semaphore of `kind`.
pub(crate) fn one_semaphore(
    t: &super::Tracer,
    v: Val,
    kind: SemKind,
) -> Result<crate::ir::ValueId> {
    match t.ty(v)? {
        Type::Ref(s, _, MemSpace::Sem(k)) if s.is_empty() && *k == kind => t.check(v),
        Type::Ref(s, _, MemSpace::Sem(_)) if !s.is_empty() => Err(kerr!(
            Shape,
            "an array of {} semaphores is used where one is needed: pick one with `.at(i)`",
            s.iter().product::<usize>()
        )),
        other => Err(kerr!(Trace, "expected a semaphore, got {other}")),
    }
}

impl Sem {
    /// Add `amount` to the semaphore (`pl.semaphore_signal(sem, amount)`).
    #[track_caller]
    pub fn signal(self, amount: impl IntoArg<i32>) {
        self.update(OpKind::SemSignal, amount.into_arg(), SourceLoc::caller());
    }
    /// Wait until the semaphore holds `amount`, then subtract it (`pl.semaphore_wait(sem, amount)`).
    #[track_caller]
    pub fn wait(self, amount: impl IntoArg<i32>) {
        self.update(OpKind::SemWait, amount.into_arg(), SourceLoc::caller());
    }
    /// The semaphore's value (`pl.semaphore_read(sem)`).
    #[track_caller]
    pub fn read(self) -> Scalar<i32> {
        let loc = SourceLoc::caller();
        Scalar::from_val(emit(loc, |t| {
            let s = one_semaphore(t, self.v, SemKind::Regular)?;
            Ok(t.push1(OpKind::SemRead, vec![s], Type::Scalar(DType::I32), loc))
        }))
    }
    fn update(self, kind: OpKind, amount: Arg, loc: SourceLoc) {
        with(loc, |t| {
            let s = one_semaphore(t, self.v, SemKind::Regular)?;
            let n = t.materialize(amount, &Type::Scalar(DType::I32), loc)?;
            t.push(kind, vec![s, n], vec![], vec![], loc);
            Ok(())
        });
    }
}

// ---------------------------------------------------------------------------------------------- copies

/// One side of a copy: a ref, or a window of one (`x.at((ds(i, 8), ..))`).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub(crate) r: Val,
    pub(crate) spec: Option<SliceSpec>,
}

/// What a copy reads: any ref or window of `T` elements (VMEM, SMEM or ANY).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the source of a copy of `{T}` elements",
    note = "copy from a ref or a window of one (`x.at((ds(i, 8), ..))`) with the same element type"
)]
pub trait DmaSource<T> {
    #[doc(hidden)]
    fn endpoint(&self) -> Endpoint;
}

/// What a copy writes: a writable ref or window of `T` elements (an output or a scratch buffer).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the destination of a copy of `{T}` elements",
    note = "copy into a `RefMut` (an output or scratch buffer) or a window of one (`buf.at(slot)`), with the same element type; inputs are read-only"
)]
pub trait DmaTarget<T> {
    #[doc(hidden)]
    fn endpoint(&self) -> Endpoint;
}

impl<T, S: MemorySpace> DmaSource<T> for Ref<T, S> {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            r: self.v,
            spec: None,
        }
    }
}
impl<T, S: MemorySpace> DmaSource<T> for RefMut<T, S> {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            r: self.v,
            spec: None,
        }
    }
}
impl<T, S: MemorySpace> DmaSource<T> for View<T, S> {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            r: self.r,
            spec: Some(self.spec.clone()),
        }
    }
}
impl<T, S: MemorySpace> DmaSource<T> for ViewMut<T, S> {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            r: self.r,
            spec: Some(self.spec.clone()),
        }
    }
}
impl<T, S: MemorySpace> DmaTarget<T> for RefMut<T, S> {
    fn endpoint(&self) -> Endpoint {
        DmaSource::<T>::endpoint(self)
    }
}
impl<T, S: MemorySpace> DmaTarget<T> for ViewMut<T, S> {
    fn endpoint(&self) -> Endpoint {
        DmaSource::<T>::endpoint(self)
    }
}

/// A copy from `src` to `dst` signalling `sem` (`pltpu.make_async_copy`): nothing moves until
/// [`start`](AsyncCopy::start); [`wait`](AsyncCopy::wait) blocks until it has completed. Each call
/// emits the windows anew (as Pallas does), so a copy described once can be started in one grid step
/// and waited on in the next.
#[derive(Clone, Debug)]
pub struct AsyncCopy {
    pub(crate) src: Endpoint,
    pub(crate) dst: Endpoint,
    pub(crate) sem: DmaSem,
}

/// Describe a copy from `src` to `dst` signalling the DMA semaphore `sem` (see [`AsyncCopy`]).
pub fn async_copy<T>(src: impl DmaSource<T>, dst: impl DmaTarget<T>, sem: DmaSem) -> AsyncCopy {
    AsyncCopy {
        src: src.endpoint(),
        dst: dst.endpoint(),
        sem,
    }
}

/// Copy `src` to `dst` and wait for it (`pltpu.sync_copy`), counted on `sem`.
#[track_caller]
pub fn sync_copy<T>(src: impl DmaSource<T>, dst: impl DmaTarget<T>, sem: DmaSem) {
    let loc = SourceLoc::caller();
    let c = async_copy(src, dst, sem);
    c.issue(OpKind::DmaStart, loc);
    c.issue(OpKind::DmaWait, loc);
}

impl AsyncCopy {
    /// Start the copy (`copy.start()`: `tpu.enqueue_dma`).
    #[track_caller]
    pub fn start(&self) {
        self.issue(OpKind::DmaStart, SourceLoc::caller());
    }
    /// Wait for the copy to complete (`copy.wait()`: `tpu.wait_dma`); its destination may be read and
    /// its source written again afterwards.
    #[track_caller]
    pub fn wait(&self) {
        self.issue(OpKind::DmaWait, SourceLoc::caller());
    }

    pub(crate) fn issue(&self, kind: OpKind, loc: SourceLoc) {
        with(loc, |t| {
            let src = view_in(t, self.src.r, self.src.spec.as_ref(), loc)?;
            let dst = view_in(t, self.dst.r, self.dst.spec.as_ref(), loc)?;
            let sem = one_semaphore(t, self.sem.v, SemKind::Dma)?;
            same_window(t, src, dst)?;
            t.push(kind, vec![src, dst, sem], vec![], vec![], loc);
            Ok(())
        });
    }
}

/// A copy's source and destination: refs (not semaphores) of one shape and element type.
pub(crate) fn same_window(
    t: &super::Tracer,
    src: crate::ir::ValueId,
    dst: crate::ir::ValueId,
) -> Result<()> {
    let (st, dt) = (t.ty_of(src).clone(), t.ty_of(dst).clone());
    let (Type::Ref(ss, sd, sspace), Type::Ref(ds, dd, dspace)) = (&st, &dt) else {
        return Err(kerr!(Trace, "a copy between non-refs ({st} to {dt})"));
    };
    if matches!(sspace, MemSpace::Sem(_)) || matches!(dspace, MemSpace::Sem(_)) {
        return Err(kerr!(Unsupported, "semaphores cannot be copied"));
    }
    if ss != ds || sd != dd {
        return Err(kerr!(
            Shape,
            "a copy from a {sd} window of shape [{}] into a {dd} window of shape [{}]: source and destination must have one shape and element type (a run-time size `?` on both, from one traced size: `async_copy(x.at(ds(i, n)), buf.at(ds(0, n)), sem)`)",
            shape_text(ss),
            shape_text(ds)
        ));
    }
    Ok(())
}

/// `16, ?` for a shape with a run-time size.
fn shape_text(s: &[usize]) -> String {
    let dims: Vec<String> = s
        .iter()
        .map(|&n| match n {
            crate::ir::DYNAMIC => "?".to_string(),
            n => n.to_string(),
        })
        .collect();
    dims.join(", ")
}

// ---------------------------------------------------------------------------------------------- scopes

/// The allocations of a [`run_scoped`] scope: one scratch descriptor ([`crate::launch::Vmem`],
/// [`crate::launch::Smem`], [`DmaSem::one`], ...) or a tuple of them.
pub trait ScopedScratch {
    #[doc(hidden)]
    fn decls(self) -> Vec<(crate::launch::ArrayType, MemSpace)>;
}
impl<S: crate::launch::Scratch> ScopedScratch for S {
    fn decls(self) -> Vec<(crate::launch::ArrayType, MemSpace)> {
        vec![self.decl()]
    }
}
macro_rules! scoped_tuple {
    ($($n:ident),*) => {
        impl<$($n: crate::launch::Scratch),*> ScopedScratch for ($($n,)*) {
            #[allow(non_snake_case)]
            fn decls(self) -> Vec<(crate::launch::ArrayType, MemSpace)> {
                let ($($n,)*) = self;
                vec![$($n.decl()),*]
            }
        }
    };
}
scoped_tuple!(A);
scoped_tuple!(A, B);
scoped_tuple!(A, B, C);
scoped_tuple!(A, B, C, D);

/// Refs passed into a [`run_scoped`] body ahead of its scoped buffers: `()`, one ref, or a tuple.
pub trait ScopeArgs {
    #[doc(hidden)]
    fn vals(self) -> Vec<Val>;
}
impl ScopeArgs for () {
    fn vals(self) -> Vec<Val> {
        Vec::new()
    }
}
macro_rules! scope_args {
    ($($n:ident),*) => {
        impl<$($n: KernelParam),*> ScopeArgs for ($($n,)*) {
            #[allow(non_snake_case)]
            fn vals(self) -> Vec<Val> {
                let ($($n,)*) = self;
                vec![$($n.to_val()),*]
            }
        }
    };
}
scope_args!(A);
scope_args!(A, B);
scope_args!(A, B, C);
scope_args!(A, B, C, D);
scope_args!(A, B, C, D, E);
scope_args!(A, B, C, D, E, F);

/// Run `body` with scratch that exists only for this scope (`pl.run_scoped(body, pltpu.VMEM(..),
/// pltpu.SemaphoreType.DMA)`): `run_scoped(staged_copy, (x, o), (Vmem::new([8, 128], F32),
/// DmaSem::one()))` calls the `#[kernel_fn]` helper `staged_copy(x, o, buf, sem)` — the refs passed in
/// `args` first, then one fresh ref per allocation, in order. Lowered as `tpu.region` with
/// `memref.alloca` / `tpu.sem_alloc`; copies and semaphore counts must be finished when the scope ends.
#[track_caller]
pub fn run_scoped<Args>(
    body: impl crate::launch::KernelFn<Args>,
    args: impl ScopeArgs,
    scratch: impl ScopedScratch,
) {
    let loc = SourceLoc::caller();
    let outer = args.vals();
    let decls = scratch.decls();
    let params = body.params();
    let types: Vec<Type> = decls
        .iter()
        .map(|(a, space)| Type::Ref(a.shape.clone(), a.dtype, *space))
        .collect();
    let opened = with(loc, |t| {
        if params.len() != outer.len() + decls.len() {
            return Err(kerr!(
                Signature,
                "the scope's body takes {} parameters but gets {} passed refs and {} scoped buffers",
                params.len(),
                outer.len(),
                decls.len()
            ));
        }
        for (i, (p, v)) in params.iter().zip(&outer).enumerate() {
            let (Type::Ref(_, d, space), want) = (t.ty(*v)?.clone(), p) else {
                return Err(kerr!(Signature, "argument {i} of the scope is not a ref"));
            };
            if (p.1, p.2) != (d, space) {
                return Err(kerr!(
                    Signature,
                    "parameter {i} of the scope's body is `{}` but it is passed a `{}`",
                    crate::check::param_type_name(want.0, want.1, want.2),
                    crate::check::param_type_name(want.0, d, space)
                ));
            }
        }
        for (i, ((kind, dtype, space), (a, want))) in
            params[outer.len()..].iter().zip(&decls).enumerate()
        {
            let declared = crate::check::param_type_name(ParamKind::RefMut, a.dtype, *want);
            if *kind != ParamKind::RefMut || dtype != &a.dtype || space != want {
                let got = crate::check::param_type_name(*kind, *dtype, *space);
                return Err(kerr!(
                    Signature,
                    "parameter {} of the scope's body is `{got}` but it receives a scoped {:?} buffer: declare it `{declared}`",
                    outer.len() + i,
                    a.shape
                ));
            }
        }
        Ok(t.open_region(&types))
    });
    let Some(scoped) = opened else {
        return;
    };
    let mut all = outer;
    all.extend(scoped);
    body.call(&all);
    close_scope(loc);
}

/// Run `f` with fresh refs of `types` that live for one scope (a `Scoped` op), for library code.
pub(crate) fn scoped_with(types: &[Type], loc: SourceLoc, f: impl FnOnce(Vec<Val>)) {
    let Some(refs) = with(loc, |t| Ok(t.open_region(types))) else {
        return;
    };
    f(refs);
    close_scope(loc);
}

fn close_scope(loc: SourceLoc) {
    with(loc, |t| {
        let region = t.close_region(OpKind::Yield, vec![], loc);
        t.push(OpKind::Scoped, vec![], vec![], vec![region], loc);
        Ok(())
    });
}

//! Kernel refs: [`Ref`] (read-only input block), [`RefMut`] (output block or scratch), and windows into them
//! (`r.at((ds(start, 8), ..))`). A ref's memory space is part of its type (`Ref<T, S>`, `S` one of
//! [`Vmem`] — the default —, [`Smem`], [`Any`]), so what the hardware cannot do does not compile:
//! VMEM refs load and store vectors, SMEM refs load and store single scalars, ANY (HBM) refs neither.

use super::array::{Array, IntoArg, Scalar};
use super::{emit, with, Arg, Val};
use crate::dtype::{DType, Element};
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{MemSpace, OpKind, Start, Type, Window};
use crate::launch::{Any, Smem, Vmem};
use std::marker::PhantomData;
use std::ops::{Range, RangeFrom, RangeFull, RangeTo};

/// Where a ref lives, as a type parameter of [`Ref`]/[`RefMut`]: [`Vmem`] (vector memory, the
/// default), [`Smem`] (scalar memory), [`Any`] (left where XLA put it, usually HBM: reached by DMA only).
pub trait MemorySpace: 'static {
    /// The space in the kernel IR.
    const SPACE: MemSpace;
}

/// A read-only block ref (a kernel input) in memory space `S`.
pub struct Ref<T, S = Vmem> {
    pub(crate) v: Val,
    _t: PhantomData<fn() -> (T, S)>,
}

/// A writable block ref (a kernel output or a scratch buffer) in memory space `S`.
pub struct RefMut<T, S = Vmem> {
    pub(crate) v: Val,
    _t: PhantomData<fn() -> (T, S)>,
}

/// A window of a [`Ref`].
pub struct View<T, S = Vmem> {
    pub(crate) r: Val,
    pub(crate) spec: SliceSpec,
    loc: SourceLoc,
    _t: PhantomData<fn() -> (T, S)>,
}

/// A window of a [`RefMut`].
pub struct ViewMut<T, S = Vmem> {
    pub(crate) r: Val,
    pub(crate) spec: SliceSpec,
    loc: SourceLoc,
    _t: PhantomData<fn() -> (T, S)>,
}

macro_rules! copy_handle {
    ($H:ident) => {
        impl<T, S> Clone for $H<T, S> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T, S> Copy for $H<T, S> {}
        impl<T, S> std::fmt::Debug for $H<T, S> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:?})", stringify!($H), self.v)
            }
        }
    };
}
copy_handle!(Ref);
copy_handle!(RefMut);

/// Whether a kernel parameter is read-only or writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    Ref,
    RefMut,
}

/// A type that can be a `#[tpu_kernel]` parameter.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a kernel parameter",
    label = "kernel parameters are block refs",
    note = "kernel parameters are `Ref<T>` (inputs) and `RefMut<T>` (outputs and scratch); compile-time parameters come last and are bound with `.bind(..)`: `pallas_call(my_kernel.bind(eps))` for `fn my_kernel(x: Ref<f32>, o: RefMut<f32>, eps: f32)`"
)]
pub trait KernelParam: Copy {
    const KIND: ParamKind;
    const DTYPE: DType;
    const SPACE: MemSpace;
    #[doc(hidden)]
    fn from_val(v: Val) -> Self;
    #[doc(hidden)]
    fn to_val(self) -> Val;
}

impl<T: Element, S: MemorySpace> KernelParam for Ref<T, S> {
    const KIND: ParamKind = ParamKind::Ref;
    const DTYPE: DType = T::DTYPE;
    const SPACE: MemSpace = S::SPACE;
    fn from_val(v: Val) -> Self {
        Ref { v, _t: PhantomData }
    }
    fn to_val(self) -> Val {
        self.v
    }
}
impl<T: Element, S: MemorySpace> KernelParam for RefMut<T, S> {
    const KIND: ParamKind = ParamKind::RefMut;
    const DTYPE: DType = T::DTYPE;
    const SPACE: MemSpace = S::SPACE;
    fn from_val(v: Val) -> Self {
        RefMut { v, _t: PhantomData }
    }
    fn to_val(self) -> Val {
        self.v
    }
}

// ---------------------------------------------------------------------------------------------- slicing

/// A dynamic slice `start..start + size` along one dimension (`pl.ds`), optionally strided.
#[derive(Clone, Copy, Debug)]
pub struct Ds {
    start: Arg,
    size: Arg,
    stride: usize,
}

/// `ds(start, size)`: the window `start..start + size`; `start` may be traced (`Scalar<i32>`) or a
/// constant. So may `size` on a window used as a DMA endpoint (Pallas `pl.ds(start, traced_size)`:
/// a copy of a run-time number of rows, checked against the ref when the kernel runs); loads and
/// stores take constant sizes (a vector's shape is static).
#[track_caller]
pub fn ds(start: impl IntoArg<i32>, size: impl IntoArg<i32>) -> Ds {
    Ds {
        start: start.into_arg(),
        size: size.into_arg(),
        stride: 1,
    }
}

impl Ds {
    /// `ds(start, size).stride(k)`: `size` elements `k` apart — `start, start + k, ..` (Pallas
    /// `pl.ds(start, size, stride)`). Loads and stores of VMEM refs take it (`tpu.strided_load` /
    /// `tpu.strided_store`); DMA windows and value slices do not.
    pub fn stride(self, k: usize) -> Ds {
        Ds { stride: k, ..self }
    }
}

/// One dimension of a window.
#[derive(Clone, Copy, Debug)]
#[doc(hidden)]
pub enum SliceDim {
    Full,
    Range {
        start: Arg,
        size: usize,
        /// Elements between consecutive window elements (1: dense).
        stride: usize,
    },
    Index(Arg),
    /// `a..`: from a constant start to the end of the dimension.
    From(usize),
    /// `ds(start, n)` with a traced `n`: a DMA endpoint's run-time size.
    Sized {
        start: Arg,
        size: Val,
        stride: usize,
    },
}

/// A window over all dimensions of a ref.
#[derive(Clone, Debug)]
pub struct SliceSpec(pub(crate) Vec<SliceDim>);

/// One element of a window tuple: `ds(s, n)`, `a..b`, `a..`, `..b`, `..`, or an index (squeezes the
/// dimension).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot index a kernel ref or value",
    label = "not an index",
    note = "each dimension takes `ds(start, size)`, a constant range `a..b`, `a..` or `..b`, `..` (whole dimension) or an integer index (`usize`, `i32`, or a traced `Scalar<i32>` for refs)"
)]
pub trait SliceArg {
    #[doc(hidden)]
    fn slice_dim(self) -> SliceDim;
}
impl SliceArg for Ds {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        match self.size {
            Arg::Lit(n) => SliceDim::Range {
                start: self.start,
                // A negative size is an empty window, refused with the rest.
                size: usize::try_from(n.as_i64()).unwrap_or(0),
                stride: self.stride,
            },
            Arg::Val(size) => SliceDim::Sized {
                start: self.start,
                size,
                stride: self.stride,
            },
        }
    }
}
impl SliceArg for RangeFull {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        SliceDim::Full
    }
}
impl SliceArg for Range<usize> {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        SliceDim::Range {
            start: super::i32_arg(self.start as i128, SourceLoc::caller()),
            size: self.end.saturating_sub(self.start),
            stride: 1,
        }
    }
}
impl SliceArg for RangeTo<usize> {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        (0..self.end).slice_dim()
    }
}
impl SliceArg for RangeFrom<usize> {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        SliceDim::From(self.start)
    }
}
impl SliceArg for usize {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        SliceDim::Index(IntoArg::<i32>::into_arg(self))
    }
}
impl SliceArg for i32 {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        SliceDim::Index(IntoArg::<i32>::into_arg(self))
    }
}
impl SliceArg for Scalar<i32> {
    #[track_caller]
    fn slice_dim(self) -> SliceDim {
        SliceDim::Index(Arg::Val(self.v))
    }
}

/// A tuple of [`SliceArg`]s, one per leading dimension (missing trailing dimensions are taken whole).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot index a kernel ref or value",
    label = "expected an index, or a tuple with one index per leading dimension",
    note = "each dimension takes `ds(start, size)`, a constant range `a..b`, `a..` or `..b`, `..` (whole dimension) or an integer index (`usize`, `i32`, or a traced `Scalar<i32>` for refs), e.g. `x.at((ds(i, 8), ..))`"
)]
pub trait IntoSliceSpec {
    #[doc(hidden)]
    fn into_spec(self) -> SliceSpec;
}
impl<A: SliceArg> IntoSliceSpec for A {
    #[track_caller]
    fn into_spec(self) -> SliceSpec {
        SliceSpec(vec![self.slice_dim()])
    }
}
// Written out (not generated by a macro) so that a wrong index names no macro in rustc's notes.
impl<A: SliceArg> IntoSliceSpec for (A,) {
    #[track_caller]
    fn into_spec(self) -> SliceSpec {
        let (a,) = self;
        SliceSpec(vec![a.slice_dim()])
    }
}
impl<A: SliceArg, B: SliceArg> IntoSliceSpec for (A, B) {
    #[track_caller]
    fn into_spec(self) -> SliceSpec {
        let (a, b) = self;
        SliceSpec(vec![a.slice_dim(), b.slice_dim()])
    }
}
impl<A: SliceArg, B: SliceArg, C: SliceArg> IntoSliceSpec for (A, B, C) {
    #[track_caller]
    fn into_spec(self) -> SliceSpec {
        let (a, b, c) = self;
        SliceSpec(vec![a.slice_dim(), b.slice_dim(), c.slice_dim()])
    }
}
impl<A: SliceArg, B: SliceArg, C: SliceArg, D: SliceArg> IntoSliceSpec for (A, B, C, D) {
    #[track_caller]
    fn into_spec(self) -> SliceSpec {
        let (a, b, c, d) = self;
        SliceSpec(vec![
            a.slice_dim(),
            b.slice_dim(),
            c.slice_dim(),
            d.slice_dim(),
        ])
    }
}
impl<A: SliceArg, B: SliceArg, C: SliceArg, D: SliceArg, E: SliceArg> IntoSliceSpec
    for (A, B, C, D, E)
{
    #[track_caller]
    fn into_spec(self) -> SliceSpec {
        let (a, b, c, d, e) = self;
        SliceSpec(vec![
            a.slice_dim(),
            b.slice_dim(),
            c.slice_dim(),
            d.slice_dim(),
            e.slice_dim(),
        ])
    }
}

/// Resolve a slice spec against a ref shape: the window plus the dynamic start operands to pass.
fn resolve(
    t: &mut super::Tracer,
    shape: &[usize],
    spec: &SliceSpec,
    loc: SourceLoc,
) -> Result<(Window, Vec<crate::ir::ValueId>)> {
    if spec.0.len() > shape.len() {
        return Err(kerr!(
            OutOfBounds,
            "{} indices given for a ref of rank {} (shape {shape:?})",
            spec.0.len(),
            shape.len()
        ));
    }
    if shape.contains(&crate::ir::DYNAMIC) {
        return Err(kerr!(
            Unsupported,
            "a window of a window with a run-time size; take the window of the ref itself"
        ));
    }
    let mut w = Window::full(shape);
    let mut dynamic = Vec::new();
    let mut dynamic_sizes = Vec::new();
    for (d, dim) in spec.0.iter().enumerate() {
        let (start, size, stride, squeeze) = match *dim {
            SliceDim::Full => continue,
            SliceDim::Sized { stride, .. } if stride != 1 => {
                return Err(kerr!(
                    Unsupported,
                    "a window with a run-time size takes stride 1 (dimension {d} has `.stride({stride})`): it is a DMA endpoint, and DMA windows are dense"
                ))
            }
            SliceDim::Sized { .. } if d + 1 == shape.len() => {
                return Err(kerr!(
                    Unsupported,
                    "a run-time size along the last (lane) dimension of a ref of shape {shape:?}: libtpu refuses the copy (\"The contiguous inner slice in the DMA transfer must be divisible by 512 bytes\"); give the rows a run-time size instead"
                ))
            }
            SliceDim::Sized { start, size, .. } => {
                let ty = t.ty(size)?.clone();
                if ty != Type::Scalar(DType::I32) {
                    return Err(kerr!(
                        DType,
                        "a run-time window size must be an i32 scalar, got {ty}"
                    ));
                }
                dynamic_sizes.push(t.check(size)?);
                w.dynamic_sizes[d] = true;
                // At least one element from `start`: the run-time size is checked when the kernel runs.
                (start, 1, 1, false)
            }
            SliceDim::From(s) if s >= shape[d] => {
                return Err(kerr!(
                    OutOfBounds,
                    "slice {s}.. along dimension {d} is out of bounds for the ref shape {shape:?}"
                ))
            }
            SliceDim::From(s) => (
                Arg::Lit(crate::dtype::Literal::from_i64(DType::I32, s as i64)),
                shape[d].saturating_sub(s).max(1),
                1,
                false,
            ),
            SliceDim::Range {
                start,
                size,
                stride,
            } => (start, size, stride, false),
            SliceDim::Index(start) => (start, 1, 1, true),
        };
        if stride == 0 {
            return Err(kerr!(
                OutOfBounds,
                "a window stride must be at least 1, got `.stride(0)` along dimension {d}"
            ));
        }
        // How far the window reaches: `size` elements `stride` apart.
        let extent = size
            .checked_sub(1)
            .and_then(|n| n.checked_mul(stride))
            .and_then(|n| n.checked_add(1))
            .unwrap_or(usize::MAX);
        if size == 0 || extent > shape[d] {
            if stride != 1 && size != 0 && size <= shape[d] {
                return Err(kerr!(
                    OutOfBounds,
                    "a window of {size} elements {stride} apart spans {} elements along dimension {d}, more than the ref shape {shape:?} holds",
                    size.saturating_sub(1).saturating_mul(stride).saturating_add(1)
                ));
            }
            return Err(kerr!(
                OutOfBounds,
                "slice of size {size} along dimension {d} does not fit the ref shape {shape:?}"
            ));
        }
        w.sizes[d] = if w.dynamic_sizes[d] { shape[d] } else { size };
        w.squeezed[d] = squeeze;
        w.strides[d] = stride;
        match start {
            Arg::Lit(l) => {
                let s = l.as_i64();
                if s < 0 || s as usize + extent > shape[d] {
                    let by = match stride {
                        1 => String::new(),
                        k => format!(" (stride {k})"),
                    };
                    return Err(kerr!(
                        OutOfBounds,
                        "slice {s}..{}{by} along dimension {d} is out of bounds for the ref shape {shape:?}",
                        s + extent as i64
                    ));
                }
                w.starts[d] = Start::Static(s as usize);
            }
            Arg::Val(v) => {
                let ty = t.ty(v)?.clone();
                if ty != Type::Scalar(DType::I32) {
                    return Err(kerr!(
                        DType,
                        "a dynamic slice start must be an i32 scalar, got {ty}"
                    ));
                }
                w.starts[d] = Start::Dynamic;
                dynamic.push(t.check(v)?);
            }
        }
    }
    let _ = loc;
    dynamic.extend(dynamic_sizes);
    Ok((w, dynamic))
}

/// Loads and stores move vectors, whose shapes are static: a run-time size is for DMA windows.
fn static_sizes(w: &Window) -> Result<()> {
    match w.dynamic_sizes.iter().position(|d| *d) {
        Some(d) => Err(kerr!(
            Unsupported,
            "a window with a run-time size (dimension {d}) cannot be loaded or stored: vector values have static shapes (Pallas refuses it too); use it as a DMA endpoint (`async_copy(x_hbm.at(ds(i, n)), buf.at(ds(0, n)), sem)`), or load a window of constant size"
        )),
        None => Ok(()),
    }
}

/// libtpu strides sublanes and leading dimensions of refs of 128 lanes, not lanes (Mosaic: "Stride on
/// last dim is not 1", "The last dim size is not 128 in original base memref"; measured with the
/// Pallas twins of `python/tests/test_windows.py`).
fn check_lane_stride(w: &Window, shape: &[usize]) -> Result<()> {
    if w.is_strided() && shape.last() != Some(&128) {
        return Err(kerr!(
            Unsupported,
            "a strided window needs a ref of exactly 128 lanes, got a ref of shape {shape:?} (Mosaic: \"The last dim size is not 128 in original base memref\"); give the strided operand a block or scratch of 128 lanes"
        ));
    }
    match w.strides.last() {
        Some(&k) if k != 1 => Err(kerr!(
            Unsupported,
            "a window strided along its last (lane) dimension (`.stride({k})`) is refused by Mosaic (\"Stride on last dim is not 1\"); stride a leading or the second-to-last dimension, or load the lanes densely"
        )),
        _ => Ok(()),
    }
}

pub(crate) fn load(r: Val, spec: Option<&SliceSpec>, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (shape, d, space) = ref_type(t, r)?;
        let (w, dynamic) = match spec {
            Some(s) => resolve(t, &shape, s, loc)?,
            None => (Window::full(&shape), vec![]),
        };
        check_lane_stride(&w, &shape)?;
        static_sizes(&w)?;
        let vshape = w.value_shape();
        match space {
            MemSpace::Smem if !vshape.is_empty() => {
                return Err(kerr!(
                    Unsupported,
                    "SMEM refs hold scalars: index every dimension to read one element (`r.at((i, j)).load()` on a ref of shape {shape:?}); vectors live in VMEM"
                ))
            }
            MemSpace::Vmem if vshape.is_empty() => {
                return Err(kerr!(
                    Unsupported,
                    "loading a single element from a VMEM ref (shape {shape:?}) is not supported by Mosaic; keep scalars in SMEM — pass them as scalar prefetch (`.scalar_prefetch(..)`, a `Ref<i32, Smem>` parameter) or an SMEM scratch (`.scratch(Smem::new(..))`) — and read them with `r.at((i, j)).load()`"
                ))
            }
            MemSpace::Any | MemSpace::Sem(_) => {
                return Err(kerr!(
                    Unsupported,
                    "an ANY (HBM) ref cannot be loaded; copy it into VMEM by DMA first"
                ))
            }
            _ => {}
        }
        let ty = if vshape.is_empty() {
            Type::Scalar(d)
        } else {
            Type::Vector(vshape, d)
        };
        let mut operands = vec![t.check(r)?];
        operands.extend(dynamic);
        Ok(t.push1(OpKind::Load(w), operands, ty, loc))
    })
}

pub(crate) fn store(
    r: Val,
    spec: Option<&SliceSpec>,
    value: Stored,
    mask: Option<Val>,
    loc: SourceLoc,
) {
    with(loc, |t| {
        let (shape, d, space) = ref_type(t, r)?;
        let (w, dynamic) = match spec {
            Some(s) => resolve(t, &shape, s, loc)?,
            None => (Window::full(&shape), vec![]),
        };
        check_lane_stride(&w, &shape)?;
        static_sizes(&w)?;
        let vshape = w.value_shape();
        let target = match space {
            MemSpace::Smem if vshape.is_empty() => Type::Scalar(d),
            MemSpace::Smem => {
                return Err(kerr!(
                    Unsupported,
                    "SMEM refs hold scalars: index every dimension to write one element (`r.at((i, j)).store(v)` on a ref of shape {shape:?})"
                ))
            }
            MemSpace::Any | MemSpace::Sem(_) => {
                return Err(kerr!(
                    Unsupported,
                    "an ANY (HBM) ref cannot be stored to; write a VMEM buffer and copy it by DMA"
                ))
            }
            MemSpace::Vmem => Type::Vector(vshape.clone(), d),
        };
        let arg = match value {
            Stored::Arg(a) => a,
            Stored::Fill(f) => Arg::Lit(crate::dtype::Literal::from_f64(d, f)),
        };
        if let Arg::Val(v) = arg {
            let vt = t.ty(v)?.clone();
            if vt.dtype() != d {
                return Err(kerr!(
                    DType,
                    "storing {} values into a {d} ref; cast with `.cast::<{d}>()` first",
                    vt.dtype()
                ));
            }
            if space == MemSpace::Smem && vt != target {
                return Err(kerr!(
                    Shape,
                    "an SMEM element takes a scalar, got a value of type {vt}"
                ));
            }
            if let Type::Vector(s, _) = &vt {
                if *s != vshape {
                    return Err(kerr!(
                        Shape,
                        "storing a value of shape {s:?} into a window of shape {vshape:?}"
                    ));
                }
            }
        }
        if mask.is_some() && w.is_strided() {
            return Err(kerr!(
                Unsupported,
                "a masked store into a strided window is not supported by Mosaic (Pallas refuses it too: `tpu.strided_store` takes no mask); load the window, `select` with the mask, and store it unmasked"
            ));
        }
        let value = t.materialize(arg, &target, loc)?;
        let mut operands = vec![t.check(r)?, value];
        operands.extend(dynamic);
        if let Some(m) = mask {
            let mt = t.ty(m)?.clone();
            if mt != Type::Vector(vshape.clone(), DType::Bool) {
                return Err(kerr!(
                    Shape,
                    "store mask must be a bool array of shape {vshape:?}, got {mt}"
                ));
            }
            operands.push(t.check(m)?);
        }
        t.push(
            OpKind::Store {
                window: w,
                masked: mask.is_some(),
            },
            operands,
            vec![],
            vec![],
            loc,
        );
        Ok(())
    });
}

/// A window of ref `r` as a ref (a `RefView` op), or `r` itself without a window: a DMA endpoint or
/// one semaphore of an array.
pub(crate) fn view_in(
    t: &mut super::Tracer,
    r: Val,
    spec: Option<&SliceSpec>,
    loc: SourceLoc,
) -> Result<crate::ir::ValueId> {
    let Some(spec) = spec else {
        return t.check(r);
    };
    let (v, _) = window_ref(t, r, spec, loc)?;
    t.check(v)
}

/// A window of ref `r` as a ref (a `RefView` op), with its window.
pub(crate) fn window_ref(
    t: &mut super::Tracer,
    r: Val,
    spec: &SliceSpec,
    loc: SourceLoc,
) -> Result<(Val, Window)> {
    let (shape, d, space) = ref_type(t, r)?;
    let (w, dynamic) = resolve(t, &shape, spec, loc)?;
    if let Some(k) = w.strides.iter().position(|k| *k != 1) {
        return Err(kerr!(
            Unsupported,
            "a strided window (`.stride({})` along dimension {k}) cannot be a DMA endpoint or select semaphores: Mosaic slices refs densely (Pallas refuses `pl.ds(.., stride)` in a copy too); copy the dense rows and load them with the stride from VMEM",
            w.strides[k]
        ));
    }
    let ty = Type::Ref(w.value_shape(), d, space);
    let mut operands = vec![t.check(r)?];
    operands.extend(dynamic);
    let v = t.push1(OpKind::RefView(w.clone()), operands, ty, loc);
    Ok((v, w))
}

pub(crate) fn ref_type(t: &super::Tracer, r: Val) -> Result<(Vec<usize>, DType, MemSpace)> {
    match t.ty(r)? {
        Type::Ref(s, d, m) => Ok((s.clone(), *d, *m)),
        other => Err(kerr!(Trace, "expected a ref, got {other}")),
    }
}

fn ref_shape(r: Val, loc: SourceLoc) -> Vec<usize> {
    with(loc, |t| Ok(ref_type(t, r)?.0)).unwrap_or_default()
}

/// What `store` accepts: arrays, scalars and literals of the ref's element type, or `zeros()`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored into a ref of `{T}`",
    note = "store an Array<{T}> (cast with `.cast::<{T}>()`), a Scalar<{T}>, a literal, or `zeros()`"
)]
pub trait IntoStored<T> {
    #[doc(hidden)]
    fn into_stored(self) -> Stored;
}
#[doc(hidden)]
pub enum Stored {
    Arg(Arg),
    Fill(f64),
}
impl<T> IntoStored<T> for Array<T> {
    fn into_stored(self) -> Stored {
        Stored::Arg(Arg::Val(self.v))
    }
}
impl<T> IntoStored<T> for Scalar<T> {
    fn into_stored(self) -> Stored {
        Stored::Arg(Arg::Val(self.v))
    }
}
impl<T: Element> IntoStored<T> for T {
    fn into_stored(self) -> Stored {
        Stored::Arg(Arg::Lit(self.literal()))
    }
}
impl IntoStored<half::bf16> for f32 {
    fn into_stored(self) -> Stored {
        Stored::Arg(IntoArg::<half::bf16>::into_arg(self))
    }
}
impl<T> IntoStored<T> for super::api::Fill {
    fn into_stored(self) -> Stored {
        Stored::Fill(self.0)
    }
}

macro_rules! ref_read_api {
    ($H:ident, $V:ident) => {
        impl<T: Element, S: MemorySpace> $H<T, S> {
            /// The block shape the kernel sees.
            #[track_caller]
            pub fn shape(self) -> Vec<usize> {
                ref_shape(self.v, SourceLoc::caller())
            }
            pub fn dtype(self) -> DType {
                T::DTYPE
            }
        }
        impl<T: Element> $H<T, Vmem> {
            /// Load the whole block.
            #[track_caller]
            pub fn load(self) -> Array<T> {
                Array::from_val(load(self.v, None, SourceLoc::caller()))
            }
        }
        impl<T: Element> $V<T, Vmem> {
            /// Load this window (integer-indexed dimensions are dropped).
            #[track_caller]
            pub fn load(&self) -> Array<T> {
                let _ = self.loc;
                Array::from_val(load(self.r, Some(&self.spec), SourceLoc::caller()))
            }
        }
        impl<T: Element> $V<T, Smem> {
            /// Read one element of an SMEM ref (`idx_ref[i]`): a traced scalar, usable as an index,
            /// a loop bound or a condition. Every dimension must be indexed by an integer.
            #[track_caller]
            pub fn load(&self) -> Scalar<T> {
                Scalar::from_val(load(self.r, Some(&self.spec), SourceLoc::caller()))
            }
        }
    };
}
ref_read_api!(Ref, View);
ref_read_api!(RefMut, ViewMut);

// `at` is written out per ref type (not generated by `ref_read_api!`) so that a wrong index reports
// the library's message without a macro backtrace.
impl<T: Element, S: MemorySpace> Ref<T, S> {
    /// A window of this ref: `r.at((ds(start, 8), ..))`; on an SMEM ref, one element: `r.at((i, j))`.
    #[track_caller]
    pub fn at(self, idx: impl IntoSliceSpec) -> View<T, S> {
        View {
            r: self.v,
            spec: idx.into_spec(),
            loc: SourceLoc::caller(),
            _t: PhantomData,
        }
    }
}
impl<T: Element, S: MemorySpace> RefMut<T, S> {
    /// A window of this ref: `r.at((ds(start, 8), ..))`; on an SMEM ref, one element: `r.at((i, j))`.
    #[track_caller]
    pub fn at(self, idx: impl IntoSliceSpec) -> ViewMut<T, S> {
        ViewMut {
            r: self.v,
            spec: idx.into_spec(),
            loc: SourceLoc::caller(),
            _t: PhantomData,
        }
    }
}

/// Only writable refs can be stored to; this bound is what turns `x.store(..)` on a read-only [`Ref`] into a
/// compile error that says what to do.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "cannot store into `{Self}`: kernel inputs are read-only",
    label = "`Ref<T>` parameters are read-only inputs",
    note = "store results into an output or scratch parameter declared `RefMut<T>`, e.g. `o: RefMut<f32>` and `o.store(..)`"
)]
pub trait Writable {}
impl<T, S> Writable for RefMut<T, S> {}

/// Only VMEM refs load and store whole vectors; this bound turns `r.load()` / `r.store(..)` on an SMEM
/// or ANY ref into a compile error that says what to do.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot load or store vectors: only VMEM refs can",
    label = "not a VMEM ref",
    note = "an SMEM ref holds scalars: read or write one element with `r.at((i, j)).load()` / `.store(v)`; an ANY (HBM) ref is reached by DMA only: copy a window into a VMEM scratch buffer first"
)]
pub trait VectorMemory {}
impl<T> VectorMemory for Ref<T, Vmem> {}
impl<T> VectorMemory for RefMut<T, Vmem> {}

/// The memory spaces whose refs hold no vectors (SMEM: scalars; ANY: DMA only).
#[doc(hidden)]
pub trait NoVectors: MemorySpace {}
impl NoVectors for Smem {}
impl NoVectors for Any {}

impl<T: Element, S: NoVectors> Ref<T, S> {
    /// Not callable: only VMEM refs load vectors (the `VectorMemory` bound never holds here). It
    /// exists so that `r.load()` explains that, instead of "no method named `load`".
    #[doc(hidden)]
    pub fn load(self) -> Array<T>
    where
        Self: VectorMemory,
    {
        unreachable!("VectorMemory is implemented for VMEM refs only")
    }
}

impl<T: Element, S: NoVectors> RefMut<T, S> {
    /// Not callable: only VMEM refs load vectors (see `VectorMemory`).
    #[doc(hidden)]
    pub fn load(self) -> Array<T>
    where
        Self: VectorMemory,
    {
        unreachable!("VectorMemory is implemented for VMEM refs only")
    }
    /// Not callable: only VMEM refs store vectors (see `VectorMemory`).
    #[doc(hidden)]
    pub fn store(self, value: impl IntoStored<T>)
    where
        Self: VectorMemory,
    {
        let _ = value;
    }
}

impl<T: Element> Ref<T, Vmem> {
    /// Not callable: inputs are read-only (the `Writable` bound never holds for a `Ref`). It exists so that
    /// `x.store(..)` on an input explains that, instead of "no method named `store`".
    #[doc(hidden)]
    pub fn store(self, value: impl IntoStored<T>)
    where
        Self: Writable,
    {
        let _ = value;
    }
}

impl<T: Element> RefMut<T, Vmem> {
    /// Store a value into the whole block (`o_ref[...] = value`); scalars and literals are broadcast.
    #[track_caller]
    pub fn store(self, value: impl IntoStored<T>) {
        store(self.v, None, value.into_stored(), None, SourceLoc::caller())
    }
    /// Store only where `mask` is true.
    #[track_caller]
    pub fn store_masked(self, value: impl IntoStored<T>, mask: Array<bool>) {
        store(
            self.v,
            None,
            value.into_stored(),
            Some(mask.v),
            SourceLoc::caller(),
        )
    }
}

impl<T: Element> ViewMut<T, Smem> {
    /// Write one element of an SMEM ref (`r[i, j] = value`): a scalar or a literal.
    #[track_caller]
    pub fn store(&self, value: impl IntoArg<T>) {
        store(
            self.r,
            Some(&self.spec),
            Stored::Arg(value.into_arg()),
            None,
            SourceLoc::caller(),
        )
    }
}

impl<T: Element> ViewMut<T, Vmem> {
    /// Store into this window.
    #[track_caller]
    pub fn store(&self, value: impl IntoStored<T>) {
        store(
            self.r,
            Some(&self.spec),
            value.into_stored(),
            None,
            SourceLoc::caller(),
        )
    }
    /// Store into this window where `mask` is true.
    #[track_caller]
    pub fn store_masked(&self, value: impl IntoStored<T>, mask: Array<bool>) {
        store(
            self.r,
            Some(&self.spec),
            value.into_stored(),
            Some(mask.v),
            SourceLoc::caller(),
        )
    }
}

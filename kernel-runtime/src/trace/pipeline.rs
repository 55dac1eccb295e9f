//! A nested, double-buffered pipeline over a sub-grid, inside a kernel (Pallas's
//! `pltpu.emit_pipeline`): the kernel's HBM (ANY) arrays are walked block by block — each input block
//! DMA'd into one slot of a two-slot VMEM buffer while the next streams into the other, a body mapping
//! the loaded blocks to output blocks, each output block DMA'd back while the next is computed.
//!
//! The pipeline is described where closures are at home, in the launch code, and handed to the kernel
//! as a compile-time parameter:
//!
//! ```ignore
//! #[kernel_fn]
//! fn scale_block(x: Array<f32>) -> Array<f32> {
//!     x * 2.0
//! }
//!
//! #[tpu_kernel]
//! fn kernel(x_hbm: Ref<f32, Any>, o_hbm: RefMut<f32, Any>, pipe: Pipeline) {
//!     pipe.run(scale_block, (x_hbm,), (o_hbm,));
//! }
//!
//! let pipe = Pipeline::new([m / 8])
//!     .input(BlockSpec::new([8, n], |[j]| (j, 0)))
//!     .output(BlockSpec::new([8, n], |[j]| (j, 0)));
//! pallas_call(kernel.bind(pipe)).input_any(x).output_any(o).build()?;
//! ```
//!
//! The schedule, for inner steps `j = 0..n` (slot `j % 2`): step 0's inputs are started before the
//! loop; step `j` starts step `j + 1`'s inputs, waits for its own, waits for the output copy of step
//! `j - 2` (whose slot it reuses), runs the body, stores the results and starts their copies; after the
//! loop the last two output copies are waited for. The buffers and semaphores are scoped to the
//! pipeline (`tpu.region`).

use super::array::{Array, Scalar};
use super::control::{for_range, if_else, TraceOrd};
use super::dma::{scoped_with, AsyncCopy, DmaSem, Endpoint};
use super::refs::{load, store, KernelParam, SliceDim, SliceSpec, Stored};
use super::{with, Arg, Val};
use crate::dtype::DType;
use crate::error::{kerr, SourceLoc};
use crate::ir::{MemSpace, OpKind, SemKind, Type};
use crate::launch::{BlockSpec, IndexVal};
use std::rc::Rc;

/// A nested pipeline: an inner grid and one [`BlockSpec`] per input and per output (index maps over the
/// inner grid's index). Cheap to clone; bind it to the kernel with `kernel.bind(pipe)`.
#[derive(Clone)]
pub struct Pipeline {
    grid: Vec<usize>,
    inputs: Vec<Rc<BlockSpec<'static>>>,
    outputs: Vec<Rc<BlockSpec<'static>>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pipeline(grid {:?}, {} inputs, {} outputs)",
            self.grid,
            self.inputs.len(),
            self.outputs.len()
        )
    }
}

/// The refs a pipeline walks: one ref, or a tuple of them (the kernel's ANY arrays).
pub trait PipeRefs {
    #[doc(hidden)]
    fn vals(self) -> Vec<Val>;
}
macro_rules! pipe_refs {
    ($($n:ident),*) => {
        impl<$($n: KernelParam),*> PipeRefs for ($($n,)*) {
            #[allow(non_snake_case)]
            fn vals(self) -> Vec<Val> {
                let ($($n,)*) = self;
                vec![$($n.to_val()),*]
            }
        }
    };
}
pipe_refs!(A);
pipe_refs!(A, B);
pipe_refs!(A, B, C);
pipe_refs!(A, B, C, D);

/// A pipeline body: a `#[kernel_fn]` from the loaded input blocks to the output blocks —
/// `fn(Array<A>) -> Array<R>`, `fn(Array<A>, Array<B>) -> Array<R>`, ..., or with a tuple of outputs.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a pipeline body",
    note = "a pipeline body maps the input blocks to the output blocks: `fn body(x: Array<f32>, y: Array<f32>) -> Array<f32>` (a `#[kernel_fn]`), or `-> (Array<f32>, Array<i32>)` for two outputs"
)]
pub trait PipeBody<Args> {
    #[doc(hidden)]
    fn apply(&self, inputs: &[Val]) -> Vec<Val>;
}
macro_rules! pipe_body_1 {
    ($($a:ident),*) => {
        impl<Func, R, $($a),*> PipeBody<(($($a,)*), Array<R>)> for Func
        where
            Func: Fn($(Array<$a>),*) -> Array<R>,
        {
            #[allow(non_snake_case, unused_variables, unused_mut)]
            fn apply(&self, inputs: &[Val]) -> Vec<Val> {
                let mut it = inputs.iter().copied();
                $(let $a = Array::<$a>::from_val(it.next().unwrap_or(Val::POISON));)*
                vec![self($($a),*).val()]
            }
        }
    };
}
pipe_body_1!(A);
pipe_body_1!(A, B);
pipe_body_1!(A, B, C);
macro_rules! pipe_body_2 {
    ($($a:ident),*) => {
        impl<Func, R, S, $($a),*> PipeBody<(($($a,)*), (Array<R>, Array<S>))> for Func
        where
            Func: Fn($(Array<$a>),*) -> (Array<R>, Array<S>),
        {
            #[allow(non_snake_case, unused_variables, unused_mut)]
            fn apply(&self, inputs: &[Val]) -> Vec<Val> {
                let mut it = inputs.iter().copied();
                $(let $a = Array::<$a>::from_val(it.next().unwrap_or(Val::POISON));)*
                let (r, s) = self($($a),*);
                vec![r.val(), s.val()]
            }
        }
    };
}
pipe_body_2!(A);
pipe_body_2!(A, B);

impl Pipeline {
    /// A pipeline over an inner grid of one axis (`grid=(n,)`).
    pub fn new(grid: impl AsRef<[usize]>) -> Pipeline {
        Pipeline {
            grid: grid.as_ref().to_vec(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }
    /// The next input's blocks (`in_specs`), its index map over the inner grid.
    pub fn input(mut self, spec: BlockSpec<'static>) -> Pipeline {
        self.inputs.push(Rc::new(spec));
        self
    }
    /// The next output's blocks (`out_specs`).
    pub fn output(mut self, spec: BlockSpec<'static>) -> Pipeline {
        self.outputs.push(Rc::new(spec));
        self
    }

    /// Run the pipeline over `inputs` and `outputs` (refs of the kernel, usually ANY arrays), with
    /// `body` mapping each step's input blocks to its output blocks.
    #[track_caller]
    pub fn run<Args>(
        &self,
        body: impl PipeBody<Args>,
        inputs: impl PipeRefs,
        outputs: impl PipeRefs,
    ) {
        let loc = SourceLoc::caller();
        let (ins, outs) = (inputs.vals(), outputs.vals());
        let Some(layout) = with(loc, |t| self.layout(t, &ins, &outs)) else {
            return;
        };
        let Layout { buffers, steps } = layout;
        let (ni, no) = (ins.len(), outs.len());
        let mut types = buffers.clone();
        types.extend(
            (0..ni + no).map(|_| Type::Ref(vec![2], DType::I32, MemSpace::Sem(SemKind::Dma))),
        );
        scoped_with(&types, loc, |scoped| {
            let (bufs, sems) = scoped.split_at(ni + no);
            let copy = |k: usize, j: Scalar<i32>, slot: Scalar<i32>| -> AsyncCopy {
                let (hbm, spec) = if k < ni {
                    (ins[k], &self.inputs[k])
                } else {
                    (outs[k - ni], &self.outputs[k - ni])
                };
                let window = hbm_window(spec, j);
                let slot_view = Endpoint {
                    r: bufs[k],
                    spec: Some(SliceSpec(
                        std::iter::once(SliceDim::Index(Arg::Val(slot.val())))
                            .chain(spec.shape.iter().map(|_| SliceDim::Full))
                            .collect(),
                    )),
                };
                let hbm_view = Endpoint {
                    r: hbm,
                    spec: Some(window),
                };
                let sem = DmaSem { v: sems[k] }.at(slot);
                if k < ni {
                    AsyncCopy {
                        src: hbm_view,
                        dst: slot_view,
                        sem,
                    }
                } else {
                    AsyncCopy {
                        src: slot_view,
                        dst: hbm_view,
                        sem,
                    }
                }
            };
            let constant = |v: usize| super::api::scalar(v as i32);
            // Prologue: the first step's inputs.
            for k in 0..ni {
                copy(k, constant(0), constant(0)).issue(OpKind::DmaStart, loc);
            }
            for_range(0, steps as i32, (), |j, ()| {
                let slot = j % 2i32;
                let next = (j + 1i32) % 2i32;
                if_else(
                    (j + 1i32).trace_lt(steps as i32),
                    (),
                    |()| {
                        for k in 0..ni {
                            copy(k, j + 1i32, next).issue(OpKind::DmaStart, loc);
                        }
                        ((), ())
                    },
                    |()| ((), ()),
                );
                for k in 0..ni {
                    copy(k, j, slot).issue(OpKind::DmaWait, loc);
                }
                if_else(
                    j.trace_ge(2i32),
                    (),
                    |()| {
                        for k in ni..ni + no {
                            copy(k, j - 2i32, slot).issue(OpKind::DmaWait, loc);
                        }
                        ((), ())
                    },
                    |()| ((), ()),
                );
                let slot_spec = |rank: usize| {
                    SliceSpec(
                        std::iter::once(SliceDim::Index(Arg::Val(slot.val())))
                            .chain((0..rank).map(|_| SliceDim::Full))
                            .collect(),
                    )
                };
                let loaded: Vec<Val> = (0..ni)
                    .map(|k| load(bufs[k], Some(&slot_spec(self.inputs[k].shape.len())), loc))
                    .collect();
                let results = body.apply(&loaded);
                for (k, v) in results.iter().enumerate().take(no) {
                    let spec = slot_spec(self.outputs[k].shape.len());
                    store(
                        bufs[ni + k],
                        Some(&spec),
                        Stored::Arg(Arg::Val(*v)),
                        None,
                        loc,
                    );
                }
                with(loc, |_| {
                    if results.len() != no {
                        return Err(kerr!(
                            Signature,
                            "the pipeline body returns {} blocks but the pipeline has {no} outputs",
                            results.len()
                        ));
                    }
                    Ok(())
                });
                for k in ni..ni + no {
                    copy(k, j, slot).issue(OpKind::DmaStart, loc);
                }
            });
            // Epilogue: the last two output copies.
            for last in [steps.checked_sub(2), steps.checked_sub(1)]
                .into_iter()
                .flatten()
            {
                for k in ni..ni + no {
                    copy(k, constant(last), constant(last % 2)).issue(OpKind::DmaWait, loc);
                }
            }
        });
    }

    /// The double buffers (one `[2, *block]` VMEM buffer per input, then per output) and the step
    /// count, after checking the pipeline against the refs it is given.
    fn layout(&self, t: &super::Tracer, ins: &[Val], outs: &[Val]) -> crate::error::Result<Layout> {
        let [steps] = self.grid[..] else {
            return Err(kerr!(
                Grid,
                "a pipeline runs over a grid of one axis, got {:?}",
                self.grid
            ));
        };
        if steps == 0 || steps > i32::MAX as usize {
            return Err(kerr!(Grid, "a pipeline of {steps} steps"));
        }
        if ins.len() != self.inputs.len() || outs.len() != self.outputs.len() {
            return Err(kerr!(
                Signature,
                "the pipeline declares {} inputs and {} outputs but is run on {} and {}",
                self.inputs.len(),
                self.outputs.len(),
                ins.len(),
                outs.len()
            ));
        }
        let mut buffers = Vec::new();
        for (k, (v, spec)) in ins
            .iter()
            .zip(&self.inputs)
            .chain(outs.iter().zip(&self.outputs))
            .enumerate()
        {
            let Type::Ref(shape, d, space) = t.ty(*v)?.clone() else {
                return Err(kerr!(Trace, "pipeline operand {k} is not a ref"));
            };
            if matches!(space, MemSpace::Sem(_)) {
                return Err(kerr!(Signature, "pipeline operand {k} is a semaphore"));
            }
            if spec.grid_rank != 1 || spec.prefetch.is_some() {
                return Err(kerr!(
                    Grid,
                    "the index map of pipeline operand {k} must take the one inner grid index"
                ));
            }
            if spec.squeezed.iter().any(|s| *s) || spec.shape.len() != shape.len() {
                return Err(kerr!(
                    Grid,
                    "pipeline operand {k}: block {:?} for an array of shape {shape:?} (same rank, no squeezed dims)",
                    spec.shape
                ));
            }
            if spec
                .shape
                .iter()
                .zip(&shape)
                .any(|(b, n)| *b == 0 || n % b != 0)
            {
                return Err(kerr!(
                    Tiling,
                    "pipeline operand {k}: block {:?} does not tile the array {shape:?}",
                    spec.shape
                ));
            }
            let mut b = vec![2];
            b.extend(&spec.shape);
            buffers.push(Type::Ref(b, d, MemSpace::Vmem));
        }
        Ok(Layout { buffers, steps })
    }
}

struct Layout {
    buffers: Vec<Type>,
    steps: usize,
}

/// The window of step `j` of an operand: its index map's block indices times the block shape.
fn hbm_window(spec: &BlockSpec<'static>, j: Scalar<i32>) -> SliceSpec {
    let idx = (spec.index_map)(&[j], &[]);
    SliceSpec(
        idx.iter()
            .zip(&spec.shape)
            .map(|(i, &b)| {
                let start = match *i {
                    IndexVal::Const(c) => {
                        Arg::Lit(crate::dtype::Literal::from_i64(DType::I32, c * b as i64))
                    }
                    IndexVal::Traced(v) => Arg::Val((Scalar::<i32>::from_val(v) * b as i32).val()),
                };
                SliceDim::Range {
                    start,
                    size: b,
                    stride: 1,
                }
            })
            .collect(),
    )
}

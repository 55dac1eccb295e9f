//! Runs one grid step of a kernel body by its execution plan ([`super::plan`]): an environment of
//! values, the refs of this step, and one rule per op. Values are freed after their last use (the
//! plan's liveness), so partial stores into a ref rarely have to copy it.

use super::elementwise::{self, with_dtype, RawDest, Sink};
use super::plan::{Chain, HalfCast, Plan, WordHalf};
use super::reduce::reduce;
use super::tensor::{for_each_row, internal, recycle, row_major_strides, Buf, Dims, Tensor};
use crate::dtype::{DType, Literal};
use crate::error::{kerr, Result};
use crate::ir::{ArgKind, Func, Op, OpKind, Region, Start, ValueId, Window};
use crate::semantics::host::{HostData, HostElement};

mod dma;
mod dots;
mod halves;
mod landing;
mod loops;
mod refs;
mod remote;
mod scalars;
mod sinks;
mod split;
mod values;
mod view_memo;
mod views;
mod walk;
pub(crate) use dma::{DmaModel, Peer, RefView, Sem};
pub(crate) use landing::background_landings;
use refs::copy_row;
use refs::read_dest;
pub(crate) use refs::{write_view, write_view_raw};
pub(crate) use view_memo::views_made;

#[derive(Clone, Debug)]
pub(crate) enum Value {
    T(Tensor),
    Ref(usize),
    /// An elementwise result already written into its ref's output block (see [`Plan`]); its only
    /// use is the full store into that ref.
    Sunk,
    /// A window of a ref, as a DMA endpoint or one semaphore of an array. (Boxed: a `Value` is then
    /// no larger than a `Tensor`, 128 bytes, which every op's result is moved as without a `memcpy`
    /// call.)
    View(Box<RefView>),
}

/// An op's results, a region's yielded values: almost always one (or none), held inline — the
/// region loop runs thousands of ops a call, and a list on the heap per op showed in its profile.
pub(super) type Values = smallvec::SmallVec<[Value; 1]>;

/// A kernel ref during a grid step: its block contents, or nothing yet (reads see the fill value).
#[derive(Debug)]
pub(crate) struct RefState {
    pub dtype: DType,
    /// (Inline, and the label shared: a split loop clones every ref's state for each of its
    /// machines, once per run of the loop.)
    pub shape: crate::semantics::dma::Dims,
    pub content: Option<Tensor>,
    pub label: std::sync::Arc<str>,
    /// The current output block holds this ref's contents in the output array itself.
    pub written_through: bool,
    /// A pipelined block (replaced or written back between grid steps), not a whole array or scratch.
    pub blocked: bool,
}

/// (The shape copied, not collected element by element as smallvec's `clone` does: a split loop
/// clones every ref's state for each of its machines.)
impl Clone for RefState {
    fn clone(&self) -> RefState {
        RefState {
            dtype: self.dtype,
            shape: crate::semantics::dma::Dims::from_slice(&self.shape),
            content: self.content.clone(),
            label: self.label.clone(),
            written_through: self.written_through,
            blocked: self.blocked,
        }
    }
}

/// What uninitialized memory reads as: zeros, or with poisoning NaN / a bit pattern.
pub(crate) fn fill_literal(d: DType, poison: bool) -> Literal {
    if !poison {
        return Literal::zero(d);
    }
    let bits = match d {
        DType::F32 => f32::NAN.to_bits() as u64,
        DType::BF16 => 0x7FC0,
        DType::I32 | DType::U32 => 0xDEAD_BEEF,
        DType::I8 | DType::U8 => 0xBE,
        DType::Bool => 1,
        DType::F16 => 0x7E00,
        DType::F8E4M3FN => 0x7F,
        DType::F8E5M2 => 0x7E,
        DType::I4 => 0x8, // -8
    };
    Literal { dtype: d, bits }
}

pub(crate) struct Machine<'k> {
    func: &'k Func,
    poison: bool,
    env: Vec<Option<Value>>,
    pub refs: Vec<RefState>,
    /// Per ref: the current output block inside the output array, when it may be written directly.
    pub dests: Vec<Option<RawDest>>,
    /// Copies in flight and semaphore counts.
    pub dma: DmaModel,
    /// In an SPMD run ([`super::spmd`]): this device's link to the others, the data of copies
    /// received and not yet landed (by tag), and the barrier semaphore's ref.
    link: Option<std::sync::Arc<super::spmd::Link>>,
    received: std::collections::HashMap<u64, Tensor>,
    barrier: usize,
    /// The segments of recently read or written view windows (shared with the machines a split loop
    /// forks).
    segments: std::sync::Arc<walk::SegmentCache>,
    /// The epoch of the views this thread keeps for this machine (`view_memo.rs`).
    epoch: u64,
    /// Threads a split loop may run on (`split.rs`); 1 where the grid is already split across them.
    loop_threads: usize,
    /// Copies landing in the background (`landing.rs`).
    landing: landing::Background,
}

/// A `for` loop's `(lo, hi, step)`, body, body plan and induction variable type ([`Machine::loop_parts`]).
type LoopParts<'o> = ((i64, i64, i64), &'o Region, &'o Plan, DType);

/// A machine's ref contents go back to the buffer pool when it ends (the scratch of the next call, or
/// of the next split loop's iterations, reuses them), and its value table, emptied, to its thread's
/// spare (`value_table`).
impl Drop for Machine<'_> {
    fn drop(&mut self) {
        // Nothing may still write into the buffers given back below (an error was reported already
        // or the run is being abandoned).
        let _ = self.settle_landing();
        for r in &mut self.refs {
            if let Some(t) = r.content.take() {
                recycle(t);
            }
        }
        let mut env = std::mem::take(&mut self.env);
        // Emptied in place, its length kept: the next machine of this size takes it as it is.
        for v in env.iter_mut().filter(|v| v.is_some()) {
            *v = None;
        }
        // (Not during the thread's own teardown, when its locals are gone.)
        let _ = SPARE_ENV.try_with(|spare| spare.set(env));
    }
}

thread_local! {
    /// The value table of the last machine this thread dropped, every entry emptied.
    static SPARE_ENV: std::cell::Cell<Vec<Option<Value>>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A value table of `n` empty entries, in the allocation of the last machine this thread dropped:
/// a split loop makes a machine per thread per run (572 entries of 128 bytes for ragged paged
/// attention, once per sequence), and in a process whose heap XLA has fragmented, a fresh
/// allocation that size searches malloc's bins (measured: `_int_malloc` 1.3% → 6.6% of the JAX op's
/// samples once tpu-inference's reference had been compiled in the process).
pub(super) fn value_table(n: usize) -> Vec<Option<Value>> {
    let mut env = SPARE_ENV.try_with(|spare| spare.take()).unwrap_or_default();
    // The spare is empty entry by entry (`Drop`); only its length may need to change.
    debug_assert!(env.iter().all(Option::is_none));
    if env.len() != n {
        env.clear();
        env.resize(n, None);
    }
    env
}

impl<'k> Machine<'k> {
    pub fn new(func: &'k Func, mut refs: Vec<RefState>, poison: bool) -> Self {
        let link = super::spmd::current();
        // The barrier semaphore follows the kernel's operands on every device (one numbering).
        let barrier = refs.len();
        if link.is_some() {
            refs.push(RefState {
                dtype: DType::I32,
                shape: Default::default(),
                content: None,
                label: "the barrier semaphore".into(),
                written_through: false,
                blocked: false,
            });
        }
        let dests = refs.iter().map(|_| None).collect();
        Machine {
            func,
            poison,
            env: value_table(func.values.len()),
            refs,
            dests,
            dma: DmaModel::default(),
            link,
            received: std::collections::HashMap::new(),
            segments: Default::default(),
            epoch: view_memo::new_epoch(),
            barrier,
            loop_threads: 1,
            landing: Default::default(),
        }
    }

    /// The threads split loops may run on.
    pub(crate) fn loop_threads(&self) -> usize {
        self.loop_threads
    }

    /// Let split loops run on up to `threads` threads.
    pub fn with_loop_threads(mut self, threads: usize) -> Self {
        self.loop_threads = threads.max(1);
        self
    }

    /// Let copies into this machine's scratch buffers land in the background
    /// (`machine/landing.rs`).
    pub fn with_background_landing(mut self, on: bool) -> Self {
        self.landing.enabled = on;
        self
    }

    /// Run the kernel body once with these grid indices.
    pub fn step(&mut self, plan: &Plan, grid_point: &[i64]) -> Result<()> {
        let mut args = Vec::with_capacity(grid_point.len() + self.refs.len());
        for &g in grid_point {
            args.push(Value::T(Tensor::splat(
                Literal::from_i64(DType::I32, g),
                &[],
            )));
        }
        args.extend((0..self.refs.len()).map(Value::Ref));
        // Copies landing in the background land before anything reads the step's refs, also after
        // an error.
        let ran = self.region(&self.func.body, plan, args);
        let landed = self.settle_landing();
        ran?;
        landed?;
        if !self.dma.idle() {
            self.dma_step_end()?;
        }
        Ok(())
    }

    fn tensor(&self, id: ValueId) -> Result<&Tensor> {
        match self.env.get(id.0 as usize) {
            Some(Some(Value::T(t))) => Ok(t),
            _ => Err(internal(&format!("use of an undefined value %{}", id.0))),
        }
    }

    fn ref_index(&self, id: ValueId) -> Result<usize> {
        match self.env.get(id.0 as usize) {
            Some(Some(Value::Ref(r))) => Ok(*r),
            _ => Err(internal("expected a ref")),
        }
    }

    fn result_shape(&self, op: &Op) -> Result<Vec<usize>> {
        let id = op
            .results
            .first()
            .ok_or_else(|| internal("op without result"))?;
        Ok(self.func.ty(*id).shape().to_vec())
    }

    pub(super) fn region(
        &mut self,
        r: &Region,
        plan: &Plan,
        args: impl IntoIterator<Item = Value>,
    ) -> Result<Values> {
        for (a, v) in r.args.iter().zip(args) {
            self.env[a.0 as usize] = Some(v);
        }
        self.region_ops(r, plan)
    }

    /// The ops of region `r`, its arguments bound; what its terminator yields.
    pub(super) fn region_ops(&mut self, r: &Region, plan: &Plan) -> Result<Values> {
        for (i, op) in r.ops.iter().enumerate() {
            if matches!(op.kind, OpKind::Yield | OpKind::Condition | OpKind::Return) {
                let vals = self.values(&op.operands, "terminator operand")?;
                self.free(&plan.dead_after[i]);
                return Ok(vals);
            }
            if plan.skip[i] {
                continue; // folded into a fused chain that runs at a later op
            }
            if self.landing.pending() && !self.inert_while_landing(op, plan, i) {
                self.settle_landing().map_err(|e| e.at(op.loc))?;
            }
            if self.link.as_ref().is_some_and(|l| l.has_mail()) {
                self.receive().map_err(|e| e.at(op.loc))?;
            }
            if let Some(halves) = &plan.load_halves[i] {
                // The load's words are only split into halves: the casts' results, made here.
                let ts = self.load_halves(op, halves).map_err(|e| e.at(op.loc))?;
                for (c, t) in halves.iter().zip(ts) {
                    let id = r.ops[c.op]
                        .results
                        .first()
                        .ok_or_else(|| internal("a cast without a result").at(op.loc))?;
                    self.env[id.0 as usize] = Some(Value::T(t));
                }
                self.after_op(plan, i, op)?;
                continue;
            }
            if plan.scalar[i] {
                let (id, t) = self.scalar_op(op).map_err(|e| e.at(op.loc))?;
                self.env[id.0 as usize] = Some(Value::T(t));
                self.after_op(plan, i, op)?;
                continue;
            }
            if matches!(
                op.kind,
                OpKind::RefView(_) | OpKind::RefBitcast | OpKind::RefReshape
            ) {
                let (id, v) = self.view_op(op).map_err(|e| e.at(op.loc))?;
                self.env[id.0 as usize] = Some(v);
                self.after_op(plan, i, op)?;
                continue;
            }
            // A select made for this dot's right factor alone runs here (`dots.rs`).
            let keep = self.select_rhs(r, plan, i).map_err(|e| e.at(op.loc))?;
            let results = match (&plan.chain[i], plan.sink_to[i]) {
                (Some(ch), sink) => self.chain(op, ch, sink),
                (None, Some(r)) => self.sunk_op(op, r),
                (None, None) => match (plan.word_half[i], plan.acc_in_place[i], &plan.split[i]) {
                    (Some((w, half)), _, _) => self.word_half(w, half),
                    (None, None, Some(split)) if self.loop_threads > 1 => {
                        self.split_for(op, &plan.sub[i], split)
                    }
                    (None, Some(rf), _) => self.dot_in_place(op, rf, &plan.sub[i], keep),
                    (None, None, _) if plan.acc_owned[i] => {
                        self.dot_owned_acc(op, &plan.sub[i], keep)
                    }
                    (None, None, _) if plan.live_columns[i].is_some() => {
                        self.dot_live_columns(op, plan.live_columns[i], keep)
                    }
                    (None, None, _) if keep.is_some() => self.dot_op(op, &plan.sub[i], keep),
                    (None, None, _) if plan.bitcast_owned[i] => self.bitcast_consuming(op),
                    (None, None, _) => self.op(op, &plan.sub[i]),
                },
            }
            .map_err(|e| e.at(op.loc))?;
            if results.len() != op.results.len() {
                return Err(internal("op produced the wrong number of results").at(op.loc));
            }
            for (id, v) in op.results.iter().zip(results) {
                self.env[id.0 as usize] = Some(v);
            }
            self.after_op(plan, i, op)?;
        }
        Ok(Values::new())
    }

    /// After op `i` of a region: the values dead after it freed; copies land between ops only in a
    /// seeded run (otherwise at their waits).
    fn after_op(&mut self, plan: &Plan, i: usize, op: &Op) -> Result<()> {
        self.free(&plan.dead_after[i]);
        if self.dma.seeded() && !self.dma.idle() {
            self.dma_tick().map_err(|e| e.at(op.loc))?;
        }
        Ok(())
    }

    /// The contents of ref `r` as a tensor (reading back a written-through output block).
    fn contents(&self, r: usize) -> Result<Tensor> {
        let st = &self.refs[r];
        if let Some(t) = &st.content {
            return Ok(t.clone());
        }
        if st.written_through {
            if let Some(d) = &self.dests[r] {
                return read_dest(d);
            }
        }
        Ok(Tensor::splat(
            fill_literal(st.dtype, self.poison),
            &st.shape,
        ))
    }

    fn free(&mut self, ids: &[ValueId]) {
        for v in ids {
            if let Some(Value::T(t)) = &mut self.env[v.0 as usize] {
                super::tensor::recycle_in(t);
            }
            self.env[v.0 as usize] = None;
        }
    }

    fn op(&mut self, op: &Op, sub: &[Plan]) -> Result<Values> {
        self.op_to(op, sub, &Sink::fresh())
    }

    /// Run `op`; an elementwise op writes its result through `sink`.
    fn op_to(&mut self, op: &Op, sub: &[Plan], sink: &Sink<'_>) -> Result<Values> {
        let one = |t: Tensor| Ok(smallvec::smallvec![Value::T(t)]);
        match &op.kind {
            OpKind::Const(l) => one(Tensor::splat(*l, &self.result_shape(op)?)),
            OpKind::Unary(u) => one(elementwise::unary(*u, self.tensor(op.operands[0])?, sink)?),
            OpKind::Composite(c) => Err(internal(&format!(
                "composite `{}` reached the interpreter: `build()` expands composites",
                c.name()
            ))),
            OpKind::Binary(b) => one(elementwise::binary(
                *b,
                self.tensor(op.operands[0])?,
                self.tensor(op.operands[1])?,
                sink,
            )?),
            OpKind::Compare(c) => one(elementwise::compare(
                *c,
                self.tensor(op.operands[0])?,
                self.tensor(op.operands[1])?,
                sink,
            )?),
            OpKind::Select => {
                let [c, a, b] = [0, 1, 2].map(|i| op.operands.get(i).copied());
                let get = |v: Option<ValueId>| {
                    v.ok_or_else(|| internal("select operands"))
                        .and_then(|v| self.tensor(v))
                };
                let (a, b) = (get(a)?, get(b)?);
                let c = get(c)?;
                // A scalar condition (one choice for the whole value) as a broadcast view.
                let c = if c.shape.is_empty() {
                    &c.broadcast_to(&a.shape)?
                } else {
                    c
                };
                one(elementwise::select(c, a, b, sink)?)
            }
            OpKind::Cast(to) => one(elementwise::cast_to(
                self.tensor(op.operands[0])?,
                *to,
                sink,
            )?),
            OpKind::Broadcast => one(self
                .tensor(op.operands[0])?
                .broadcast_to(&self.result_shape(op)?)?),
            OpKind::Iota { dim } => {
                let shape = self.result_shape(op)?;
                let n = *shape.get(*dim).ok_or_else(|| internal("iota dimension"))?;
                let mut strides: Dims = smallvec::smallvec![0; shape.len()];
                strides[*dim] = 1;
                let t = Tensor {
                    dtype: DType::I32,
                    shape: shape.into(),
                    strides,
                    offset: 0,
                    buf: Buf::host(HostData::I32((0..n as i32).collect())),
                };
                let want = self.func.ty(op.results[0]).dtype();
                one(if want == DType::I32 {
                    t
                } else {
                    elementwise::cast(&t, want)?
                })
            }
            OpKind::Reshape => one(self
                .tensor(op.operands[0])?
                .reshape(&self.result_shape(op)?)?),
            OpKind::Transpose { perm } => one(self.tensor(op.operands[0])?.permute(perm)?),
            OpKind::Reduce { kind, axes, .. } => one(reduce(
                self.tensor(op.operands[0])?,
                *kind,
                axes,
                &self.result_shape(op)?,
            )?),
            OpKind::Dot {
                transpose_lhs,
                transpose_rhs,
            } => one(self.dot(op, *transpose_lhs, *transpose_rhs)?),
            OpKind::Load(w) => one(self.load(op, w)?),
            OpKind::Store { window, masked } => {
                self.store(op, window, *masked)?;
                Ok(Values::new())
            }
            // Profiler markers: nothing to compute.
            OpKind::TraceStart(_) | OpKind::TraceStop => Ok(Values::new()),
            OpKind::Scoped => self.scoped(op, sub),
            OpKind::RefView(_) | OpKind::RefBitcast | OpKind::RefReshape => {
                self.view_op(op).map(|(_, v)| smallvec::smallvec![v])
            }
            OpKind::Bitcast => one(views::bitcast_rows(
                self.tensor(op.operands[0])?,
                self.func.ty(op.results[0]).dtype(),
            )?),
            OpKind::DmaStart => self.dma_start(op).map(|_| Values::new()),
            OpKind::DmaWait => self.dma_wait(op).map(|_| Values::new()),
            OpKind::SemSignal | OpKind::SemWait | OpKind::SemRead => self.semaphore_op(op),
            OpKind::AxisIndex { .. }
            | OpKind::RemoteDmaStart
            | OpKind::RemoteDmaWait { .. }
            | OpKind::SemSignalRemote
            | OpKind::BarrierSemaphore => self.remote_op(op),
            OpKind::MultipleOf(_) => one(self.tensor(op.operands[0])?.clone()),
            OpKind::If => {
                let c = self.tensor(op.operands[0])?.scalar_bool()?;
                let i = if c { 0 } else { 1 };
                match (op.regions.get(i), sub.get(i)) {
                    (Some(r), Some(p)) => self.region(r, p, vec![]),
                    _ => Ok(Values::new()),
                }
            }
            OpKind::For => self.for_loop(op, sub),
            OpKind::While => self.while_loop(op, sub),
            OpKind::Yield | OpKind::Condition | OpKind::Return => Ok(Values::new()),
            OpKind::Slice { offsets, sizes } => {
                let t = self.tensor(op.operands[0])?;
                if offsets.len() != t.shape.len() || sizes.len() != t.shape.len() {
                    return Err(internal("slice rank"));
                }
                one(t.window(offsets, sizes, &vec![false; sizes.len()]))
            }
            OpKind::Concatenate { dim } => {
                let parts: Vec<Tensor> = op
                    .operands
                    .iter()
                    .map(|v| self.tensor(*v).cloned())
                    .collect::<Result<_>>()?;
                one(values::concatenate(&parts, *dim, &self.result_shape(op)?)?)
            }
            OpKind::Roll { dim } => {
                let shift = self.tensor(op.operands[1])?.scalar_i64()?;
                one(values::roll(self.tensor(op.operands[0])?, *dim, shift)?)
            }
            OpKind::ArgReduce { kind, dim } => one(values::arg_reduce(
                self.tensor(op.operands[0])?,
                *dim,
                *kind == ArgKind::Max,
            )?),
        }
    }
}

fn single_tensor(mut v: Values) -> Result<Tensor> {
    match v.pop() {
        Some(Value::T(t)) if v.is_empty() => Ok(t),
        _ => Err(internal("elementwise op without a single tensor result")),
    }
}

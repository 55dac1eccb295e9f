//! DMA and semaphores in interpret mode: the ops over [`crate::semantics::dma`]'s model (which copies
//! are in flight, what semaphores hold, what would race or hang on a TPU). This file turns operands
//! into windows and semaphores and moves the data when the model completes a copy.

use super::*;
use crate::semantics::dma::{sem_of, window_bytes, Dims as ViewDims, Refs, Release};
pub(crate) use crate::semantics::dma::{DmaModel, Flags, InFlight, Peer, RefView, Sem};
use crate::semantics::refs::{window_out_of_bounds, window_size_below_one};

/// The bytes one wait's copies must move in all before they are landed across threads
/// ([`Machine::land_across_threads`]): below it, handing half to a helper costs more than it saves.
const PARALLEL_LAND_BYTES: i64 = 64 << 10;

/// A buffer's elements, written by several threads at disjoint offsets.
struct RawSlice<T>(*mut T);
// SAFETY: only `land_across_threads` makes one, and its chunks write disjoint elements.
unsafe impl<T> Sync for RawSlice<T> {}

/// The machine's refs as the DMA model sees them.
impl Refs for [RefState] {
    fn label(&self, r: usize) -> &str {
        &self[r].label
    }
    fn shape(&self, r: usize) -> &[usize] {
        &self[r].shape
    }
    fn blocked(&self, r: usize) -> bool {
        self[r].blocked
    }
    fn elem_bits(&self, r: usize) -> u32 {
        self[r].dtype.bit_width()
    }
}

impl<'k> Machine<'k> {
    /// The view an operand denotes: a whole ref or a window of one.
    pub(super) fn view_of(&self, id: ValueId) -> Result<RefView> {
        Ok(self.view_ref(id)?.into_owned())
    }

    /// The view an operand denotes, borrowed where it is stored (a whole ref's is built).
    pub(super) fn view_ref(&self, id: ValueId) -> Result<std::borrow::Cow<'_, RefView>> {
        use std::borrow::Cow;
        match self.env.get(id.0 as usize) {
            Some(Some(Value::Ref(r))) => Ok(Cow::Owned(RefView::whole(*r, &self.refs[*r].shape))),
            Some(Some(Value::View(v))) => Ok(Cow::Borrowed(v)),
            _ => Err(internal("expected a ref or a view")),
        }
    }

    /// `RefView`: a window of a ref (or of a window), bounds-checked. A window with static starts
    /// and sizes, or one composed through a bitcast or reshape path, is kept per thread with its
    /// base and run-time operands ([`Self::memo_view`]).
    pub(super) fn ref_view(&mut self, op: &Op, w: &Window) -> Result<Value> {
        // The base as it stands (a view is not cloned: only a plain window's narrowing copies it).
        let base = self.view_ref(op.operands[0])?;
        if op.operands.len() > 1 && !view_memo::composes(&base) {
            // A plain window of a plain window (or of one reshape): narrowed in place, no lookup.
            return Ok(Value::View(Box::new(self.window_view(op, w, base)?)));
        }
        let args = op.operands[1..]
            .iter()
            .map(|v| self.tensor(*v)?.scalar_i64())
            .collect::<Result<smallvec::SmallVec<[i64; 4]>>>()?;
        let made = self.memo_view(op, (&base, &args), || {
            self.window_view(op, w, std::borrow::Cow::Borrowed(&base))
        })?;
        Ok(Value::View(made))
    }

    /// A view op's one result (`RefView`, `RefBitcast`, `RefReshape`), made straight from the
    /// region loop (without the general dispatch's list of results).
    pub(super) fn view_op(&mut self, op: &Op) -> Result<(ValueId, Value)> {
        let [res] = op.results[..] else {
            return Err(internal("a view op without one result"));
        };
        let v = match &op.kind {
            OpKind::RefView(w) => self.ref_view(op, w)?,
            _ => self.ref_transform(op)?,
        };
        Ok((res, v))
    }

    /// Window `w` of view `base` (its run-time starts and sizes `op`'s operands after the first);
    /// a plain window of a base built for it (a whole ref's) narrows that base, not a copy.
    fn window_view(
        &self,
        op: &Op,
        w: &Window,
        base: std::borrow::Cow<'_, RefView>,
    ) -> Result<RefView> {
        // The base's own (unsqueezed) dimensions, in order; a bitcast or reshape view's are its shape's.
        let view_shape = base.via.as_ref().map(|p| p.result().0);
        let dims: ViewDims = match &view_shape {
            Some(shape) => (0..shape.len()).collect(),
            None => (0..base.sizes.len())
                .filter(|&d| !base.squeezed[d])
                .collect(),
        };
        let bound = |d: usize| match &view_shape {
            Some(shape) => shape[d],
            None => base.sizes[d],
        };
        if dims.len() != w.starts.len() {
            return Err(internal("view rank differs from its base"));
        }
        // The run-time starts come first among the operands, then the run-time sizes.
        let dynamic_starts = w
            .starts
            .iter()
            .filter(|s| matches!(s, Start::Dynamic))
            .count();
        let rest = op.operands.get(1..).unwrap_or_default();
        let (mut dyn_starts, mut dyn_sizes) = (
            rest.iter().take(dynamic_starts),
            rest.iter().skip(dynamic_starts),
        );
        let mut window = (ViewDims::new(), ViewDims::new());
        for (i, &d) in dims.iter().enumerate() {
            let start = match w.starts[i] {
                Start::Static(s) => s as i64,
                Start::Dynamic => {
                    let id = dyn_starts
                        .next()
                        .ok_or_else(|| internal("missing view start"))?;
                    self.tensor(*id)?.scalar_i64()?
                }
            };
            // A run-time size (the next size operand) is checked here, as the start is.
            let size = match w.dynamic_sizes.get(i) {
                Some(true) => {
                    let id = dyn_sizes
                        .next()
                        .ok_or_else(|| internal("missing view size"))?;
                    self.tensor(*id)?.scalar_i64()?
                }
                _ => w.sizes[i] as i64,
            };
            if size < 1 {
                return Err(window_size_below_one(&self.refs[base.r].label, i, size));
            }
            let size = size as usize;
            if start < 0 || start as u64 + size as u64 > bound(d) as u64 {
                return Err(window_out_of_bounds(
                    &self.refs[base.r].label,
                    (i, start, size),
                    &dims.iter().map(|&d| bound(d)).collect::<Vec<_>>(),
                ));
            }
            window.0.push(start as usize);
            window.1.push(size);
        }
        let v = match &base.via {
            // A window of a plain window: the base's window narrowed. (A view's base is never
            // cloned: its path is replaced below.)
            None => {
                let mut v = base.into_owned();
                for (i, &d) in dims.iter().enumerate() {
                    v.starts[d] += window.0[i];
                    v.sizes[d] = window.1[i];
                    v.squeezed[d] = w.squeezed[i];
                }
                v
            }
            // A page of token rows is a plain window of the cache: the copies, loads and race
            // checks over it take the plain path.
            Some(p) => match p.as_ref_window(&window.0, &window.1, &w.squeezed) {
                Some((starts, sizes, squeezed)) => RefView {
                    r: base.r,
                    starts,
                    sizes,
                    squeezed,
                    via: None,
                },
                None => self.view_window(&base, &window.0, (&window.1, &w.squeezed)),
            },
        };
        Ok(v)
    }

    /// The single semaphore an operand denotes.
    pub(super) fn semaphore(&self, id: ValueId) -> Result<(usize, usize)> {
        let v = self.view_ref(id)?;
        Ok(sem_of(&v, &self.refs[v.r].shape))
    }

    /// An error if `v` is read while a copy into it is in flight (`write`: or written while a copy
    /// from or into it is).
    pub(super) fn check_dma_access(&self, v: &RefView, write: bool) -> Result<()> {
        self.dma.check_access(&self.refs[..], v, write)
    }

    /// `DmaStart`.
    pub(super) fn dma_start(&mut self, op: &Op) -> Result<()> {
        let (src, dst) = (self.view_of(op.operands[0])?, self.view_of(op.operands[1])?);
        let sem = self.semaphore(op.operands[2])?;
        let background = self.background_task(&src, &dst)?;
        let r = dst.r;
        self.dma
            .start(&self.refs[..], (src, dst), sem, None, op.loc)?;
        if let Some(task) = background {
            self.land_in_background(task, r);
        }
        Ok(())
    }

    /// `DmaWait`: the descriptor's bytes taken from its semaphore; the copies this shows complete
    /// move their data now (if they have not yet).
    pub(super) fn dma_wait(&mut self, op: &Op) -> Result<()> {
        let dst = self.view_of(op.operands[1])?;
        let sem = self.semaphore(op.operands[2])?;
        let bytes = window_bytes(&self.refs[..], &dst);
        self.take_bytes(sem, bytes, op)
    }

    /// Take `bytes` from DMA semaphore `sem` (a wait at `op`) and land the copies that shows complete.
    /// In an SPMD run a wait the copies started here cannot end may be ended by another device's:
    /// the device waits for deliveries instead (a deadlock only when every device waits).
    pub(super) fn take_bytes(&mut self, sem: Sem, bytes: i64, op: &Op) -> Result<()> {
        loop {
            match self.dma.wait(&self.refs[..], sem, bytes) {
                Ok(done) => {
                    if self.land_across_threads(&done)? {
                        return Ok(());
                    }
                    for f in done {
                        self.land(&f)?;
                    }
                    return Ok(());
                }
                Err(e) => self.wait_for_peers(e, op)?,
            }
        }
    }

    /// Move the data of a completed copy (a received one's came with it).
    fn land(&mut self, f: &InFlight) -> Result<()> {
        let data = match f.peer {
            Some(p) => self
                .received
                .remove(&p.tag)
                .ok_or_else(|| internal("a received copy without its data"))?,
            // A copy within one lent buffer reads its source before writing (they may overlap).
            None if f.src.r == f.dst.r && self.lent(f.src.r) => {
                self.read_window(&f.src)?.materialize()?
            }
            None => self.read_window(&f.src)?,
        };
        self.write_window(&f.dst, data)
    }

    /// Land the copies one wait completed on the threads split loops run on, where that gives the
    /// bits landing them in order gives: local copies into disjoint plain windows of one ref that
    /// none of them reads, at least [`PARALLEL_LAND_BYTES`] in all (a paged kernel's wait for a
    /// KV block's pages: one copy a page). Returns false, having moved nothing, where they do not.
    fn land_across_threads(&mut self, done: &[InFlight]) -> Result<bool> {
        let Some(first) = done.first() else {
            return Ok(false);
        };
        let r = first.dst.r;
        let bytes: i64 = done.iter().map(|f| f.bytes).sum();
        if self.loop_threads < 2
            || done.len() < 2
            || bytes < PARALLEL_LAND_BYTES
            || self.lent(r)
            || done
                .iter()
                .any(|f| f.peer.is_some() || f.dst.via.is_some() || f.dst.r != r || f.src.r == r)
        {
            return Ok(false);
        }
        let disjoint = |a: &RefView, b: &RefView| {
            a.starts
                .iter()
                .zip(&a.sizes)
                .zip(b.starts.iter().zip(&b.sizes))
                .any(|((s, n), (t, m))| s + n <= *t || t + m <= *s)
        };
        for (i, a) in done.iter().enumerate() {
            if done[i + 1..].iter().any(|b| !disjoint(&a.dst, &b.dst)) {
                return Ok(false);
            }
        }
        let (dtype, shape) = (self.refs[r].dtype, self.refs[r].shape.clone());
        let ones = vec![1; shape.len()];
        let mut moves = Vec::with_capacity(done.len());
        for f in done {
            let data = self.read_window(&f.src)?;
            if !refs::fits_window(&data, dtype, &f.dst.sizes, &f.dst.squeezed) {
                return Err(internal("copied value does not match the window"));
            }
            let (off, strides) =
                refs::window_layout(&shape, (&f.dst.starts, &f.dst.squeezed, &ones));
            moves.push((off, strides, data));
        }
        let mut buf = self.owned_contents(r)?.buf;
        let failed = std::sync::Mutex::new(None);
        with_dtype!(dtype, T => {
            let dst = buf.elems_mut::<T>()?;
            let (ptr, len) = (RawSlice(dst.as_mut_ptr()), dst.len());
            let ok = super::super::workers::run(
                moves.len(),
                self.loop_threads,
                || (),
                |_, c| {
                    let (off, strides, data) = &moves[c];
                    let ptr = &ptr;
                    // SAFETY: `ptr` holds `len` elements of the ref's own buffer (`elems_mut` above,
                    // borrowed until `run` returns); the windows are disjoint (checked above), so no
                    // two chunks write one element, and no copy reads this ref.
                    if let Err(e) = unsafe { write_view_raw::<T>(ptr.0, len, *off, strides, data, None) } {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    }
                },
            );
            if !ok {
                return Err(internal("a copy panicked in the interpreter"));
            }
        });
        self.put_owned_contents(r, buf);
        failed
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Ok(true), Err)
    }

    /// After each op of a seeded run: copies whose time has come complete.
    pub(super) fn dma_tick(&mut self) -> Result<()> {
        for f in self.dma.due() {
            self.land(&f)?;
        }
        Ok(())
    }

    /// `SemSignal`, `SemWait`, `SemRead`.
    pub(super) fn semaphore_op(&mut self, op: &Op) -> Result<Values> {
        let sem = self.semaphore(op.operands[0])?;
        match op.kind {
            OpKind::SemRead => {
                let v = Literal::from_i64(DType::I32, self.dma.value(sem));
                return Ok(smallvec::smallvec![Value::T(Tensor::splat(v, &[]))]);
            }
            OpKind::SemSignal => {
                let n = self.tensor(op.operands[1])?.scalar_i64()?;
                self.dma.signal(sem, n);
            }
            _ => {
                let n = self.tensor(op.operands[1])?.scalar_i64()?;
                while let Err(e) = self.dma.sem_wait(&self.refs[..], sem, n) {
                    self.wait_for_peers(e, op)?;
                }
            }
        }
        Ok(Values::new())
    }

    /// At the end of a grid step: no copy may still use a pipelined block (it is replaced or written
    /// back before the next step).
    pub(super) fn dma_step_end(&self) -> Result<()> {
        self.dma.step_end(&self.refs[..])
    }

    /// At the end of the kernel: every copy waited for, every semaphore back at zero.
    pub(crate) fn dma_finish(&mut self) -> Result<()> {
        self.receive()?;
        self.dma.release(&self.refs[..], 0, Release::Kernel)
    }

    /// `Scoped` (`run_scoped`): fresh refs for the scope's allocations, the body, then the refs are
    /// freed — a copy or a semaphore count still using them is an error, as at kernel end.
    pub(super) fn scoped(&mut self, op: &Op, sub: &[Plan]) -> Result<Values> {
        let (Some(body), Some(plan)) = (op.regions.first(), sub.first()) else {
            return Err(internal("a scope without a body"));
        };
        let first = self.refs.len();
        let mut args = Vec::with_capacity(body.args.len());
        for (k, a) in body.args.iter().enumerate() {
            let t = self.func.ty(*a);
            self.refs.push(RefState {
                dtype: t.dtype(),
                shape: t.shape().into(),
                content: None,
                label: format!("scoped buffer {k}").into(),
                written_through: false,
                blocked: false,
            });
            self.dests.push(None);
            args.push(Value::Ref(first + k));
        }
        let r = self.region(body, plan, args);
        let end = self.dma.release(&self.refs[..], first, Release::Scope);
        let end = r.and(end);
        for st in self.refs.drain(first..) {
            if let Some(t) = st.content {
                recycle(t);
            }
        }
        self.dests.truncate(first);
        end.map(|_| Values::new())
    }

    /// The contents of a window (squeezed dimensions dropped).
    /// A view, not a copy: the write that consumes it copies its elements once, and writing into a
    /// buffer the view shares (a copy within one ref) first unshares the destination
    /// (`Buf::make_mut`), so the view keeps reading the contents from before the copy.
    pub(super) fn read_window(&self, v: &RefView) -> Result<Tensor> {
        if v.via.is_some() {
            return self.view_contents(v);
        }
        let t = self.contents(v.r)?;
        Ok(t.window(&v.starts, &v.sizes, &v.squeezed))
    }

    /// Write `data` (the window's value shape) into a window of its ref.
    fn write_window(&mut self, v: &RefView, data: Tensor) -> Result<()> {
        if let Some(p) = &v.via {
            let rank = p.result().0.len();
            let (starts, sizes) = (vec![0; rank], p.result().0);
            return self.write_through_view(
                (v.r, p),
                (&starts, &sizes, &vec![false; rank]),
                &vec![1; rank],
                data,
                None,
            );
        }
        self.write_into(
            v.r,
            (&v.starts, &v.sizes, &v.squeezed),
            &vec![1; v.sizes.len()],
            data,
            None,
        )
    }
}

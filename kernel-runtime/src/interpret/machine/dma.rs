//! DMA and semaphores in interpret mode. A started copy is in flight until it completes — at its wait,
//! or, with `InterpretOptions::dma_seed`, at a random op boundary between its start and its wait — and
//! completing it copies the source window into the destination window and signals its semaphore.
//! Semaphores count. What real hardware would race on or hang on is an error naming the Rust line:
//! reading a copy's destination before its wait, writing its source or destination while it is in
//! flight, waiting on a semaphore nothing will signal, a copy still in flight or a semaphore not back
//! at zero when the kernel ends.

use super::*;
use crate::error::SourceLoc;

/// A window of ref `r` in the ref's own coordinates (squeezed dimensions have size 1).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RefView {
    pub r: usize,
    pub starts: Dims,
    pub sizes: Dims,
    pub squeezed: Flags,
}

/// Per-dimension flags of a view, inline up to rank 4 like [`Dims`] (views are made per DMA).
pub(crate) type Flags = smallvec::SmallVec<[bool; 4]>;

impl RefView {
    fn whole(r: usize, shape: &[usize]) -> RefView {
        RefView {
            r,
            starts: smallvec::smallvec![0; shape.len()],
            sizes: Dims::from_slice(shape),
            squeezed: smallvec::smallvec![false; shape.len()],
        }
    }
    fn overlaps(&self, o: &RefView) -> bool {
        self.r == o.r
            && self
                .starts
                .iter()
                .zip(&self.sizes)
                .zip(o.starts.iter().zip(&o.sizes))
                .all(|((a, n), (b, m))| a < &(b + m) && b < &(a + n))
    }
    fn describe(&self, refs: &[RefState]) -> String {
        let w: Vec<String> = self
            .starts
            .iter()
            .zip(&self.sizes)
            .map(|(s, n)| format!("{s}..{}", s + n))
            .collect();
        format!("{}[{}]", refs[self.r].label, w.join(", "))
    }
}

/// One copy in flight.
#[derive(Clone, Debug)]
struct InFlight {
    src: RefView,
    dst: RefView,
    sem: (usize, usize),
    started_at: SourceLoc,
    /// Ops left before it completes by itself (seeded runs only).
    countdown: Option<u32>,
}

/// The DMA engine and the semaphores of one machine (one chunk of grid steps).
#[derive(Clone, Debug, Default)]
pub(crate) struct DmaState {
    inflight: Vec<InFlight>,
    /// Semaphore values by (ref, element).
    sems: HashMap<(usize, usize), i64>,
    /// xorshift state for seeded completion points (None: copies complete at their waits).
    rng: Option<u64>,
}

impl DmaState {
    pub fn new(seed: Option<u64>) -> DmaState {
        DmaState {
            rng: seed.map(|s| s.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            ..DmaState::default()
        }
    }
    fn next(&mut self) -> Option<u32> {
        let x = self.rng.as_mut()?;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        Some((*x % 6) as u32)
    }
    pub fn idle(&self) -> bool {
        self.inflight.is_empty()
    }
}

impl<'k> Machine<'k> {
    /// The view an operand denotes: a whole ref or a window of one.
    fn view_of(&self, id: ValueId) -> Result<RefView> {
        match self.env.get(id.0 as usize) {
            Some(Some(Value::Ref(r))) => Ok(RefView::whole(*r, &self.refs[*r].shape)),
            Some(Some(Value::View(v))) => Ok(v.clone()),
            _ => Err(internal("expected a ref or a view")),
        }
    }

    /// `RefView`: a window of a ref (or of a window), bounds-checked.
    pub(super) fn ref_view(&self, op: &Op, w: &Window) -> Result<Vec<Value>> {
        let base = self.view_of(op.operands[0])?;
        // The base's own (unsqueezed) dimensions, in order.
        let dims: Vec<usize> = (0..base.sizes.len())
            .filter(|&d| !base.squeezed[d])
            .collect();
        if dims.len() != w.starts.len() {
            return Err(internal("view rank differs from its base"));
        }
        let mut dynamic = op.operands[1..].iter();
        let mut v = base.clone();
        for (i, &d) in dims.iter().enumerate() {
            let start = match w.starts[i] {
                Start::Static(s) => s as i64,
                Start::Dynamic => {
                    let id = dynamic
                        .next()
                        .ok_or_else(|| internal("missing view start"))?;
                    self.tensor(*id)?.scalar_i64()?
                }
            };
            if start < 0 || start as u64 + w.sizes[i] as u64 > base.sizes[d] as u64 {
                return Err(kerr!(
                    OutOfBounds,
                    "out-of-bounds window of {}: {start}..{} along dimension {i} of a window of shape {:?}",
                    self.refs[base.r].label,
                    start + w.sizes[i] as i64,
                    dims.iter().map(|&d| base.sizes[d]).collect::<Vec<_>>()
                ));
            }
            v.starts[d] = base.starts[d] + start as usize;
            v.sizes[d] = w.sizes[i];
            v.squeezed[d] = w.squeezed[i];
        }
        Ok(vec![Value::View(v)])
    }

    /// The (ref, element) of a single semaphore operand.
    fn semaphore(&self, id: ValueId) -> Result<(usize, usize)> {
        let v = self.view_of(id)?;
        let shape = &self.refs[v.r].shape;
        let flat = v
            .starts
            .iter()
            .zip(shape)
            .fold(0usize, |acc, (s, n)| acc * n + s);
        Ok((v.r, flat))
    }

    fn sem_label(&self, (r, i): (usize, usize)) -> String {
        if self.refs[r].shape.is_empty() {
            self.refs[r].label.clone()
        } else {
            format!("{}[{i}]", self.refs[r].label)
        }
    }

    /// An error if `v` is read while a copy into it is in flight (`write`: or written while a copy
    /// from or into it is).
    pub(super) fn check_dma_access(&self, v: &RefView, write: bool) -> Result<()> {
        for f in &self.dma.inflight {
            if f.dst.overlaps(v) {
                let what = if write { "writes" } else { "reads" };
                return Err(kerr!(
                    Race,
                    "{what} {} while the DMA into {} started at {} is in flight: wait for the copy first",
                    v.describe(&self.refs),
                    f.dst.describe(&self.refs),
                    f.started_at
                ));
            }
            if write && f.src.overlaps(v) {
                return Err(kerr!(
                    Race,
                    "writes {} while the DMA from {} started at {} is in flight: wait for the copy first",
                    v.describe(&self.refs),
                    f.src.describe(&self.refs),
                    f.started_at
                ));
            }
        }
        Ok(())
    }

    /// `DmaStart`.
    pub(super) fn dma_start(&mut self, op: &Op) -> Result<()> {
        let (src, dst) = (self.view_of(op.operands[0])?, self.view_of(op.operands[1])?);
        let sem = self.semaphore(op.operands[2])?;
        self.check_dma_access(&src, false)?;
        self.check_dma_access(&dst, true)?;
        let countdown = self.dma.next();
        self.dma.inflight.push(InFlight {
            src,
            dst,
            sem,
            started_at: op.loc,
            countdown,
        });
        Ok(())
    }

    /// `DmaWait`: one completed copy on the semaphore (the oldest in flight completes now if none has).
    pub(super) fn dma_wait(&mut self, op: &Op) -> Result<()> {
        let sem = self.semaphore(op.operands[2])?;
        if self.dma.sems.get(&sem).copied().unwrap_or(0) == 0 {
            match self.dma.inflight.iter().position(|f| f.sem == sem) {
                Some(i) => self.complete(i)?,
                None => {
                    return Err(kerr!(
                        Deadlock,
                        "waits on DMA semaphore {} but no copy signalling it is in flight: this wait would never return",
                        self.sem_label(sem)
                    ))
                }
            }
        }
        *self.dma.sems.entry(sem).or_insert(0) -= 1;
        Ok(())
    }

    /// Complete in-flight copy `i`: copy the data, signal its semaphore.
    fn complete(&mut self, i: usize) -> Result<()> {
        let f = self.dma.inflight.remove(i);
        let data = self.read_window(&f.src)?;
        self.write_window(&f.dst, data)?;
        *self.dma.sems.entry(f.sem).or_insert(0) += 1;
        Ok(())
    }

    /// After each op of a seeded run: copies whose time has come complete.
    pub(super) fn dma_tick(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.dma.inflight.len() {
            match &mut self.dma.inflight[i].countdown {
                Some(0) => self.complete(i)?,
                Some(n) => {
                    *n -= 1;
                    i += 1;
                }
                None => i += 1,
            }
        }
        Ok(())
    }

    /// `SemSignal`, `SemWait`, `SemRead`.
    pub(super) fn semaphore_op(&mut self, op: &Op) -> Result<Vec<Value>> {
        let sem = self.semaphore(op.operands[0])?;
        let value = self.dma.sems.get(&sem).copied().unwrap_or(0);
        match op.kind {
            OpKind::SemRead => {
                let v = Literal::from_i64(DType::I32, value);
                return Ok(vec![Value::T(Tensor::splat(v, &[]))]);
            }
            OpKind::SemSignal => {
                let n = self.tensor(op.operands[1])?.scalar_i64()?;
                self.dma.sems.insert(sem, value + n);
            }
            _ => {
                let n = self.tensor(op.operands[1])?.scalar_i64()?;
                if value < n {
                    return Err(kerr!(
                        Deadlock,
                        "waits for {n} on semaphore {} which holds {value}, and nothing else runs to signal it: this wait would never return",
                        self.sem_label(sem)
                    ));
                }
                self.dma.sems.insert(sem, value - n);
            }
        }
        Ok(vec![])
    }

    /// At the end of a grid step: no copy may still use a pipelined block (it is replaced or written
    /// back before the next step).
    pub(super) fn dma_step_end(&self) -> Result<()> {
        for f in &self.dma.inflight {
            for (v, what) in [(&f.src, "from"), (&f.dst, "into")] {
                if self.refs[v.r].blocked {
                    return Err(kerr!(
                        Race,
                        "the DMA {what} {} started at {} is still in flight at the end of the grid step, when that block is replaced: wait for it in the same step",
                        v.describe(&self.refs),
                        f.started_at
                    )
                    .at(f.started_at));
                }
            }
        }
        Ok(())
    }

    /// At the end of the kernel: every copy waited for, every semaphore back at zero.
    pub(crate) fn dma_finish(&mut self) -> Result<()> {
        self.check_released(0, "the kernel ends", "wait for it")
    }

    /// No copy touching refs `first..` still in flight and no semaphore among them left non-zero,
    /// when those refs go away (`when`: the kernel or a scope ends).
    fn check_released(&self, first: usize, when: &str, advice: &str) -> Result<()> {
        if let Some(f) = self
            .dma
            .inflight
            .iter()
            .find(|f| f.src.r >= first || f.dst.r >= first)
        {
            return Err(kerr!(
                Race,
                "the DMA from {} into {} started here is still in flight when {when}: {advice}",
                f.src.describe(&self.refs),
                f.dst.describe(&self.refs)
            )
            .at(f.started_at));
        }
        let mut left: Vec<_> = self
            .dma
            .sems
            .iter()
            .filter(|(k, v)| k.0 >= first && **v != 0)
            .collect();
        left.sort();
        if let Some((sem, v)) = left.first() {
            return Err(kerr!(
                Race,
                "semaphore {} holds {v} when {when}: every signal must be waited for",
                self.sem_label(**sem)
            ));
        }
        Ok(())
    }

    /// `Scoped` (`run_scoped`): fresh refs for the scope's allocations, the body, then the refs are
    /// freed — a copy or a semaphore count still using them is an error, as at kernel end.
    pub(super) fn scoped(&mut self, op: &Op, sub: &[Plan]) -> Result<Vec<Value>> {
        let (Some(body), Some(plan)) = (op.regions.first(), sub.first()) else {
            return Err(internal("a scope without a body"));
        };
        let first = self.refs.len();
        let mut args = Vec::with_capacity(body.args.len());
        for (k, a) in body.args.iter().enumerate() {
            let t = self.func.ty(*a);
            self.refs.push(RefState {
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                content: None,
                label: format!("scoped buffer {k}"),
                written_through: false,
                blocked: false,
            });
            self.dests.push(None);
            args.push(Value::Ref(first + k));
        }
        let r = self.region(body, plan, args);
        let end = r.and_then(|_| {
            self.check_released(
                first,
                "its run_scoped scope ends",
                "wait for it inside the scope",
            )
        });
        self.dma.sems.retain(|k, _| k.0 < first);
        for st in self.refs.drain(first..) {
            if let Some(t) = st.content {
                recycle(t);
            }
        }
        self.dests.truncate(first);
        end.map(|_| vec![])
    }

    /// The contents of a window (squeezed dimensions dropped).
    /// A view, not a copy: the write that consumes it copies its elements once, and writing into a
    /// buffer the view shares (a copy within one ref) first unshares the destination
    /// (`Buf::make_mut`), so the view keeps reading the contents from before the copy.
    fn read_window(&self, v: &RefView) -> Result<Tensor> {
        let t = self.contents(v.r)?;
        Ok(t.window(&v.starts, &v.sizes, &v.squeezed))
    }

    /// Write `data` (the window's value shape) into a window of its ref.
    fn write_window(&mut self, v: &RefView, data: Tensor) -> Result<()> {
        self.write_into(v.r, (&v.starts, &v.sizes, &v.squeezed), data, None)
    }
}

//! DMA and semaphores as Pallas TPU defines them, for a CPU engine to follow: which copies are in
//! flight, what each semaphore holds, and what real hardware would race on or hang on — each an error
//! value with one message whichever engine finds it.
//!
//! The model keeps the bookkeeping; the engine moves the data. A started copy stays in flight until it
//! completes — at a wait on its semaphore ([`DmaModel::wait`] hands it back to copy), or, in a seeded
//! run, at a random op boundary between its start and its wait ([`DmaModel::due`]) — and completing it
//! signals its semaphore. Semaphores count. Errors: reading a copy's destination or writing its source
//! or destination while it is in flight ([`DmaModel::check_access`]), waiting on a semaphore nothing
//! will signal, a copy still using a pipelined block when the grid step ends, a copy in flight or a
//! semaphore not back at zero when the kernel or a `run_scoped` scope ends ([`DmaModel::release`]).
//!
//! The interpreter runs this model. Mosaic-on-CPU runs its compiled module synchronously (a copy
//! completes at its start; see `mosaic_cpu::dma`) and reports the faults it can see — deadlocks and
//! semaphores left counting — with this module's messages ([`deadlock_dma_wait`],
//! [`deadlock_sem_wait`], [`semaphore_left`], [`dma_copies_left`]).

use crate::error::{kerr, KernelError, Result, SourceLoc};
use smallvec::SmallVec;
use std::collections::HashMap;

/// Per-dimension sizes or starts, inline up to rank 4 (views are made per DMA).
pub(crate) type Dims = SmallVec<[usize; 4]>;
/// Per-dimension flags of a view, inline up to rank 4.
pub(crate) type Flags = SmallVec<[bool; 4]>;

/// A window of ref `r` in the ref's own coordinates (squeezed dimensions have size 1).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RefView {
    pub r: usize,
    pub starts: Dims,
    pub sizes: Dims,
    pub squeezed: Flags,
}

impl RefView {
    /// The whole of ref `r`, of shape `shape`.
    pub fn whole(r: usize, shape: &[usize]) -> RefView {
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

    fn describe(&self, refs: &(impl Refs + ?Sized)) -> String {
        let w: Vec<String> = self
            .starts
            .iter()
            .zip(&self.sizes)
            .map(|(s, n)| format!("{s}..{}", s + n))
            .collect();
        format!("{}[{}]", refs.label(self.r), w.join(", "))
    }
}

/// What the model needs to know of an engine's refs: their names in messages, their shapes, and
/// which are pipelined blocks (replaced or written back between grid steps).
pub(crate) trait Refs {
    fn label(&self, r: usize) -> &str;
    fn shape(&self, r: usize) -> &[usize];
    fn blocked(&self, r: usize) -> bool;
}

/// One semaphore: element `i` (row-major) of semaphore ref `r`.
pub(crate) type Sem = (usize, usize);

/// The semaphore a one-element window of a semaphore ref denotes.
pub(crate) fn sem_of(v: &RefView, shape: &[usize]) -> Sem {
    let flat = v
        .starts
        .iter()
        .zip(shape)
        .fold(0usize, |acc, (s, n)| acc * n + s);
    (v.r, flat)
}

/// A semaphore's name in errors: its ref's, and the element of an array of semaphores.
pub(crate) fn sem_label(label: &str, shape: &[usize], i: usize) -> String {
    if shape.is_empty() {
        label.to_string()
    } else {
        format!("{label}[{i}]")
    }
}

fn sem_name(refs: &(impl Refs + ?Sized), (r, i): Sem) -> String {
    sem_label(refs.label(r), refs.shape(r), i)
}

/// A wait on DMA semaphore `sem` with no copy in flight that would signal it.
pub(crate) fn deadlock_dma_wait(sem: &str) -> KernelError {
    kerr!(
        Deadlock,
        "waits on DMA semaphore {sem} but no copy signalling it is in flight: this wait would never return"
    )
}

/// A wait for `n` on semaphore `sem`, which holds `value < n` with nothing left to signal it.
pub(crate) fn deadlock_sem_wait(n: i64, sem: &str, value: i64) -> KernelError {
    kerr!(
        Deadlock,
        "waits for {n} on semaphore {sem} which holds {value}, and nothing else runs to signal it: this wait would never return"
    )
}

/// When refs go away and everything using them must be done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// The kernel ends (all refs).
    Kernel,
    /// A `run_scoped` scope ends (its allocations).
    Scope,
}

impl Release {
    fn when(self) -> &'static str {
        match self {
            Release::Kernel => "the kernel ends",
            Release::Scope => "its run_scoped scope ends",
        }
    }
    fn inside(self) -> &'static str {
        match self {
            Release::Kernel => "",
            Release::Scope => " inside the scope",
        }
    }
}

/// A regular semaphore holding `value != 0` when `at` releases it.
pub(crate) fn semaphore_left(sem: &str, value: i64, at: Release) -> KernelError {
    kerr!(
        Race,
        "semaphore {sem} holds {value} when {}: every signal must be waited for",
        at.when()
    )
}

/// A DMA semaphore counting `copies` completed copies never waited for when `at` releases it (an
/// engine whose copies complete at their start sees this where the model sees a copy in flight).
// Only Mosaic-on-CPU meets this fault (its copies complete at their start).
#[cfg_attr(not(feature = "mosaic-cpu"), allow(dead_code))]
pub(crate) fn dma_copies_left(sem: &str, copies: i64, at: Release) -> KernelError {
    kerr!(
        Race,
        "DMA semaphore {sem} counts {copies} copies never waited for when {}: wait for every copy{}",
        at.when(),
        at.inside()
    )
}

/// One copy in flight.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    pub src: RefView,
    pub dst: RefView,
    pub sem: Sem,
    pub started_at: SourceLoc,
    /// Ops left before it completes by itself (seeded runs only).
    countdown: Option<u32>,
}

/// The copies in flight and the semaphores of one core (one chunk of grid steps).
#[derive(Clone, Debug, Default)]
pub(crate) struct DmaModel {
    inflight: Vec<InFlight>,
    /// Semaphore values.
    sems: HashMap<Sem, i64>,
    /// xorshift state for seeded completion points (None: copies complete at their waits).
    rng: Option<u64>,
}

impl DmaModel {
    /// A model whose copies complete at their waits, or with `seed` at random points before.
    pub fn new(seed: Option<u64>) -> DmaModel {
        DmaModel {
            rng: seed.map(|s| s.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            ..DmaModel::default()
        }
    }

    fn next(&mut self) -> Option<u32> {
        let x = self.rng.as_mut()?;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        Some((*x % 6) as u32)
    }

    /// No copy in flight (reads and writes need no check).
    pub fn idle(&self) -> bool {
        self.inflight.is_empty()
    }

    /// An error if `v` is read while a copy into it is in flight (`write`: or written while a copy
    /// from or into it is).
    pub fn check_access(
        &self,
        refs: &(impl Refs + ?Sized),
        v: &RefView,
        write: bool,
    ) -> Result<()> {
        for f in &self.inflight {
            if f.dst.overlaps(v) {
                let what = if write { "writes" } else { "reads" };
                return Err(kerr!(
                    Race,
                    "{what} {} while the DMA into {} started at {} is in flight: wait for the copy first",
                    v.describe(refs),
                    f.dst.describe(refs),
                    f.started_at
                ));
            }
            if write && f.src.overlaps(v) {
                return Err(kerr!(
                    Race,
                    "writes {} while the DMA from {} started at {} is in flight: wait for the copy first",
                    v.describe(refs),
                    f.src.describe(refs),
                    f.started_at
                ));
            }
        }
        Ok(())
    }

    /// Start a copy from `src` into `dst` signalling `sem` (started at `loc`).
    pub fn start(
        &mut self,
        refs: &(impl Refs + ?Sized),
        src: RefView,
        dst: RefView,
        sem: Sem,
        loc: SourceLoc,
    ) -> Result<()> {
        self.check_access(refs, &src, false)?;
        self.check_access(refs, &dst, true)?;
        let countdown = self.next();
        self.inflight.push(InFlight {
            src,
            dst,
            sem,
            started_at: loc,
            countdown,
        });
        Ok(())
    }

    /// A wait for one completed copy on DMA semaphore `sem`. When none has completed, the oldest in
    /// flight on it completes now: it is returned for the engine to copy (before anything else runs).
    pub fn wait(&mut self, refs: &(impl Refs + ?Sized), sem: Sem) -> Result<Option<InFlight>> {
        let value = self.sems.entry(sem).or_insert(0);
        if *value > 0 {
            *value -= 1;
            return Ok(None);
        }
        match self.inflight.iter().position(|f| f.sem == sem) {
            // Completing signals the semaphore, and this wait takes the signal.
            Some(i) => Ok(Some(self.inflight.remove(i))),
            None => Err(deadlock_dma_wait(&sem_name(refs, sem))),
        }
    }

    /// After each op of a seeded run: the copies whose time has come, completed (their semaphores
    /// signalled), oldest first, for the engine to copy in that order.
    pub fn due(&mut self) -> Vec<InFlight> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.inflight.len() {
            match &mut self.inflight[i].countdown {
                Some(0) => {
                    let f = self.inflight.remove(i);
                    *self.sems.entry(f.sem).or_insert(0) += 1;
                    done.push(f);
                }
                Some(n) => {
                    *n -= 1;
                    i += 1;
                }
                None => i += 1,
            }
        }
        done
    }

    /// What semaphore `sem` holds.
    pub fn value(&self, sem: Sem) -> i64 {
        self.sems.get(&sem).copied().unwrap_or(0)
    }

    /// Signal `sem` by `n`.
    pub fn signal(&mut self, sem: Sem, n: i64) {
        *self.sems.entry(sem).or_insert(0) += n;
    }

    /// Wait for `n` on regular semaphore `sem` (nothing runs beside the kernel on its core to signal
    /// it later: a wait that cannot return now never will).
    pub fn sem_wait(&mut self, refs: &(impl Refs + ?Sized), sem: Sem, n: i64) -> Result<()> {
        let value = self.value(sem);
        if value < n {
            return Err(deadlock_sem_wait(n, &sem_name(refs, sem), value));
        }
        self.sems.insert(sem, value - n);
        Ok(())
    }

    /// At the end of a grid step: no copy may still use a pipelined block (it is replaced or written
    /// back before the next step).
    pub fn step_end(&self, refs: &(impl Refs + ?Sized)) -> Result<()> {
        for f in &self.inflight {
            for (v, what) in [(&f.src, "from"), (&f.dst, "into")] {
                if refs.blocked(v.r) {
                    return Err(kerr!(
                        Race,
                        "the DMA {what} {} started at {} is still in flight at the end of the grid step, when that block is replaced: wait for it in the same step",
                        v.describe(refs),
                        f.started_at
                    )
                    .at(f.started_at));
                }
            }
        }
        Ok(())
    }

    /// Refs `first..` go away at `at`: no copy touching them may still be in flight and none of their
    /// semaphores may be left non-zero. Their semaphores are forgotten either way.
    pub fn release(
        &mut self,
        refs: &(impl Refs + ?Sized),
        first: usize,
        at: Release,
    ) -> Result<()> {
        let verdict = self.check_released(refs, first, at);
        self.sems.retain(|k, _| k.0 < first);
        verdict
    }

    fn check_released(&self, refs: &(impl Refs + ?Sized), first: usize, at: Release) -> Result<()> {
        if let Some(f) = self
            .inflight
            .iter()
            .find(|f| f.src.r >= first || f.dst.r >= first)
        {
            return Err(kerr!(
                Race,
                "the DMA from {} into {} started here is still in flight when {}: wait for it{}",
                f.src.describe(refs),
                f.dst.describe(refs),
                at.when(),
                at.inside()
            )
            .at(f.started_at));
        }
        let mut left: Vec<_> = self
            .sems
            .iter()
            .filter(|(k, v)| k.0 >= first && **v != 0)
            .collect();
        left.sort();
        match left.first() {
            Some((sem, v)) => Err(semaphore_left(&sem_name(refs, **sem), **v, at)),
            None => Ok(()),
        }
    }
}

//! DMA and semaphores as Pallas TPU defines them, for a CPU engine to follow: which copies are
//! outstanding, what each semaphore holds, and what real hardware would race on or hang on — each an
//! error value with one message whichever engine finds it.
//!
//! **DMA semaphores count bytes.** A copy adds its bytes to its semaphore as it lands; a wait on a
//! descriptor takes the descriptor's bytes (any descriptor of that size: one wait for several page
//! copies, two half waits for one copy). A wait for more than the copies started on the semaphore can
//! still bring is a `Deadlock`. Which copies a wait retired is unknown to the program — the bytes may
//! have come from any of them, a younger copy landing first or each landing in pieces — so a copy is
//! known complete only when the waits on its semaphore have taken every byte of every copy outstanding
//! on it. Until then it is *outstanding*: reading its destination, or writing its source or
//! destination, is a `Race` whatever order the copies were started in ([`DmaModel::check_access`]).
//! Regular semaphores count the units signalled and waited.
//!
//! The model keeps the bookkeeping; the engine moves the data: an outstanding copy's data moves when
//! the model hands it back — when a wait retires it ([`DmaModel::wait`]) or, in a seeded run, at a
//! random op boundary after its start ([`DmaModel::due`]). Data timing cannot change a verdict: every
//! access it could affect is a race.
//!
//! **Verdicts do not depend on threads.** Steps along a `parallel` grid axis may run on another core:
//! at the end of a step whose next step (in grid order) moves along one, nothing may be outstanding and
//! every semaphore must be back at zero ([`DmaModel::cross`]) — whether or not this run splits the grid.
//! Other faults: a copy still using a pipelined block when its grid step ends ([`DmaModel::step_end`]),
//! a copy outstanding or a semaphore not at zero when the kernel or a `run_scoped` scope ends
//! ([`DmaModel::release`]).
//!
//! The interpreter runs this model. Mosaic-on-CPU runs its compiled module synchronously (a copy lands
//! at its start; its semaphores count the same bytes) and reports the faults it can see — deadlocks,
//! semaphores left counting — with this module's messages.

pub(crate) use super::dma_faults::*;
use crate::error::{kerr, Result, SourceLoc};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

/// Per-dimension sizes or starts, inline up to rank 6 (views are made per DMA; a paged KV buffer
/// has rank 5).
pub(crate) type Dims = SmallVec<[usize; 6]>;
/// Per-dimension flags of a view, inline up to rank 6.
pub(crate) type Flags = SmallVec<[bool; 6]>;

/// A window of ref `r` in the ref's own coordinates (squeezed dimensions have size 1) — or, with
/// `via`, a view of `r` through bitcasts and reshapes whose reach is that window.
#[derive(Debug, PartialEq)]
pub(crate) struct RefView {
    pub r: usize,
    pub starts: Dims,
    pub sizes: Dims,
    pub squeezed: Flags,
    /// The steps from `r`'s whole contents to what the program sees (a bitcast or reshape view; its
    /// windows are steps too), when the view is not the window itself.
    pub via: Option<std::sync::Arc<super::views::ViewPath>>,
}

/// The same view, its starts, sizes and flags copied (smallvec's own `clone` collects them element by
/// element; views are cloned per DMA and per view op).
impl Clone for RefView {
    fn clone(&self) -> RefView {
        RefView {
            r: self.r,
            starts: Dims::from_slice(&self.starts),
            sizes: Dims::from_slice(&self.sizes),
            squeezed: Flags::from_slice(&self.squeezed),
            via: self.via.clone(),
        }
    }
}

impl RefView {
    /// The whole of ref `r`, of shape `shape`.
    pub fn whole(r: usize, shape: &[usize]) -> RefView {
        RefView {
            r,
            starts: smallvec::smallvec![0; shape.len()],
            sizes: Dims::from_slice(shape),
            squeezed: smallvec::smallvec![false; shape.len()],
            via: None,
        }
    }

    /// The view of ref `r` that `path` describes, reaching the box around what it covers.
    pub fn through(r: usize, path: super::views::ViewPath) -> RefView {
        let (starts, sizes) = path.reach();
        RefView {
            r,
            squeezed: smallvec::smallvec![false; starts.len()],
            starts,
            sizes,
            via: Some(std::sync::Arc::new(path)),
        }
    }

    /// The shape the program sees: the window's sizes without its squeezed dimensions, or the
    /// view's.
    pub fn value_shape(&self) -> Dims {
        match &self.via {
            Some(p) => p.result().0,
            None => self.kept_sizes().collect(),
        }
    }

    /// A plain window's sizes, squeezed dimensions left out.
    fn kept_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.sizes
            .iter()
            .zip(&self.squeezed)
            .filter(|(_, q)| !**q)
            .map(|(n, _)| *n)
    }

    /// Whether `o`'s value has this view's shape (two plain windows compared in place: a paged
    /// kernel starts a copy per page).
    pub fn same_value_shape(&self, o: &RefView) -> bool {
        match (&self.via, &o.via) {
            (None, None) => self.kept_sizes().eq(o.kept_sizes()),
            _ => self.value_shape() == o.value_shape(),
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
    /// Bits of one element of ref `r`.
    fn elem_bits(&self, r: usize) -> u32;
}

/// The bytes of `elements` elements of `bits` bits (what a copy adds to its semaphore, what a wait on
/// a descriptor of that size takes) — the one byte count of both engines.
pub(crate) fn copy_bytes(elements: usize, bits: u32) -> i64 {
    (elements as u64 * bits as u64).div_ceil(8) as i64
}

/// The bytes of window `v`.
pub(crate) fn window_bytes(refs: &(impl Refs + ?Sized), v: &RefView) -> i64 {
    if let Some(p) = &v.via {
        let (shape, dtype) = p.result();
        return copy_bytes(shape.iter().product(), dtype.bit_width());
    }
    copy_bytes(v.sizes.iter().product(), refs.elem_bits(v.r))
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

/// One outstanding copy.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    pub src: RefView,
    pub dst: RefView,
    pub sem: Sem,
    /// Its bytes (what it adds to its semaphore).
    pub bytes: i64,
    pub started_at: SourceLoc,
    /// Ops left before its data moves by itself (seeded runs only).
    countdown: Option<u32>,
    /// Its data has moved (the engine was handed it).
    moved: bool,
    /// A copy between devices: the other end is on `peer.device` (both ends' views are in the one
    /// ref numbering every device of a launch shares).
    pub peer: Option<Peer>,
}

/// The other device of a remote copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub device: usize,
    /// This device sends (its source is local; the destination is the peer's), or receives.
    pub outgoing: bool,
    /// The engine's handle on the data of a copy received (it left the sender at its start).
    pub tag: u64,
}

impl InFlight {
    /// The source, when it is on this device.
    fn local_src(&self) -> Option<&RefView> {
        match self.peer {
            Some(p) if !p.outgoing => None,
            _ => Some(&self.src),
        }
    }
    /// The destination, when it is on this device.
    fn local_dst(&self) -> Option<&RefView> {
        match self.peer {
            Some(p) if p.outgoing => None,
            _ => Some(&self.dst),
        }
    }
    /// The source and the destination as messages name them: `o[0..8, 0..128]`, with `of device
    /// 2` on the peer's end.
    fn ends(&self, refs: &(impl Refs + ?Sized)) -> (String, String) {
        let name = |v: &RefView, local: bool| match self.peer {
            Some(p) if !local => format!("{} of device {}", v.describe(refs), p.device),
            _ => v.describe(refs),
        };
        (
            name(&self.src, self.local_src().is_some()),
            name(&self.dst, self.local_dst().is_some()),
        )
    }
}

/// The outstanding copies and the semaphores of one core (one chunk of grid steps).
#[derive(Clone, Debug, Default)]
pub(crate) struct DmaModel {
    /// Copies started and not known complete, oldest first.
    inflight: Vec<InFlight>,
    /// Per ref: how many of `inflight` have their destination, and their source, on this device
    /// in it (an access to a ref no copy touches needs no check).
    ends: Vec<[u32; 2]>,
    /// Semaphore values: a DMA semaphore's are the bytes of the copies started on it less the bytes
    /// waited for (what landed and what is still to land); a regular one's, signals less waits.
    sems: HashMap<Sem, i64>,
    /// Per DMA semaphore: the bytes waited for toward its outstanding copies.
    credit: HashMap<Sem, i64>,
    /// xorshift state for seeded completion points (None: copies complete at their waits).
    rng: Option<u64>,
}

/// Count copy `f`'s ends on this device into (`add`) or out of `ends` (per ref: destinations,
/// sources).
fn count_ends(ends: &mut Vec<[u32; 2]>, f: &InFlight, add: bool) {
    for (k, v) in [f.local_dst(), f.local_src()].into_iter().enumerate() {
        let Some(v) = v else { continue };
        if ends.len() <= v.r {
            ends.resize(v.r + 1, [0; 2]);
        }
        let n = &mut ends[v.r][k];
        *n = if add { *n + 1 } else { n.saturating_sub(1) };
    }
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

    /// No copy outstanding (reads and writes need no check).
    pub fn idle(&self) -> bool {
        self.inflight.is_empty()
    }

    /// Whether copies complete at seeded random points (else only at their waits).
    pub fn seeded(&self) -> bool {
        self.rng.is_some()
    }

    /// Whether a read (`write`: a write) of ref `r` could race a copy in flight: one into it (or,
    /// for a write, from it) is outstanding. Where not, [`Self::check_access`] finds nothing, so a
    /// caller may skip building the window it checks.
    pub fn touches(&self, r: usize, write: bool) -> bool {
        let [copies_into, copies_from] = self.ends.get(r).copied().unwrap_or_default();
        copies_into > 0 || (write && copies_from > 0)
    }

    /// An error if `v` is read while a copy into it is in flight (`write`: or written while a copy
    /// from or into it is).
    pub fn check_access(
        &self,
        refs: &(impl Refs + ?Sized),
        v: &RefView,
        write: bool,
    ) -> Result<()> {
        if !self.touches(v.r, write) {
            return Ok(());
        }
        for f in &self.inflight {
            let from = match f.peer {
                Some(p) if !p.outgoing => format!(" from device {}", p.device),
                _ => String::new(),
            };
            if f.local_dst().is_some_and(|d| d.overlaps(v)) {
                let what = if write { "writes" } else { "reads" };
                return Err(kerr!(
                    Race,
                    "{what} {} while the DMA{from} into {} started at {} is in flight: wait for the copy first (a copy is known complete once the waits on its semaphore, {}, have taken every byte of the copies outstanding on it)",
                    v.describe(refs),
                    f.dst.describe(refs),
                    f.started_at,
                    sem_name(refs, f.sem)
                ));
            }
            if write && f.local_src().is_some_and(|s| s.overlaps(v)) {
                let to = match f.peer {
                    Some(p) => format!(" to device {}", p.device),
                    None => String::new(),
                };
                return Err(kerr!(
                    Race,
                    "writes {} while the DMA from {}{to} started at {} is in flight: wait for the copy first (a copy is known complete once the waits on its semaphore, {}, have taken every byte of the copies outstanding on it)",
                    v.describe(refs),
                    f.src.describe(refs),
                    f.started_at,
                    sem_name(refs, f.sem)
                ));
            }
        }
        Ok(())
    }

    /// Start a copy from `src` into `dst` signalling `sem` (started at `loc`). With a `peer`, one end
    /// of a copy between devices: this device sends `src` (its bytes go on `sem`, the send semaphore,
    /// as they leave: at once, the data having left at the start) into `dst` on `peer.device`, or
    /// receives into `dst` (the bytes land on `sem`, the receive semaphore; the data moves when a wait
    /// shows the copy complete). Reading a source, or touching a destination, of a copy in flight on
    /// this device is a race.
    pub fn start(
        &mut self,
        refs: &(impl Refs + ?Sized),
        (src, dst): (RefView, RefView),
        sem: Sem,
        peer: Option<Peer>,
        loc: SourceLoc,
    ) -> Result<()> {
        if !src.same_value_shape(&dst) {
            return Err(copy_shapes_differ(&src.value_shape(), &dst.value_shape()));
        }
        if peer.is_none_or(|p| p.outgoing) {
            self.check_access(refs, &src, false)?;
        }
        if peer.is_none_or(|p| !p.outgoing) {
            self.check_access(refs, &dst, true)?;
        }
        let bytes = window_bytes(refs, &dst);
        // Seeded timing moves a local copy's data early; a remote copy's left at its start or lands
        // at its wait.
        let countdown = if peer.is_none() { self.next() } else { None };
        *self.sems.entry(sem).or_insert(0) += bytes;
        let f = InFlight {
            src,
            dst,
            sem,
            bytes,
            started_at: loc,
            countdown,
            moved: peer.is_some_and(|p| p.outgoing),
            peer,
        };
        count_ends(&mut self.ends, &f, true);
        self.inflight.push(f);
        Ok(())
    }

    /// The copy started last moves its data now, ahead of its wait (the engine lands it before
    /// anything could see it); it stays outstanding until its wait, as a seeded run's early copies do.
    pub fn moved_early(&mut self) {
        if let Some(f) = self.inflight.last_mut() {
            f.moved = true;
        }
    }

    /// A wait for `bytes` on DMA semaphore `sem` (a descriptor's size). When the waits on `sem` have
    /// now taken every byte of its outstanding copies, those copies are known complete: the ones whose
    /// data has not moved yet are returned, oldest first, for the engine to copy before anything else
    /// runs.
    pub fn wait(
        &mut self,
        refs: &(impl Refs + ?Sized),
        sem: Sem,
        bytes: i64,
    ) -> Result<Vec<InFlight>> {
        let value = self.value(sem);
        if value < bytes {
            return Err(deadlock_dma_wait(&sem_name(refs, sem), bytes, value));
        }
        self.sems.insert(sem, value - bytes);
        let credit = self.credit.entry(sem).or_insert(0);
        *credit += bytes;
        let (mut owed, mut n) = (0, 0);
        for f in self.inflight.iter().filter(|f| f.sem == sem) {
            owed += f.bytes;
            n += 1;
        }
        if *credit < owed {
            return Ok(Vec::new());
        }
        *credit -= owed;
        // Moved out, not cloned, into one allocation (a KV block's wait ends a copy per page; in a
        // process whose heap XLA has fragmented, each `malloc` past the thread cache searches bins).
        let mut done = Vec::with_capacity(n);
        for f in self.inflight.extract_if(.., |f| f.sem == sem) {
            count_ends(&mut self.ends, &f, false);
            if !f.moved {
                done.push(f);
            }
        }
        Ok(done)
    }

    /// After each op of a seeded run: the copies whose data moves now (still outstanding), oldest
    /// first, for the engine to copy in that order.
    pub fn due(&mut self) -> Vec<InFlight> {
        let mut done = Vec::new();
        for f in &mut self.inflight {
            match &mut f.countdown {
                Some(0) if !f.moved => {
                    f.moved = true;
                    done.push(f.clone());
                }
                Some(n) if *n > 0 => *n -= 1,
                _ => {}
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
            let ends = [(f.local_src(), "from"), (f.local_dst(), "into")];
            for (v, what) in ends.iter().filter_map(|(v, w)| Some(((*v)?, *w))) {
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

    /// The end of grid step `point`, whose next step moves along `parallel` axis `axis` (and may run
    /// on another core): nothing outstanding, every semaphore at zero.
    pub fn cross(
        &self,
        refs: &(impl Refs + ?Sized),
        point: &[i64],
        axis: usize,
        dma: impl Fn(usize) -> bool,
    ) -> Result<()> {
        if let Some(f) = self.inflight.first() {
            let (src, dst) = f.ends(refs);
            return Err(kerr!(
                Race,
                "the DMA from {src} into {dst} started here is still in flight at the end of grid step {point:?}, whose next step moves along parallel axis {axis} and may run on another core: wait for it in the same step, or make axis {axis} arbitrary"
            )
            .at(f.started_at));
        }
        let mut left: Vec<_> = self.sems.iter().filter(|(_, v)| **v != 0).collect();
        left.sort();
        match left.first() {
            Some((sem, v)) => Err(semaphore_across_cores(
                &sem_name(refs, **sem),
                dma(sem.0),
                **v,
                point,
                axis,
            )),
            None => Ok(()),
        }
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
        self.credit.retain(|k, _| k.0 < first);
        verdict
    }

    fn check_released(&self, refs: &(impl Refs + ?Sized), first: usize, at: Release) -> Result<()> {
        if let Some(f) = self.inflight.iter().find(|f| {
            f.local_src().is_some_and(|v| v.r >= first)
                || f.local_dst().is_some_and(|v| v.r >= first)
        }) {
            let (src, dst) = f.ends(refs);
            return Err(kerr!(
                Race,
                "the DMA from {src} into {dst} started here is still in flight when {}: wait for it{}",
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

#[cfg(test)]
#[path = "dma_tests.rs"]
mod tests;

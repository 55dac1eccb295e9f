//! Copies that land in the background: a local copy into a scratch buffer of this machine moves its
//! data on a pool helper from its start on, while the region loop runs the ops that cannot see it
//! (index arithmetic, views, further starts, loads of other refs — a paged kernel's loop starting a
//! copy per page), instead of all at once at its wait.
//!
//! DMA semantics allow it: a copy's data may move at any time between its start and the wait that
//! retires it, and every access that could tell when is a race the DMA model reports
//! ([`crate::semantics::dma`]); the copy stays outstanding in the model until its wait, as a seeded
//! run's early copies do. What makes it safe here: the region loop settles every background copy —
//! the helper's and the ones not yet taken, which the loop's thread copies itself — before any op
//! that is not [`Machine::inert_while_landing`], at the end of a grid step and when the machine is
//! dropped. The destination is a uniquely held buffer of the machine's own (no other tensor sees its
//! elements), which nothing but the copies touches until they settle; the source is a view read in
//! place (a lent array, or a buffer the view keeps alive). A copy that is not of that kind lands at
//! its wait as before.

use super::*;
use crate::interpret::workers::{Hot, Platform};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

/// Per-dimension sizes, strides or offsets of one copy, inline up to rank 6.
type Layout = smallvec::SmallVec<[usize; 6]>;

/// One copy's data move: elements of `dtype` from the source buffer (`src`: its address and
/// length) into the destination buffer at `dst`, `shape` of them, each side from its first element
/// along its strides (in elements; the destination's checked in bounds when the task was made).
pub(super) struct Task {
    dtype: DType,
    shape: Layout,
    src: ((*const u8, usize), usize, Layout),
    dst: (*mut u8, usize, Layout),
    /// The source's buffer when the interpreter owns it (kept alive until the task ends).
    _keep: Option<Arc<crate::semantics::host::HostData>>,
}

// SAFETY: `dst` addresses a machine's uniquely held buffer, which stays allocated and untouched by
// anything else until the copies into it are settled (module docs); copies in flight together have
// disjoint destinations (overlapping ones are a race the DMA model rejects at the start), so no two
// tasks write one element. The source is only read: a buffer `_keep` holds, a lent array or a
// caller's array, each alive for the run, that nothing writes while the copy is outstanding (a
// write to a source in flight is a race the model reports before it happens).
unsafe impl Send for Task {}

impl Task {
    fn run(&self) {
        with_dtype!(self.dtype, T => {
            let ((ptr, len), dst) = (self.src.0, self.dst.0.cast::<T>());
            // SAFETY: `len` initialized elements of `T` (the source buffer's), alive and unwritten
            // while the copy is outstanding (see `Send` above).
            let src = unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len) };
            for_each_row(
                &self.shape,
                [&self.dst.2, &self.src.2],
                [self.dst.1, self.src.1],
                |[od, os], n, [sd, ss]| {
                    // SAFETY: every element the rows reach in the destination is in bounds
                    // (checked when the task was made); see `Send` above for who else touches them.
                    unsafe { copy_row(dst, src, [od, os], n, [sd, ss]) }
                },
            );
        })
    }
}

/// Where window `(starts, sizes, squeezed)` of a tensor of `strides` from `offset` lies: its first
/// element and, per kept dimension, its size and stride — if all of it is below `len`.
fn place(
    (offset, strides): (usize, &[usize]),
    (starts, sizes, squeezed): (&[usize], &[usize], &[bool]),
    len: usize,
) -> Option<(usize, Layout, Layout)> {
    let (mut first, mut last) = (offset, offset);
    let (mut shape, mut steps) = (Layout::new(), Layout::new());
    let rank = strides.len();
    if starts.len() != rank || sizes.len() != rank || squeezed.len() != rank {
        return None;
    }
    for (((&start, &size), &squeezed), &stride) in
        starts.iter().zip(sizes).zip(squeezed).zip(strides)
    {
        first += start * stride;
        last += (start + size.checked_sub(1)?) * stride;
        if !squeezed {
            shape.push(size);
            steps.push(stride);
        }
    }
    (last < len).then_some((first, shape, steps))
}

#[derive(Default)]
struct State {
    tasks: VecDeque<Task>,
    /// Tasks taken and not yet finished.
    busy: usize,
    /// A helper job is queued or draining the tasks.
    helper: bool,
    failed: Option<crate::error::KernelError>,
}

#[derive(Default)]
struct Lander {
    state: Mutex<State>,
}

impl Lander {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next task, counted busy; `helper`: a helper that finds none leaves.
    fn take(&self, helper: bool) -> Option<Task> {
        let mut s = self.lock();
        let t = s.tasks.pop_front();
        match &t {
            Some(_) => s.busy += 1,
            None if helper => s.helper = false,
            None => {}
        }
        t
    }

    fn finish(&self, t: Task) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.run()))
            .map_err(|_| internal("a copy panicked in the interpreter"));
        // The source view goes before the task is counted done.
        drop(t);
        let mut s = self.lock();
        s.busy -= 1;
        if let Err(e) = r {
            s.failed.get_or_insert(e);
        }
    }

    fn submit(self: &Arc<Self>, t: Task) {
        let mut s = self.lock();
        s.tasks.push_back(t);
        if !s.helper {
            s.helper = true;
            let me = Arc::clone(self);
            Hot::spawn(move || {
                while let Some(t) = me.take(true) {
                    me.finish(t);
                }
            });
        }
    }

    /// Every task landed: the ones not taken on this thread, then a wait for the helper's.
    fn settle(&self) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if let Some(t) = self.take(false) {
                self.finish(t);
                continue;
            }
            {
                let mut s = self.lock();
                if s.busy == 0 && s.tasks.is_empty() {
                    return s.failed.take().map_or(Ok(()), Err);
                }
            }
            Hot::pause(&mut spins);
        }
    }
}

thread_local! {
    /// Copies machines on this thread have landed in the background ([`background_landings`]).
    static LANDED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many copies machines running on this thread have landed in the background so far (for
/// tests that the path is taken).
pub(crate) fn background_landings() -> usize {
    LANDED.with(|n| n.get())
}

/// A machine's background copies: the lander (made at the first) and the refs they write.
#[derive(Default)]
pub(super) struct Background {
    /// Copies may land in the background: the machine runs the whole grid on its thread, with
    /// parallelism allowed (a pool helper takes the copies when it is free; the machine's thread
    /// lands the rest when it settles).
    pub enabled: bool,
    lander: Option<Arc<Lander>>,
    dsts: smallvec::SmallVec<[usize; 4]>,
}

impl Background {
    pub fn pending(&self) -> bool {
        !self.dsts.is_empty()
    }
}

impl<'k> Machine<'k> {
    /// The data move of copy `(src, dst)`, about to start, when it may land in the background (the
    /// kind the module docs describe).
    pub(super) fn background_task(&mut self, src: &RefView, dst: &RefView) -> Result<Option<Task>> {
        // (A source some background copy writes would be read while it is written.)
        if !self.landing.enabled
            || self.dma.seeded()
            || self.link.is_some()
            || src.via.is_some()
            || dst.via.is_some()
            || src.r == dst.r
            || self.landing.dsts.contains(&src.r)
        {
            return Ok(None);
        }
        // The source where it lies: the ref's contents (a ref never written reads its fill value,
        // and an output block written through lies in its array: both land at the wait).
        let Some(from) = &self.refs[src.r].content else {
            return Ok(None);
        };
        let dtype = from.dtype;
        let (src_ptr, src_len, keep) = with_dtype!(dtype, T => match (&from.buf, from.buf.slice::<T>()) {
            (Buf::One(_), _) | (_, None) => return Ok(None),
            (Buf::Host(h), Some(v)) => (v.as_ptr().cast::<u8>(), v.len(), Some(Arc::clone(h))),
            (_, Some(v)) => (v.as_ptr().cast::<u8>(), v.len(), None),
        });
        let Some((src_off, shape, src_steps)) = place(
            (from.offset, &from.strides),
            (&src.starts, &src.sizes, &src.squeezed),
            src_len,
        ) else {
            return Ok(None);
        };
        // The destination: the ref's own buffer, contiguous (no two elements in one place) and
        // held by nothing else.
        let Some(to) = &mut self.refs[dst.r].content else {
            return Ok(None);
        };
        if to.dtype != dtype || !to.is_contiguous() {
            return Ok(None);
        }
        let Tensor {
            buf: Buf::Host(host),
            offset,
            strides,
            ..
        } = to
        else {
            return Ok(None);
        };
        let Some(host) = Arc::get_mut(host) else {
            return Ok(None);
        };
        let (dst_ptr, dst_len) = with_dtype!(dtype, T => match T::vec_mut(host) {
            Some(v) => (v.as_mut_ptr().cast::<u8>(), v.len()),
            None => return Ok(None),
        });
        let Some((dst_off, dst_shape, dst_steps)) = place(
            (*offset, strides),
            (&dst.starts, &dst.sizes, &dst.squeezed),
            dst_len,
        ) else {
            return Ok(None);
        };
        if dst_shape != shape {
            return Ok(None);
        }
        Ok(Some(Task {
            dtype,
            shape,
            src: ((src_ptr, src_len), src_off, src_steps),
            dst: (dst_ptr, dst_off, dst_steps),
            _keep: keep,
        }))
    }

    /// Land `task`, a copy into ref `r` the DMA model has just started, in the background.
    pub(super) fn land_in_background(&mut self, task: Task, r: usize) {
        LANDED.with(|n| n.set(n.get() + 1));
        self.dma.moved_early();
        let lander = self.landing.lander.get_or_insert_with(Default::default);
        lander.submit(task);
        if !self.landing.dsts.contains(&r) {
            self.landing.dsts.push(r);
        }
    }

    /// Every background copy landed.
    pub(super) fn settle_landing(&mut self) -> Result<()> {
        if !self.landing.pending() {
            return Ok(());
        }
        self.landing.dsts.clear();
        match &self.landing.lander {
            Some(l) => l.settle(),
            None => Ok(()),
        }
    }

    /// Whether op `i` of a region (with `plan`) may run while copies land in the background: it
    /// touches no ref's elements (scalar arithmetic, views, starts, loop control), or loads from a
    /// ref no background copy writes.
    pub(super) fn inert_while_landing(&self, op: &Op, plan: &Plan, i: usize) -> bool {
        if plan.scalar[i] {
            return true;
        }
        match op.kind {
            OpKind::RefView(_)
            | OpKind::RefBitcast
            | OpKind::RefReshape
            | OpKind::DmaStart
            | OpKind::Yield
            | OpKind::If => true,
            OpKind::For => plan.split[i].is_none(),
            OpKind::Load(_) => {
                plan.chain[i].is_none()
                    && plan.sink_to[i].is_none()
                    && op.operands.first().is_some_and(|v| {
                        let r = match self.env.get(v.0 as usize) {
                            Some(Some(Value::Ref(r))) => *r,
                            Some(Some(Value::View(view))) => view.r,
                            _ => return false,
                        };
                        !self.landing.dsts.contains(&r)
                    })
            }
            _ => false,
        }
    }
}

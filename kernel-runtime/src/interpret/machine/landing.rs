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

/// One copy's data move: the source's elements into `len` elements of `dtype` at `ptr`, from
/// offset `off` along `strides`.
pub(super) struct Task {
    data: Tensor,
    ptr: *mut u8,
    len: usize,
    off: usize,
    strides: Vec<usize>,
}

// SAFETY: `ptr` addresses a machine's uniquely held buffer, which stays allocated and untouched by
// anything else until the copies into it are settled (module docs); copies in flight together have
// disjoint destinations (overlapping ones are a race the DMA model rejects at the start), so no two
// tasks write one element. The source tensor is read only.
unsafe impl Send for Task {}

impl Task {
    fn run(&self) -> Result<()> {
        with_dtype!(self.data.dtype, T => {
            // SAFETY: see `Send` above: the buffer holds `len` elements of `T` (its ref's dtype,
            // checked against the source's at the start) and only this task writes these elements.
            unsafe { write_view_raw::<T>(self.ptr.cast::<T>(), self.len, self.off, &self.strides, &self.data, None) }
        })
    }
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
            .unwrap_or_else(|_| Err(internal("a copy panicked in the interpreter")));
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
        let data = self.read_window(src)?;
        let st = &mut self.refs[dst.r];
        let (dtype, shape) = (st.dtype, &st.shape);
        if !refs::fits_window(&data, dtype, &dst.sizes, &dst.squeezed) {
            return Ok(None);
        }
        // The destination's own buffer, contiguous from 0 and held by nothing else.
        let Some(Tensor {
            buf: Buf::Host(host),
            offset: 0,
            ..
        }) = &mut st.content
        else {
            return Ok(None);
        };
        let Some(host) = Arc::get_mut(host) else {
            return Ok(None);
        };
        let (ptr, len) = with_dtype!(dtype, T => match T::vec_mut(host) {
            Some(v) if v.len() == shape.iter().product::<usize>() => (v.as_mut_ptr().cast::<u8>(), v.len()),
            _ => return Ok(None),
        });
        if !st.content.as_ref().is_some_and(|t| t.is_contiguous()) {
            return Ok(None);
        }
        let ones = vec![1; shape.len()];
        let (off, strides) = refs::window_layout(shape, (&dst.starts, &dst.squeezed, &ones));
        Ok(Some(Task {
            data,
            ptr,
            len,
            off,
            strides,
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

//! A split loop (`plan/split.rs`) run across threads: every iteration on a machine of its thread's
//! own, forked from this one — the values the body uses from outside, the refs — with each ref the body
//! writes lent to all of them (`Buf::Shared`): an iteration writes only its own index of it, in place,
//! so nothing is merged afterwards. Loops run this way only where the grid itself is not split across
//! threads, no copy can land mid-loop and no output block is held in its output array; elsewhere they
//! run one iteration after another. Copies may be in flight (a kernel's next KV block, prefetched
//! under this one's compute): they land only at their waits, and a split body holds no wait; each
//! iteration's machine has the list of them, so a read or write of a copy's window is the race the
//! sequential run reports. A seeded run (`dma_seed`, copies landing at random points between ops)
//! with copies in flight runs the loop in order. Either way the bits are
//! the same (`tests/plan.rs::a_split_loop_gives_the_sequential_bits_and_errors`, `tests/ragged_paged_attention.rs::split_head_loops_give_the_sequential_bits`).

use super::*;
use crate::interpret::plan::SplitLoop;
use crate::interpret::tensor::Shared;
use crate::interpret::workers;
use std::sync::Mutex;

/// What each iteration's machine is made from.
struct Fork<'k, 'a> {
    func: &'k Func,
    poison: bool,
    free: Vec<(usize, Value)>,
    /// The running machine's refs, cloned into each iteration's machine with `lent`'s contents
    /// in place of theirs (one clone per machine: a clone of every ref's state costs a reference
    /// count per buffer and label, the helper's clone on the split loop's critical path; the DMA
    /// model, below, likewise).
    refs: &'a [RefState],
    lent: Vec<(usize, Tensor)>,
    barrier: usize,
    values: usize,
    segments: std::sync::Arc<walk::SegmentCache>,
    dma: &'a DmaModel,
    epoch: u64,
}

impl<'k> Fork<'k, '_> {
    fn machine(&self) -> Machine<'k> {
        let mut env = value_table(self.values);
        for (v, value) in &self.free {
            env[*v] = Some(value.clone());
        }
        let mut refs = self.refs.to_vec();
        for (r, shared) in &self.lent {
            refs[*r].content = Some(shared.clone());
        }
        Machine {
            func: self.func,
            poison: self.poison,
            env,
            refs,
            dests: vec![None; self.refs.len()],
            dma: self.dma.clone(),
            link: None,
            received: std::collections::HashMap::new(),
            barrier: self.barrier,
            segments: self.segments.clone(),
            epoch: self.epoch,
            loop_threads: 1,
            landing: Default::default(),
        }
    }
}

impl<'k> Machine<'k> {
    /// Run `op`, a split `for` loop, its iterations across up to `loop_threads` threads (one after
    /// another where the module docs say so).
    pub(super) fn split_for(&mut self, op: &Op, sub: &[Plan], split: &SplitLoop) -> Result<Values> {
        let ((lo, hi, step), body, plan, iv_dtype) = self.loop_parts(op, sub)?;
        let trips = if hi > lo {
            (hi as i128 - lo as i128 + step as i128 - 1) / step as i128
        } else {
            0
        };
        if trips < 2
            || (self.dma.seeded() && !self.dma.idle())
            || self.link.is_some()
            || self.refs.iter().any(|r| r.written_through)
        {
            return self.for_loop(op, sub);
        }
        // Each written ref's contents as one buffer of its own (copied first only if some value still
        // shares it), lent to the iterations.
        let mut lent = Vec::with_capacity(split.written.len());
        for (root, _) in &split.written {
            let r = self.ref_index(*root)?;
            let mut t = self.owned_contents(r)?;
            let dtype = t.dtype;
            let (ptr, len) = with_dtype!(dtype, T => {
                let v = t.buf.elems_mut::<T>()?;
                (v.as_mut_ptr().cast::<u8>(), v.len())
            });
            let shared = Tensor {
                dtype,
                shape: t.shape.clone(),
                strides: t.strides.clone(),
                offset: t.offset,
                buf: Buf::Shared(Shared { dtype, ptr, len }),
            };
            self.refs[r].content = Some(t);
            lent.push((r, shared));
        }
        let fork = Fork {
            func: self.func,
            poison: self.poison,
            free: split
                .free
                .iter()
                .filter_map(|v| {
                    let i = v.0 as usize;
                    self.env.get(i)?.clone().map(|value| (i, value))
                })
                .collect(),
            refs: &self.refs,
            lent,
            barrier: self.barrier,
            values: self.env.len(),
            segments: self.segments.clone(),
            dma: &self.dma,
            epoch: self.epoch,
        };
        let first = Mutex::new(None::<(usize, crate::error::KernelError)>);
        let ok = workers::run(
            trips as usize,
            self.loop_threads,
            || fork.machine(),
            |m, c| {
                let iv = lo + c as i64 * step;
                let arg = Value::T(Tensor::splat(Literal::from_i64(iv_dtype, iv), &[]));
                let run = m
                    .region(body, plan, vec![arg])
                    .and_then(|out| match out.is_empty() {
                        true => Ok(()),
                        false => Err(internal("a split loop yields values")),
                    });
                if let Err(e) = run {
                    let mut f = first.lock().unwrap_or_else(|p| p.into_inner());
                    if f.as_ref().is_none_or(|(fc, _)| c < *fc) {
                        *f = Some((c, e));
                    }
                }
            },
        );
        // Every iteration's machine is gone: the lent buffers are this machine's alone again.
        drop(fork);
        if !ok {
            return Err(internal("a loop iteration panicked in the interpreter"));
        }
        match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some((_, e)) => Err(e),
            None => Ok(Values::new()),
        }
    }
}

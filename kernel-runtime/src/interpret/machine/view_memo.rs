//! Views a thread made before. A view op's result depends only on the kernel (its refs' shapes and
//! types), its base view and the values of its run-time starts and sizes; composing it through a
//! bitcast or reshape path (`RefView::through`) costs ~1 µs. So each thread keeps, per view op, the
//! last [`WAYS`] bases and operand values it saw and the view each made: a loop that takes a view of
//! one of a few bases (kv head `h` of a bitcast ref, `h` in `0..2`; the reshape of that) finds it
//! here, and so do a split loop's machines, made afresh for every run of the loop (`split.rs`),
//! which find what the machines before them made on their thread.
//!
//! Entries are valid for the machines of one epoch: [`Machine::new`] draws a new one, a split loop's
//! machines take their parent's, and all the machines of an epoch run one kernel. A thread that meets
//! a machine of another epoch drops what it kept. (Errors are not kept: a view that failed its
//! bounds check fails again when made again.)

use super::*;
use crate::semantics::views::ViewStep;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Views kept per view op.
const WAYS: usize = 4;

/// A view made: of `base`, with run-time operand values `args`.
struct Entry {
    base: RefView,
    args: smallvec::SmallVec<[i64; 4]>,
    made: Box<RefView>,
}

/// One view op's entries; `next` is the one replaced next (round robin).
#[derive(Default)]
struct Ways {
    entries: smallvec::SmallVec<[Entry; WAYS]>,
    next: usize,
}

#[derive(Default)]
struct Memo {
    epoch: u64,
    /// By the view op's result.
    ops: rustc_hash::FxHashMap<u32, Ways>,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
    /// Views made on this thread by ops that keep them ([`views_made`]).
    static MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many views the kept view ops on this thread have made rather than found (for tests that the
/// memo is used).
pub(crate) fn views_made() -> usize {
    MADE.with(|n| n.get())
}

/// A new epoch, for a new machine (not a split loop's: those share their parent's).
pub(super) fn new_epoch() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether a window of `base` is made by composing steps (a bitcast or reshape path other than one
/// reshape of leading dimensions, which `window_view` turns into a plain window of the ref).
pub(super) fn composes(base: &RefView) -> bool {
    base.via
        .as_ref()
        .is_some_and(|p| !matches!(&p.steps[..], [ViewStep::Reshape(_)]))
}

impl Machine<'_> {
    /// View op `op`'s view of `base` with run-time operand values `args`: the one this thread made
    /// for them in this epoch, else `make`'s (kept).
    pub(super) fn memo_view(
        &self,
        op: &Op,
        (base, args): (&RefView, &[i64]),
        make: impl FnOnce() -> Result<RefView>,
    ) -> Result<Box<RefView>> {
        let key = op.results[0].0;
        let epoch = self.epoch;
        let found = MEMO.try_with(|m| {
            let mut m = m.borrow_mut();
            if m.epoch != epoch {
                m.ops.clear();
                m.epoch = epoch;
            }
            let ways = m.ops.get(&key)?;
            ways.entries
                .iter()
                .find(|e| e.args[..] == *args && e.base == *base)
                .map(|e| e.made.clone())
        });
        if let Ok(Some(made)) = found {
            return Ok(made);
        }
        let made = Box::new(make()?);
        let _ = MADE.try_with(|n| n.set(n.get() + 1));
        let _ = MEMO.try_with(|m| {
            let mut m = m.borrow_mut();
            if m.epoch != epoch {
                return;
            }
            let ways = m.ops.entry(key).or_default();
            let entry = Entry {
                base: base.clone(),
                args: args.into(),
                made: made.clone(),
            };
            if ways.entries.len() < WAYS {
                ways.entries.push(entry);
            } else {
                let at = ways.next;
                ways.entries[at] = entry;
                ways.next = (at + 1) % WAYS;
            }
        });
        Ok(made)
    }
}

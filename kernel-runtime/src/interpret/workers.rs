//! Running numbered chunks of work on the calling thread and rayon's workers.
//!
//! `par_iter` from a thread outside rayon's pool parks the caller until the pool is done: on the
//! 2-core VMs we measure on, that hand-off (park, wake) costs ~25 µs per call — as much as a whole
//! 1024² elementwise kernel's worth of grid steps. Here the caller takes chunks itself, the pool's
//! workers join when they wake, every participant claims the next chunk from a shared counter, and the
//! caller spins (briefly, then yielding) on the count of finished chunks instead of sleeping.
//!
//! Soundness: a helper job may start after the caller has returned. It claims a chunk number from the
//! shared counters (which it co-owns through an `Arc`) before it calls into the caller's borrowed work,
//! and a claim below `n` keeps the caller waiting, since the caller returns only when all `n` chunks
//! are counted done. A participant counts its last chunk done only after dropping its per-thread state,
//! as its very last access to anything borrowed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

struct Counters {
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
}

/// A participant's loop over chunks, starting with one it has already claimed.
type Loop<'a> = dyn Fn(usize, &Counters) + Sync + 'a;

/// The borrowed loop, lifetime erased (see the module docs for why it is never called too late).
#[derive(Clone, Copy)]
struct Work(*const Loop<'static>);
// SAFETY: the pointee is `Sync`; it is only called while the caller of `run` is still waiting.
unsafe impl Send for Work {}

/// Run `f(state, c)` for every `c` in `0..n`, each exactly once, on up to `threads` threads (the caller
/// included); every participating thread makes its state with `init` before its first chunk. Returns
/// false if some `f` panicked (the panic is caught so every chunk is still accounted for).
pub(crate) fn run<S>(
    n: usize,
    threads: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) + Sync,
) -> bool {
    let counters = Arc::new(Counters {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    });
    let chunks = |first: usize, ctr: &Counters| {
        let mut state = None;
        let mut c = first;
        loop {
            let body = || f(state.get_or_insert_with(&init), c);
            if catch_unwind(AssertUnwindSafe(body)).is_err() {
                ctr.panicked.store(true, Ordering::Relaxed);
            }
            let next = ctr.next.fetch_add(1, Ordering::Relaxed);
            if next >= n {
                break;
            }
            // Chunk `next` is ours now, so the caller keeps waiting: `c` may be counted already.
            ctr.done.fetch_add(1, Ordering::Release);
            c = next;
        }
        drop(state);
        // The last access to anything borrowed was above; from here the caller may return.
        ctr.done.fetch_add(1, Ordering::Release);
    };
    let helpers = threads.min(n).saturating_sub(1);
    if helpers > 0 {
        let borrowed: &Loop<'_> = &chunks;
        // SAFETY: lifetime erasure only; see the module docs (and the wait below).
        let work =
            Work(unsafe { std::mem::transmute::<*const Loop<'_>, *const Loop<'static>>(borrowed) });
        for _ in 0..helpers {
            let counters = Arc::clone(&counters);
            rayon::spawn(move || {
                let work = work;
                let c = counters.next.fetch_add(1, Ordering::Relaxed);
                if c < n {
                    // SAFETY: chunk `c` is claimed and not yet done, so the caller is still waiting.
                    unsafe { (*work.0)(c, &counters) };
                }
            });
        }
    }
    let c = counters.next.fetch_add(1, Ordering::Relaxed);
    if c < n {
        chunks(c, &counters);
    }
    let mut spins = 0u32;
    while counters.done.load(Ordering::Acquire) < n {
        if spins < 1 << 12 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    !counters.panicked.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn every_chunk_runs_once_with_per_thread_state() {
        let seen = Mutex::new(vec![0u32; 1000]);
        let inits = AtomicUsize::new(0);
        assert!(run(
            1000,
            4,
            || inits.fetch_add(1, Ordering::Relaxed),
            |_, c| seen.lock().unwrap()[c] += 1,
        ));
        assert!(seen.into_inner().unwrap().iter().all(|&k| k == 1));
        assert!((1..=4).contains(&inits.load(Ordering::Relaxed)));
    }

    #[test]
    fn a_panicking_chunk_is_reported_and_the_rest_still_run() {
        let count = AtomicUsize::new(0);
        let ok = run(
            64,
            2,
            || (),
            |_, c| {
                count.fetch_add(1, Ordering::Relaxed);
                if c == 7 {
                    panic!("chunk 7");
                }
            },
        );
        assert!(!ok);
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }
}

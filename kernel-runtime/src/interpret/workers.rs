//! Running numbered chunks of work on the calling thread and the pool's helpers.
//!
//! `par_iter` from a thread outside rayon's pool parks the caller until the pool is done: on the
//! 2-core VMs we measure on, that hand-off (park, wake) costs ~25 µs per call — as much as a whole
//! 1024² elementwise kernel's worth of grid steps. Here the caller takes chunks itself, the helpers
//! join when they start (they stay awake a while between jobs: [`hot`]), every participant claims the
//! next chunk from a shared counter, and the caller spins (briefly, then yielding) on the count of
//! finished chunks instead of sleeping.
//!
//! Soundness: a helper job may start after the caller has returned. It claims a chunk number from the
//! shared counters (which it co-owns through an `Arc`) before it calls into the caller's borrowed work,
//! and a claim below `n` keeps the caller waiting, since the caller returns only when all `n` chunks
//! are counted done. A participant counts its last chunk done only after dropping its per-thread state,
//! as its very last access to anything borrowed.
//!
//! The protocol is written once, over [`Platform`] (its atomics, how a helper is started, how the
//! caller waits): [`run`] is it on std's atomics and the [`hot`] pool; the tests run the same code under
//! loom's model checker, which tries every interleaving of a caller and its helpers (and the weaker
//! orders the `Relaxed`/`Release`/`Acquire` operations allow) and finds each chunk run exactly once,
//! panics reported, nothing borrowed touched after `run` returns, and every chunk's writes visible to
//! the caller when it returns.

mod hot;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The atomics and threads the protocol runs on.
pub(crate) trait Platform: 'static {
    type Count: Count;
    type Flag: Flag;
    /// Start a helper job (it may run at any later time, also after `run` has returned).
    fn spawn(job: impl FnOnce() + Send + 'static);
    /// One wait of the caller's spin loop (`spins` counts the waits so far).
    fn pause(spins: &mut u32);
}

pub(crate) trait Count: Send + Sync {
    fn new(v: usize) -> Self;
    fn fetch_add(&self, v: usize, order: Ordering) -> usize;
    fn load(&self, order: Ordering) -> usize;
}

pub(crate) trait Flag: Send + Sync {
    fn new(v: bool) -> Self;
    fn store(&self, v: bool, order: Ordering);
    fn load(&self, order: Ordering) -> bool;
}

/// [`Count`] and [`Flag`] for a family of atomics (std's here, loom's in the model test): the
/// atomics' own methods.
macro_rules! impl_atomics {
    ($usize:ty, $bool:ty) => {
        impl Count for $usize {
            fn new(v: usize) -> Self {
                Self::new(v)
            }
            fn fetch_add(&self, v: usize, order: Ordering) -> usize {
                self.fetch_add(v, order)
            }
            fn load(&self, order: Ordering) -> usize {
                self.load(order)
            }
        }

        impl Flag for $bool {
            fn new(v: bool) -> Self {
                Self::new(v)
            }
            fn store(&self, v: bool, order: Ordering) {
                self.store(v, order)
            }
            fn load(&self, order: Ordering) -> bool {
                self.load(order)
            }
        }
    };
}

impl_atomics!(
    std::sync::atomic::AtomicUsize,
    std::sync::atomic::AtomicBool
);

/// std's atomics, helpers from the [`hot`] pool, the caller spinning briefly and then yielding.
pub(crate) struct Hot;

impl Platform for Hot {
    type Count = std::sync::atomic::AtomicUsize;
    type Flag = std::sync::atomic::AtomicBool;
    fn spawn(job: impl FnOnce() + Send + 'static) {
        hot::spawn(job)
    }
    #[inline]
    fn pause(spins: &mut u32) {
        if *spins < 1 << 12 {
            std::hint::spin_loop();
            *spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

struct Counters<P: Platform> {
    next: P::Count,
    done: P::Count,
    panicked: P::Flag,
}

/// A participant's loop over chunks, starting with one it has already claimed.
type Loop<'a, P> = dyn Fn(usize, &Counters<P>) + Sync + 'a;

/// The borrowed loop, lifetime erased (see the module docs for why it is never called too late).
struct Work<P: Platform>(*const Loop<'static, P>);
impl<P: Platform> Clone for Work<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: Platform> Copy for Work<P> {}
// SAFETY: the pointee is `Sync`; it is only called while the caller of `run` is still waiting.
unsafe impl<P: Platform> Send for Work<P> {}

/// Run `f(state, c)` for every `c` in `0..n`, each exactly once, on up to `threads` threads (the caller
/// included); every participating thread makes its state with `init` before its first chunk. Returns
/// false if some `f` panicked (the panic is caught so every chunk is still accounted for).
pub(crate) fn run<S>(
    n: usize,
    threads: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) + Sync,
) -> bool {
    run_on::<Hot, S>(n, threads, init, f)
}

/// The bytes below which [`copy_bytes`] copies on the calling thread alone.
const PARALLEL_COPY_BYTES: usize = 1 << 20;

/// Copy `bytes` bytes from `src` to `dst` on up to `threads` threads (the caller included), in
/// page-aligned pieces of at least 256 KiB; copies under 1 MiB run on the caller alone.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `bytes` bytes, the two
/// not overlapping, and nothing else touching `dst` until this returns.
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, bytes: usize, threads: usize) {
    if threads < 2 || bytes < PARALLEL_COPY_BYTES {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        return;
    }
    struct Ends(*const u8, *mut u8);
    // SAFETY: the pieces below are disjoint, and `run` returns only when every one is copied.
    unsafe impl Sync for Ends {}
    let ends = Ends(src, dst);
    let piece = (bytes / (4 * threads))
        .max(256 << 10)
        .next_multiple_of(4096);
    let ok = run(
        bytes.div_ceil(piece),
        threads,
        || (),
        |_, c| {
            let ends = &ends;
            let start = c * piece;
            let n = piece.min(bytes - start);
            // SAFETY: `start + n <= bytes`; pieces do not overlap (the caller's contract for the whole).
            unsafe { std::ptr::copy_nonoverlapping(ends.0.add(start), ends.1.add(start), n) };
        },
    );
    // A memory copy does not panic; `run` accounts for every piece either way.
    debug_assert!(ok);
}

/// [`run`] on the atomics and threads of `P`.
pub(crate) fn run_on<P: Platform, S>(
    n: usize,
    threads: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) + Sync,
) -> bool {
    let counters: Arc<Counters<P>> = Arc::new(Counters {
        next: P::Count::new(0),
        done: P::Count::new(0),
        panicked: P::Flag::new(false),
    });
    let chunks = |first: usize, ctr: &Counters<P>| {
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
        let borrowed: &Loop<'_, P> = &chunks;
        // SAFETY: lifetime erasure only; see the module docs (and the wait below).
        let work = Work(unsafe {
            std::mem::transmute::<*const Loop<'_, P>, *const Loop<'static, P>>(borrowed)
        });
        for _ in 0..helpers {
            let counters = Arc::clone(&counters);
            P::spawn(move || {
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
        P::pause(&mut spins);
    }
    !counters.panicked.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    #[test]
    fn a_copy_across_threads_copies_every_byte_once() {
        // Past the parallel threshold with a ragged last piece, and under it.
        for bytes in [(3 << 20) + 12_345, 4096 + 7] {
            let src: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
            let mut dst = vec![0u8; bytes + 1];
            // SAFETY: both hold `bytes` bytes and are distinct vectors.
            unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), bytes, 2) };
            assert_eq!(&dst[..bytes], &src[..], "{bytes} bytes");
            assert_eq!(dst[bytes], 0, "{bytes} bytes: written past the end");
        }
    }

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

/// The protocol under loom: every interleaving of the caller and its helpers, for small `n` and
/// thread counts (each configuration exhaustively: no preemption bound; 120,530 executions for 3
/// chunks on 3 threads). Each chunk's run count is a plain write, so a chunk run twice, or a caller
/// returning before a chunk's write happened-before it, is a data race loom reports; the per-thread
/// state reads a flag the caller clears after `run` returns, so a helper touching borrowed data too
/// late is one too. Each of these protocol bugs fails the model (tried by hand): counting a chunk done
/// before claiming the next one, dropping the state after the last count, a `Relaxed` last count.
/// (A `Relaxed` count of a chunk followed by more chunks is fine, and loom agrees: the caller
/// synchronizes with each participant's last, `Release`, count.)
#[cfg(test)]
mod model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicBool, AtomicUsize};

    impl_atomics!(AtomicUsize, AtomicBool);

    /// Helpers are loom threads (started detached, as the pool's jobs are), the caller's wait yields to them.
    struct Loom;

    impl Platform for Loom {
        type Count = AtomicUsize;
        type Flag = AtomicBool;
        fn spawn(job: impl FnOnce() + Send + 'static) {
            drop(loom::thread::spawn(job));
        }
        fn pause(_: &mut u32) {
            loom::thread::yield_now();
        }
    }

    /// A loom cell shared between threads: every access is checked by loom, which reports any two
    /// not ordered by happens-before (that is the point of the test).
    struct Shared<T>(UnsafeCell<T>);
    // SAFETY: loom tracks each access to the cell and fails the model on a data race.
    unsafe impl<T: Send> Sync for Shared<T> {}

    /// A participant's per-thread state: reads the caller's borrowed `alive` flag when it is made,
    /// used and dropped, so any access after `run` returned races with the caller's write below.
    struct State<'a> {
        alive: &'a Shared<bool>,
    }

    impl State<'_> {
        fn check(&self) {
            // SAFETY: loom checks this read against every write for a data race.
            self.alive
                .0
                .with(|p| assert!(unsafe { *p }, "borrowed state used after `run`"));
        }
    }

    impl Drop for State<'_> {
        fn drop(&mut self) {
            self.check();
        }
    }

    /// One exhaustive exploration: `n` chunks on `threads` threads, chunk `panic_at` panicking.
    fn explore(n: usize, threads: usize, panic_at: Option<usize>) -> usize {
        let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = executions.clone();
        let mut model = loom::model::Builder::new();
        model.preemption_bound = None;
        model.check(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            // Each chunk counts its runs with a plain (non-atomic) write: two runs of one chunk, or a
            // caller reading a count before the chunk's write happened-before its return, are races.
            let runs: Vec<Shared<u32>> = (0..n).map(|_| Shared(UnsafeCell::new(0))).collect();
            let alive = Shared(UnsafeCell::new(true));
            let states = std::sync::atomic::AtomicUsize::new(0);
            let ok = run_on::<Loom, _>(
                n,
                threads,
                || {
                    states.fetch_add(1, Ordering::Relaxed);
                    let s = State { alive: &alive };
                    s.check();
                    s
                },
                |s, c| {
                    s.check();
                    // SAFETY: loom checks this write against every other access.
                    runs[c].0.with_mut(|p| unsafe { *p += 1 });
                    if Some(c) == panic_at {
                        // Not `panic!`: no hook, no message per explored interleaving.
                        std::panic::resume_unwind(Box::new("chunk panicked"));
                    }
                },
            );
            // `run` has returned: the caller's frame (everything borrowed) may go away now.
            // SAFETY: loom checks this write against every helper's read.
            alive.0.with_mut(|p| unsafe { *p = false });
            assert_eq!(ok, panic_at.is_none(), "panics are reported");
            for (c, r) in runs.iter().enumerate() {
                // SAFETY: loom checks this read against the chunk's write.
                let k = r.0.with(|p| unsafe { *p });
                assert_eq!(k, 1, "chunk {c} of {n} ran {k} times");
            }
            let made = states.load(Ordering::Relaxed);
            assert!(
                made <= threads.min(n) && (made >= 1 || n == 0),
                "{made} states"
            );
        });
        let runs = executions.load(Ordering::Relaxed);
        eprintln!("n={n} threads={threads} panic_at={panic_at:?}: {runs} executions");
        runs
    }

    #[test]
    fn every_interleaving_runs_each_chunk_exactly_once() {
        for (n, threads) in [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2), (2, 3), (3, 3)] {
            let runs = explore(n, threads, None);
            // With a helper there is more than one interleaving to try.
            assert!(
                runs > 1 || threads.min(n) < 2,
                "n={n} threads={threads}: {runs}"
            );
        }
    }

    #[test]
    fn every_interleaving_reports_a_panicking_chunk_and_runs_the_rest() {
        for (n, threads, at) in [(1, 2, 0), (2, 2, 0), (2, 2, 1), (3, 2, 1), (4, 2, 3)] {
            explore(n, threads, Some(at));
        }
    }
}

//! The helper threads [`super::run`] starts its jobs on: they stay awake for a while after each job.
//!
//! A kernel's parallel parts are often short and come one after another with serial work between
//! them (ragged paged attention's loop over kv heads runs once per KV chunk, ~50–100 µs per head,
//! with ~100 µs of page copies and bookkeeping between). A pool whose threads sleep when idle (as
//! rayon's do, after a few rounds of yielding) must be woken for every such part: measured on the
//! 2-core VMs here, a helper job then started 30 µs after it was queued, on average, and the part
//! waited for it. Here a helper that finishes a job keeps polling for the next one for
//! [`LINGER`] (spinning, yielding now and then so a busy machine's other threads still run) before it
//! sleeps on a condition variable; a job queued while a helper sleeps wakes it as before.
//!
//! The pool has rayon's thread count less one (the caller of `run` is the other participant), at
//! least one, started on first use. A job that is never started costs nothing but its parallelism:
//! `run`'s caller waits only for chunks some participant has claimed.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper polls for the next job after finishing one before it sleeps.
const LINGER: Duration = Duration::from_micros(300);

type Job = Box<dyn FnOnce() + Send>;

/// The jobs not yet taken, and how many helpers sleep waiting for one.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    sleeping: usize,
}

#[derive(Default)]
struct Pool {
    queue: Mutex<Queue>,
    /// `queue.jobs.len()`, read without the lock by polling helpers.
    queued: AtomicUsize,
    wake: Condvar,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A job's panic is caught before it reaches the pool's lock, so poisoning means nothing here.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, q: &mut Queue) -> Option<Job> {
        let job = q.jobs.pop_front()?;
        self.queued.fetch_sub(1, Ordering::Relaxed);
        Some(job)
    }

    /// The next job, polled for up to [`LINGER`]: spinning, the clock read every 64 spins and the
    /// thread yielded every 1,024 (~20 µs here; a poll that only yielded measured slower than
    /// sleeping).
    fn poll(&self) -> Option<Job> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.queued.load(Ordering::Acquire) > 0 {
                if let Some(job) = self.take(&mut self.lock()) {
                    return Some(job);
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() >= LINGER {
                return None;
            }
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The next job, sleeping until one is queued.
    fn wait(&self) -> Job {
        let mut q = self.lock();
        loop {
            if let Some(job) = self.take(&mut q) {
                return job;
            }
            q.sleeping += 1;
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            q.sleeping -= 1;
        }
    }

    fn helper(&self) {
        loop {
            let job = self.poll().unwrap_or_else(|| self.wait());
            // `run`'s jobs catch their chunks' panics; anything else must not end the helper.
            let _ = catch_unwind(AssertUnwindSafe(job));
        }
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1).max(1);
        for i in 0..helpers {
            // A helper that cannot be started leaves its jobs to the caller (see the module docs).
            let _ = std::thread::Builder::new()
                .name(format!("tpu-kernel-helper-{i}"))
                .spawn(|| pool().helper());
        }
        Pool::default()
    })
}

/// Queue `job` for the next free helper.
pub(crate) fn spawn(job: impl FnOnce() + Send + 'static) {
    let p = pool();
    let mut q = p.lock();
    q.jobs.push_back(Box::new(job));
    p.queued.fetch_add(1, Ordering::Release);
    if q.sleeping > 0 {
        p.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn jobs_run_whether_the_helpers_poll_or_sleep() {
        let (tx, rx) = mpsc::channel();
        for round in 0..3 {
            let tx = tx.clone();
            spawn(move || tx.send(round).unwrap());
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(round));
            // Past the linger: the next job finds the helpers asleep and must wake one.
            std::thread::sleep(LINGER * 4);
        }
    }

    #[test]
    fn a_panicking_job_does_not_end_a_helper() {
        let helpers = rayon::current_num_threads().saturating_sub(1).max(1);
        for _ in 0..helpers {
            spawn(|| std::panic::resume_unwind(Box::new("job panicked")));
        }
        let (tx, rx) = mpsc::channel();
        spawn(move || tx.send(()).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(()));
    }
}

//! The faults of the DMA model ([`super::dma`]) as messages — the one text of each, whichever engine
//! finds it (the interpreter runs the model; Mosaic-on-CPU's check sites build the same errors).

use crate::error::{kerr, KernelError};

/// A copy whose two ends differ in shape (run-time sizes that disagree when the kernel runs).
pub(crate) fn copy_shapes_differ(src: &[usize], dst: &[usize]) -> KernelError {
    kerr!(
        Shape,
        "a DMA from a window of shape {src:?} into a window of shape {dst:?}: the two ends of a copy must have one shape (their run-time sizes differ)"
    )
}

/// A wait for `bytes` on DMA semaphore `sem`, where the copies started on it can bring only
/// `coming` more.
pub(crate) fn deadlock_dma_wait(sem: &str, bytes: i64, coming: i64) -> KernelError {
    let more = if coming == 0 {
        "no copy signalling it is outstanding".to_string()
    } else {
        format!("the copies started on it bring only {coming} more")
    };
    kerr!(
        Deadlock,
        "waits for {bytes} bytes on DMA semaphore {sem}, but {more}: this wait would never return"
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
    pub(crate) fn when(self) -> &'static str {
        match self {
            Release::Kernel => "the kernel ends",
            Release::Scope => "its run_scoped scope ends",
        }
    }
    pub(crate) fn inside(self) -> &'static str {
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

/// A DMA semaphore counting `bytes` of copies never waited for when `at` releases it (an engine whose
/// copies land at their start sees this where the model sees an outstanding copy).
// Only Mosaic-on-CPU meets this fault (its copies complete at their start).
#[cfg_attr(not(feature = "mosaic-cpu"), allow(dead_code))]
pub(crate) fn dma_copies_left(sem: &str, bytes: i64, at: Release) -> KernelError {
    kerr!(
        Race,
        "DMA semaphore {sem} counts {bytes} bytes of copies never waited for when {}: wait for every copy{}",
        at.when(),
        at.inside()
    )
}

/// A semaphore (`dma`: a DMA semaphore, counting `value` bytes) not back at zero at the end of grid
/// step `point`, whose next step moves along `parallel` axis `axis`.
pub(crate) fn semaphore_across_cores(
    sem: &str,
    dma: bool,
    value: i64,
    point: &[i64],
    axis: usize,
) -> KernelError {
    let holds = if dma {
        format!("DMA semaphore {sem} counts {value} bytes of copies never waited for")
    } else {
        format!("semaphore {sem} holds {value}")
    };
    kerr!(
        Race,
        "{holds} at the end of grid step {point:?}, whose next step moves along parallel axis {axis} and may run on another core: wait in the same step, or make axis {axis} arbitrary"
    )
}

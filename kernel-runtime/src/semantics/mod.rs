//! Pallas TPU semantics both CPU engines share and neither owns: the interpreter (`interpret`) and
//! Mosaic-on-CPU (`mosaic_cpu`) depend on this module and not on each other.
//!
//! - [`host`]: host arrays (`HostArray`, `HostData`, `HostElement`) and the borrowed views of foreign
//!   (XLA) buffers a run reads and writes (`ArrayView`, `ArrayViewMut`);
//! - `schedule`: the block schedule around the grid steps (grid points in Pallas order, when blocks
//!   move, the `BlockEngine` each engine implements), the check of a launch's arrays against the
//!   kernel, and the run-time check of blocks chosen by scalar-prefetch data;
//! - `dma`: the DMA/semaphore model (byte-counted DMA semaphores, outstanding copies, the race and
//!   deadlock rules, what may not cross a `parallel` step, copies between devices) that the
//!   interpreter runs; `dma_faults`: the messages of its faults, which Mosaic-on-CPU's check sites
//!   build through too;
//! - `refs`: the messages of out-of-bounds loads, stores and windows, for both engines;
//! - `views`: ref views (bitcasts, reshapes, their windows) as steps from a ref's contents, and the
//!   box of the ref each reaches (what the race rules compare).
//!
//! Invariant (held by `tests/architecture.rs`): nothing here names `interpret` or `mosaic_cpu`, and
//! neither of those names the other.

pub(crate) mod dma;
pub(crate) mod dma_faults;
pub mod host;
pub(crate) mod refs;
pub(crate) mod schedule;
pub(crate) mod views;

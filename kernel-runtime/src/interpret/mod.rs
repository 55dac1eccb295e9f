//! Interpret mode: run a kernel's IR on the CPU with Pallas TPU semantics — the fourth consumer of the
//! one IR (after the checks, the Mosaic lowering and the optimizer), so it cannot drift from what runs
//! on the TPU. Entry points: [`interpret`], `PallasCall::interpret` / `interpret_with`.
//!
//! What it shares with Mosaic-on-CPU — host arrays, the block schedule, the DMA model and the error
//! messages of faults — is [`crate::semantics`]'s; this module holds how the interpreter runs.
//!
//! - `grid`: the grid loop over the shared block schedule (Pallas order, last axis fastest; input
//!   blocks re-read when their block index changes; output blocks written back when it changes and at
//!   the end; scratch persisting), chunked over `parallel` axes when the
//!   index maps show no output block is shared between chunks; `workers` runs the chunks on the calling
//!   thread and helper threads that stay awake between parts. `coalesce`: kernels whose blocks are
//!   independent slices of rows (elementwise, or row-wise like softmax) run over larger row bands
//!   instead.
//! - `machine`: one grid step — an environment of values freed after their last use, the refs, and one
//!   rule per op family (DMA and semaphores over [`crate::semantics`]'s model); a plan per region says which values die where, which elementwise chains fuse,
//!   and which results may be written straight into the output array (their only use is a full store).
//! - `tensor`: the value type, a strided view of a shared buffer (broadcasts, splats, iota, windows and
//!   transposes are views, not copies), the row iterator every loop uses, and a per-thread buffer pool.
//! - `elementwise`, `fused`, `reduce`, `dot`, `simd`: the numeric rules — bf16 rounded on every op
//!   (fused or not), f32 accumulation (reductions, `dot` through `gemm`); what each op computes on an
//!   element (transcendentals, NaN-propagating max/min, wrapping integers with XLA's division rules)
//!   is [`crate::math`]'s, the vector math Mosaic on CPU calls too. Hot loops are compiled for
//!   AVX2+FMA and picked at run time, with bit-identical results.
//!
//! Deliberate differences from the hardware: f32 `dot` is exact f32 (the MXU may use bf16 passes);
//! bf16 `dot` sums exact products in f32 in one order on every CPU (`dot_bf16_order`: pairs, the odd
//! product first, bf16 subnormals read as zero; in hardware with AVX-512 BF16, `dot_bf16`); `rsqrt`/`exp` are accurate to a few ulp (the TPU's are approximations), and reductions sum in a fixed
//! 16-lane order. Memory the kernel never wrote reads as zeros, or as NaN / `0xDEADBEEF` with
//! [`InterpretOptions::poison_uninitialized`].
//!
//! Errors are values: an out-of-bounds dynamic slice is a [`KernelError`](crate::KernelError) naming the
//! Rust line of the load or store; bad inputs are errors naming the argument.

mod coalesce;
mod dot;
#[cfg(target_arch = "x86_64")]
mod dot_bf16;
mod dot_bf16_order;
#[cfg(target_arch = "x86_64")]
mod dot_i8;
mod elementwise;
mod fused;
mod grid;

mod machine;
pub(crate) mod ops;
mod plan;
pub use plan::PlanCounts;
mod reduce;
mod row_order;
mod simd;
mod spmd;
pub use spmd::interpret_spmd;
pub(crate) use spmd::{interpret_into_launch, LaunchKey};
mod tensor;
mod workers;

pub use crate::semantics::host::{ArrayView, ArrayViewMut, HostArray, HostData, HostElement};

use crate::error::Result;
use crate::ir::Kernel;

/// How to interpret a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterpretOptions {
    /// Fill scratch, fresh output blocks and edge-block padding with NaN (floats) / `0xDEADBEEF`-style
    /// patterns (integers) instead of zeros, so a kernel that reads memory it never wrote shows it
    /// (e.g. a matmul that forgets to zero its accumulator returns NaN).
    pub poison_uninitialized: bool,
    /// Run independent chunks of `parallel` grid axes (and loops with independent iterations) on
    /// several threads (rayon's thread count: `RAYON_NUM_THREADS`).
    pub parallel: bool,
    /// Evaluate chains of elementwise ops in one pass, write results that are only stored into an
    /// output block straight into the output array, let a `dot` accumulate into a buffer it may take
    /// (its ref's contents, or an accumulator that dies at it), and run purely elementwise kernels over
    /// contiguous row bands rather than their blocks. Results are bit-identical either way; switch off to debug
    /// the interpreter itself.
    pub fuse: bool,
    /// DMA timing: `None` moves every copy's data when a wait shows it complete; `Some(seed)` moves
    /// each at a random op boundary after its start (seeded, so reproducible). Verdicts never depend
    /// on it — reading a destination before the waits on its semaphore have taken every byte of the
    /// copies outstanding on it is a race either way — and a correct kernel gives the same results
    /// under every seed.
    pub dma_seed: Option<u64>,
    /// Bytes the interpreter may allocate for a run's output arrays; past it (or when the system
    /// refuses the allocation) the run is an [`ErrorKind::Memory`](crate::error::ErrorKind::Memory)
    /// error naming the output, not an abort. Default: half the machine's memory.
    pub memory_limit: u64,
}

/// The default [`InterpretOptions::memory_limit`]: half of `MemTotal` (Linux), else 8 GiB.
pub fn default_memory_limit() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024) / 2)
        })
        .unwrap_or(8 << 30)
}

impl Default for InterpretOptions {
    fn default() -> Self {
        InterpretOptions {
            poison_uninitialized: false,
            parallel: true,
            fuse: true,
            dma_seed: None,
            memory_limit: default_memory_limit(),
        }
    }
}

impl InterpretOptions {
    /// Defaults with poisoning of uninitialized memory switched on.
    pub fn poisoned() -> Self {
        InterpretOptions {
            poison_uninitialized: true,
            ..Self::default()
        }
    }
}

/// Run `kernel` on `inputs` (one host array per kernel input, in order); returns one array per output.
/// The interpreter's execution plan of `kernel` under `options`, printed (`--emit plan`): row-band
/// coalescing, parallel grid axes, fused chains (with reduction epilogues and deferred casts), results
/// sunk into output blocks, in-place dots. Every fast path the interpreter takes shows here.
pub fn plan_text(kernel: &Kernel, options: &InterpretOptions) -> Result<String> {
    grid::describe(kernel, options).map(|(text, _)| text)
}

/// How many DMA copies the interpreter has landed in the background on the calling thread so far:
/// copies into a scratch buffer whose data moves on a helper thread from the copy's start, while
/// the kernel's index arithmetic and further starts run (for tests that the path is taken).
#[doc(hidden)]
pub fn background_landings() -> usize {
    machine::background_landings()
}

/// How many views of a bitcast or reshape (or static windows) the interpreter has composed on the
/// calling thread so far rather than taken from the views it keeps per view op (for tests that
/// those are used).
#[doc(hidden)]
pub fn views_made() -> usize {
    machine::views_made()
}

/// What [`plan_text`] shows, counted (for tests that a fast path fires).
pub fn plan_counts(kernel: &Kernel, options: &InterpretOptions) -> Result<PlanCounts> {
    grid::describe(kernel, options).map(|(_, counts)| counts)
}

pub fn interpret(
    kernel: &Kernel,
    inputs: &[HostArray],
    options: &InterpretOptions,
) -> Result<Vec<HostArray>> {
    grid::run(kernel, inputs, options)
}

/// Run `kernel` on borrowed arrays, writing its outputs into borrowed memory (what the XLA FFI
/// handler does with XLA's buffers). Shapes and dtypes must match the kernel's.
pub fn interpret_into(
    kernel: &Kernel,
    inputs: &[ArrayView<'_>],
    outputs: &mut [ArrayViewMut<'_>],
    options: &InterpretOptions,
) -> Result<()> {
    grid::run_into(kernel, inputs, outputs, options, None)
}

/// What the interpreter derives from a kernel alone, made once for a kernel run many times (the XLA
/// FFI handler keeps one beside each built kernel): its execution plan, ~3% of a ragged paged
/// attention decode step when made per launch. Used only with the kernel it was made from.
pub(crate) struct Prepared {
    fuse: bool,
    plan: plan::Plan,
}

impl Prepared {
    pub(crate) fn new(kernel: &Kernel, options: &InterpretOptions) -> Prepared {
        Prepared {
            fuse: options.fuse,
            plan: plan::plan(&kernel.body, options.fuse),
        }
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("fuse", &self.fuse)
            .finish()
    }
}

/// [`interpret_into`] with the plan `prepared` holds, which must have been made from `kernel`.
pub(crate) fn interpret_into_prepared(
    kernel: &Kernel,
    prepared: &Prepared,
    inputs: &[ArrayView<'_>],
    outputs: &mut [ArrayViewMut<'_>],
    options: &InterpretOptions,
) -> Result<()> {
    grid::run_into(kernel, inputs, outputs, options, Some(prepared))
}

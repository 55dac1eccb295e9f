//! Interpret mode: run a kernel's IR on the CPU with Pallas TPU semantics — the fourth consumer of the
//! one IR (after the checks, the Mosaic lowering and the optimizer), so it cannot drift from what runs
//! on the TPU.
//!
//! - [`grid`]: the grid loop (Pallas order, block copy-in per BlockSpec, write-back when an output's
//!   block index changes and at the end, scratch persisting), chunked over `parallel` axes on rayon.
//! - [`machine`]: one grid step — an environment of values and one rule per op family.
//! - [`tensor`]: the value type, a strided view of a shared buffer (broadcasts, splats, iota, windows and
//!   transposes are views, not copies).
//! - [`elementwise`], [`reduce`], [`dot`], [`math`]: the numeric rules (bf16 rounded on every op, f32
//!   accumulation, wrapping integers, XLA's NaN behaviour, a vectorized polynomial `exp`).
//!
//! Errors are values: an out-of-bounds dynamic slice is a [`KernelError`](crate::KernelError) naming the
//! Rust line of the load or store.

mod dot;
mod elementwise;
mod fused;
mod grid;
mod host;
mod machine;
mod math;
mod reduce;
mod simd;
mod tensor;

pub use host::{HostArray, HostData, HostElement};

use crate::error::Result;
use crate::ir::Kernel;

/// How to interpret a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterpretOptions {
    /// Fill scratch, fresh output blocks and edge-block padding with NaN (floats) / `0xDEADBEEF`-style
    /// patterns (integers) instead of zeros, so a kernel that reads memory it never wrote shows it
    /// (e.g. a matmul that forgets to zero its accumulator returns NaN).
    pub poison_uninitialized: bool,
    /// Run independent chunks of `parallel` grid axes on rayon's thread pool.
    pub parallel: bool,
    /// Evaluate chains of elementwise ops in one pass, and write results that are only stored into an
    /// output block straight into the output array. Results are bit-identical either way; switch off
    /// to debug the interpreter itself.
    pub fuse: bool,
}

impl Default for InterpretOptions {
    fn default() -> Self {
        InterpretOptions {
            poison_uninitialized: false,
            parallel: true,
            fuse: true,
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
pub fn interpret(
    kernel: &Kernel,
    inputs: &[HostArray],
    options: &InterpretOptions,
) -> Result<Vec<HostArray>> {
    grid::run(kernel, inputs, options)
}

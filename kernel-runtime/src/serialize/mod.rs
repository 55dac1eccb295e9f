//! Serialization: what XLA and libtpu receive for a kernel.
//!
//! - [`body`]: the Mosaic module in the mosaic-serde form (`stable_mosaic.<dialect>.<op>` ops in generic
//!   form, module attribute `stable_mosaic.version`, per-version downgrades), as MLIR bytecode, written
//!   by [`crate::mosaic::bytecode`] straight from the lowered module as data (no MLIR module is built to
//!   ship a kernel; `body::reference_bytecode`, feature `mlir`, is the MLIR path the tests hold it to);
//! - [`config`]: the `tpu_custom_call` backend_config JSON (base64 body, `serialization_format`,
//!   `needs_layout_passes`, and the optional fields — cost estimate, flags, input fusion, memory-space
//!   colors, ... — only when set). One deliberate difference from Pallas: `scoped_memory_configs` is
//!   always written, with the VMEM limit our checks used (the launch's, else the target's default —
//!   libtpu's own: 16 MiB on v5e, 32 MiB on v6e and tpu7x), so that libtpu enforces exactly the budget
//!   `build()` checked. Nothing else differs per generation: Pallas emits the same module and
//!   backend_config for every generation for our kernels (`python/tests/test_examples.py`);
//! - [`stablehlo`]: a complete StableHLO program calling the kernel through `stablehlo.custom_call
//!   @tpu_custom_call`.
//!
//! The `stable_mosaic.version` written and the rules between versions are the serialized form's facts
//! ([`crate::mosaic::serde`]); [`CallOptions::version`] picks one.
//!
//! Architecture invariant: `serialize` reads the kernel IR and the Mosaic model, never MLIR: a kernel
//! ships with default features (no LLVM/MLIR installed).

pub mod body;
pub mod config;
pub mod stablehlo;

use crate::error::Result;
use crate::ir::Kernel;

pub use crate::mosaic::serde::{DEFAULT_VERSION, MAX_VERSION, MIN_VERSION};

/// Memory-space colors in the custom call's config (jax's `MemorySpace.color`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryColor {
    Hbm = 0,
    Vmem = 1,
    Semaphore = 2,
    Smem = 4,
    Host = 5,
}

/// Whether XLA may deduplicate or remove the call (jax's `TpuSideEffectType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SideEffects {
    /// May be deduplicated and removed when unused.
    #[default]
    Pure,
    /// Not deduplicated, but removed when unused.
    Dataflow,
    /// Neither deduplicated nor removed.
    SideEffecting,
}

/// A value of a Mosaic compiler flag (`flag_configs`).
#[derive(Clone, Debug, PartialEq)]
pub enum FlagValue {
    Bool(bool),
    Int(i64),
    Double(f64),
}

/// What the custom call carries besides what the kernel IR says (the IR gives the body, the VMEM limit
/// and the cost estimate). Every optional field is written only when set.
#[derive(Clone, Debug, PartialEq)]
pub struct CallOptions {
    /// `stable_mosaic.version` of the body.
    pub version: i64,
    /// `(input index, output index)`: the output reuses the input's buffer (`input_output_aliases`).
    pub input_output_aliases: Vec<(usize, usize)>,
    pub side_effects: SideEffects,
    /// Mosaic compiler flags, in order.
    pub flags: Vec<(String, FlagValue)>,
    /// Per input: may XLA fuse the producer into the kernel's input.
    pub allow_input_fusion: Option<Vec<bool>>,
    pub internal_scratch_in_bytes: Option<u64>,
    pub has_communication: bool,
    pub collective_id: Option<u32>,
    pub needs_hlo_passes: bool,
    pub disable_bounds_checks: bool,
    pub disable_semaphore_checks: bool,
    pub skip_device_barrier: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            version: DEFAULT_VERSION,
            input_output_aliases: Vec::new(),
            side_effects: SideEffects::Pure,
            flags: Vec::new(),
            allow_input_fusion: None,
            internal_scratch_in_bytes: None,
            has_communication: false,
            collective_id: None,
            needs_hlo_passes: false,
            disable_bounds_checks: false,
            disable_semaphore_checks: false,
            skip_device_barrier: false,
        }
    }
}

/// A kernel ready to be called from XLA: its body, backend_config and StableHLO program.
#[derive(Clone, Debug)]
pub struct CustomCall<'k> {
    pub kernel: &'k Kernel,
    pub options: CallOptions,
}

impl<'k> CustomCall<'k> {
    /// The call with default options and the kernel's own `input_output_aliases`.
    pub fn new(kernel: &'k Kernel) -> Self {
        Self::with_options(kernel, CallOptions::default())
    }
    /// The call with `options`; the kernel's `input_output_aliases` apply when the options name none.
    pub fn with_options(kernel: &'k Kernel, mut options: CallOptions) -> Self {
        if options.input_output_aliases.is_empty() {
            options.input_output_aliases = kernel.aliases.clone();
        }
        options.disable_bounds_checks |= kernel.disable_bounds_checks;
        options.disable_semaphore_checks |= kernel.disable_semaphore_checks;
        CustomCall { kernel, options }
    }
    /// The body as MLIR bytecode (mosaic-serde form).
    pub fn body(&self) -> Result<Vec<u8>> {
        body::body_bytecode(self.kernel, self.options.version)
    }
    /// The body's serialized form as generic MLIR text (for reading and debugging).
    #[cfg(feature = "mlir")]
    pub fn body_text(&self) -> Result<String> {
        body::body_text(self.kernel, self.options.version)
    }
    /// The backend_config JSON.
    pub fn backend_config(&self) -> Result<String> {
        config::backend_config(self.kernel, &self.options)
    }
    /// The StableHLO module calling the kernel.
    pub fn stablehlo(&self) -> Result<String> {
        stablehlo::stablehlo(self.kernel, &self.options)
    }
}

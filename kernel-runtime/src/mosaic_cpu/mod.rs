//! Mosaic on CPU: execute the Mosaic module we ship — the module [`crate::lower::build_module`] builds
//! and verifies — on the CPU, to check every lowering rule by running it.
//!
//! (Module docs: see the end of this series of commits.)

mod jit;
mod program;
mod rewrite;
mod rules;
mod run;
mod scalar;

pub use rules::table_names;
pub use run::Compiled;

use crate::error::Result;
use crate::interpret::HostArray;
use crate::ir::Kernel;
use melior::ir::Module;
use std::time::Instant;

/// Run `kernel` on `inputs` by executing its Mosaic module: one host array per input, in order;
/// returns one per output, like [`crate::interpret::interpret`].
pub fn run(kernel: &Kernel, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
    compile(kernel)?.run(inputs)
}

/// Lower `kernel` to its Mosaic module (verified) and compile that module for the CPU.
pub fn compile(kernel: &Kernel) -> Result<Compiled> {
    crate::lower::with_context(|ctx| {
        let module = crate::lower::build_module(ctx, kernel)?;
        compile_module(kernel, &module)
    })
}

/// Compile a Mosaic `module` for `kernel` — its launch (arrays, BlockSpecs) is `kernel`'s, checked
/// against the module's launch attributes; what runs is the module.
pub fn compile_module(kernel: &Kernel, module: &Module<'_>) -> Result<Compiled> {
    let start = Instant::now();
    let program = program::rewrite(kernel, module)?;
    Compiled::new(kernel, program, start)
}

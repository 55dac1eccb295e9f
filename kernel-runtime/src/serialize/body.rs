//! A kernel's body as libtpu reads it: the kernel lowered to the Mosaic module as data
//! ([`crate::lower`]), written in the mosaic-serde form as MLIR bytecode ([`crate::mosaic::bytecode`];
//! no MLIR module is built to ship a kernel). With the `mlir` feature, the same body the long way
//! through MLIR (`reference_bytecode`, what the tests hold the direct writer to) and read back as text.

use crate::error::Result;
use crate::ir::Kernel;
use crate::lower;
use crate::mosaic::{bytecode, serde::check_version};

#[cfg(feature = "mlir")]
pub use crate::mosaic::mlir::read_body;

/// Serialize a kernel: lowered to the Mosaic module as data → mosaic-serde form at `version` → MLIR
/// bytecode, written directly (no MLIR module is built).
pub fn body_bytecode(k: &Kernel, version: i64) -> Result<Vec<u8>> {
    check_version(version)?;
    bytecode::body(&lower::lower_module(k)?, version)
}

/// The serialized body as MLIR reads it back, printed in generic form (what `--emit body` prints; for
/// reading, not for libtpu).
#[cfg(feature = "mlir")]
pub fn body_text(k: &Kernel, version: i64) -> Result<String> {
    read_body(&body_bytecode(k, version)?, false)
}

/// The reference serializer the direct writer is tested against: build and verify the module with MLIR,
/// rewrite it to the mosaic-serde form in place, and let MLIR's bytecode writer write it. Slower (it
/// builds the module twice over); not used to ship kernels.
#[cfg(feature = "mlir")]
pub fn reference_bytecode(k: &Kernel, version: i64) -> Result<Vec<u8>> {
    check_version(version)?;
    crate::mosaic::mlir::reference_bytecode(&lower::lower_module(k)?, version)
}

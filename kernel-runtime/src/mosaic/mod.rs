//! The Mosaic module as data, and everything that writes it.
//!
//! - [`model`]: the module as plain data (ops in MLIR's generic form, attributes and types as MLIR text)
//!   — what `lower` produces;
//! - [`text`]: MLIR's string, symbol and location syntax (one escaping for every writer);
//! - [`serde`]: the serialized form's facts — versions and their downgrades, the `stable_mosaic.`
//!   prefix, default-valued inherent attributes;
//! - [`bytecode`]: the writer that ships — the serialized body as MLIR bytecode, no MLIR needed;
//! - `mlir` (feature `mlir`): the MLIR writer — a verified melior module, its text, and the reference
//!   serializer the bytecode writer is tested against.
//!
//! Architecture invariant: dependencies run one way, `lower → mosaic ← serialize`. This module knows
//! nothing of the kernel IR, of lowering or of the custom call: it takes an [`MModule`]
//! and writes it. Only `mosaic::mlir` (and `mosaic_cpu`) may name melior or mlir-sys.

pub mod bytecode;
#[cfg(feature = "mlir")]
pub mod mlir;
pub mod model;
pub mod serde;
pub mod text;

pub use model::{MBlock, MFunc, MModule, MOp, MType, MValue};

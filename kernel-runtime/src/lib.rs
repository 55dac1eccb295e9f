//! tpu-kernel runtime: the kernel IR, the tracing API that `#[tpu_kernel]` bodies call, the launch builder
//! (`pallas_call`), the TPU checks, the lowering to the Mosaic module and its serialized form, the CPU
//! interpreter and the library ABI.
//!
//! Features: `mlir` — the Mosaic module as MLIR through melior (verify, text; needs LLVM/MLIR 22 at
//! build time); `mosaic-cpu` — the Mosaic-on-CPU engine (the shipped module JIT-compiled by MLIR/LLVM).
//! `libtpu` — compiles for TPU topologies through libtpu's PJRT C API in worker processes (`libtpu`).
//! None is needed to build, lower, serialize, interpret or export a kernel.
//!
//! See `ARCHITECTURE.md` at the repository root for the code map and invariants.

// Every unsafe block says why it is sound; every unsafe fn, what its caller must uphold.
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod batch;
pub mod bind;
mod call;
pub mod check;
pub mod dtype;
pub mod error;
pub mod expand;
pub mod export;
mod index_map;
pub mod interpret;
pub mod ir;
pub mod launch;
#[cfg(feature = "libtpu")]
pub mod libtpu;
pub mod lower;
pub mod mesh;
/// The vector math (`tpu-kernel-math`): what each float op computes on an element, defined once for
/// the interpreter and Mosaic on CPU.
pub use kernel_math as math;
pub mod mosaic;
#[cfg(feature = "mosaic-cpu")]
pub mod mosaic_cpu;
pub mod opt;
pub mod semantics;
pub mod serialize;
pub mod size;
pub mod target;
pub mod trace;

pub use bind::{Bind, BoundKernel};
pub use dtype::{DType, Element};
pub use error::{ErrorKind, KernelError, SourceLoc};
pub use launch::{
    pallas_call, require, Any, ArrayType, BlockSpec, PallasCall, PallasCallBuilder, Smem, Vmem,
};
pub use mesh::Mesh;
pub use target::{Executor, Target};

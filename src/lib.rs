//! # tpu-kernel
//!
//! Pallas-style TPU kernels written in Rust. Annotate a function with [`tpu_kernel`], describe the launch
//! with [`pallas_call`] (grid, BlockSpecs, outputs, scratch), and `build()` traces it
//! into the kernel IR, checks it against Mosaic's rules and lowers it to Mosaic MLIR.
//!
//! ```ignore
//! use tpu_kernel::prelude::*;
//!
//! #[tpu_kernel]
//! fn add_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
//!     o.store(x.load() + y.load());
//! }
//!
//! let call = pallas_call(add_kernel)
//!     .grid([4, 4])
//!     .input(ArrayType::new([1024, 1024], F32), BlockSpec::new([256, 256], |[i, j]| [i, j]))
//!     .input(ArrayType::new([1024, 1024], F32), BlockSpec::new([256, 256], |[i, j]| [i, j]))
//!     .output(ArrayType::new([1024, 1024], F32), BlockSpec::new([256, 256], |[i, j]| [i, j]))
//!     .dimension_semantics([Parallel, Parallel])
//!     .build()?;
//! println!("{}", call.mosaic_mlir()?);
//! ```
//!
//! Inside a kernel body, `if`/`for`/`while` on traced values become `scf.if`/`scf.for`/`scf.while`;
//! comparisons on traced values give traced booleans; plain Rust values (shapes, constants) stay Rust and
//! are folded at trace time.

// Every unsafe block says why it is sound; every unsafe fn, what its caller must uphold.
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub use kernel_macros::{export, export_library, kernel_fn, tpu_kernel};
/// The runtime crate whole — lowering, serialization, the interpreter's and the Mosaic-on-CPU
/// engine's internals — for this repository's tests, benchmarks and tools. Not a stable API: kernels
/// and user code need only the items above and the [`prelude`].
#[doc(hidden)]
pub use kernel_runtime as runtime;
pub use kernel_runtime::serialize::{CallOptions, CustomCall};
pub use kernel_runtime::{check, dtype, error, ir, launch, target, trace};
pub use kernel_runtime::{
    pallas_call, require, Any, ArrayType, BlockSpec, DType, ErrorKind, Executor, KernelError, Mesh,
    PallasCall, Smem, SourceLoc, Target, Vmem,
};

pub mod example;
pub mod reference;
/// Tune a kernel's static parameters for a TPU generation through libtpu, no TPU (feature `libtpu`;
/// see `kernel_runtime::libtpu::tune` and `docs/tune.md`).
#[cfg(feature = "libtpu")]
pub use kernel_runtime::libtpu::tune;

/// Everything a kernel file needs: `use tpu_kernel::prelude::*;`.
pub mod prelude {
    pub use crate::{export, kernel_fn, tpu_kernel};
    pub use half::{bf16, f16};
    pub use kernel_runtime::dtype::{f8e4m3fn, f8e5m2, i4};
    pub use kernel_runtime::dtype::{BF16, BOOL, F16, F32, F8E4M3FN, F8E5M2, I32, I4, I8, U32, U8};
    pub use kernel_runtime::interpret::{HostArray, InterpretOptions};
    pub use kernel_runtime::ir::CostEstimate;
    pub use kernel_runtime::ir::DimensionSemantics::{self, Arbitrary, Parallel};
    pub use kernel_runtime::trace::unary::*;
    pub use kernel_runtime::trace::unroll;
    pub use kernel_runtime::trace::{
        async_copy, concatenate, dot, dot_nt, dot_tn, ds, full, full_like, iota, maximum, minimum,
        multiple_of, named_scope, num_programs, pow, program_id, roll, run_scoped, scalar, select,
        sync_copy, where_, zeros, zeros_like, Array, DmaSem, Pipeline, Ref, RefMut, Scalar, Sem,
    };
    pub use kernel_runtime::trace::{
        async_remote_copy, axis_index, axis_size, barrier_semaphore, DeviceId, RemoteCopy,
    };
    pub use kernel_runtime::Bind;
    pub use kernel_runtime::{
        pallas_call, require, Any, ArrayType, BlockSpec, DType, Executor, KernelError, Mesh,
        PallasCall, Smem, Target, Vmem,
    };
}

/// What `#[tpu_kernel]`-generated code calls. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use kernel_runtime::trace::{
        for_range, for_range_step, if_else, while_loop, Carry, Cond, TraceEq, TraceLogic, TraceOrd,
    };
    pub use kernel_runtime::trace::{
        unroll_range, unroll_range_step, AddOp, DivOp, MulOp, RemOp, SubOp, TraceCompoundAssign,
    };
    /// What `#[export]` and `export_library!` generate calls to.
    pub mod export {
        pub use kernel_runtime::export::*;
    }
}

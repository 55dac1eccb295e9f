//! The `#[tpu_kernel]`, `#[kernel_fn]` and `#[export]` attribute macros and `export_library!`.
//!
//! Each is a one-line entry into `kernel-macros-core`, where parsing, checking and generation live
//! (a plain library over `proc_macro2`, so tests and the fuzz driver can call it); see that crate's
//! documentation for the rewrites of a kernel body.

use proc_macro::TokenStream;

/// Marks a kernel entry point.
///
/// The function must return `()` and take handle parameters by value
/// (`x: Ref<f32>`, `o: RefMut<f32>`); outputs are written with `.store(..)`.
/// See the crate documentation for the body rewrites.
#[proc_macro_attribute]
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel_macros_core::tpu_kernel(attr.into(), item.into()).into()
}

/// Marks a helper function that kernels (and other helpers) can call.
///
/// Any parameters and return type are allowed; the body follows the same
/// rules as a `#[tpu_kernel]` body.
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel_macros_core::kernel_fn(attr.into(), item.into()).into()
}

/// Exposes a launch function to other languages (Python's `tpu_kernel` package, through a shared
/// library's C ABI): parameters of type `ArrayType` are the kernel's arrays, the others are static
/// parameters (`#[default(expr)]` gives one a default).
///
/// ```ignore
/// #[export(grad(x = matmul_dx(g, y, block = block), y = matmul_dw(x, g, block = block)))]
/// pub fn matmul(x: ArrayType, y: ArrayType, #[default((128, 128, 128))] block: (usize, usize, usize))
///     -> Result<PallasCall, KernelError> { .. }
/// ```
/// `grad(..)` names, for each array, the exported kernel computing its cotangent from the forward
/// arrays, `out`/`outN` and `g`/`gN` (the outputs' cotangents); `(a, b) = k(..)` for a kernel with two
/// outputs. `name = ".."` renames the export.
#[proc_macro_attribute]
pub fn export(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel_macros_core::export(attr.into(), item.into()).into()
}

/// Generates the C ABI of a kernel library (a `cdylib` crate) over its `#[export]`ed launch
/// functions and, optionally, host functions (plain `fn(..) -> Result<_, KernelError>` a caller
/// runs on the host, e.g. metadata for a launch):
/// `export_library!("my_kernels", [module::kernel_a, kernel_b], host = [module::helper]);`.
///
/// The library also declares its `#[global_allocator]`: mimalloc, a heap of its own, so the
/// interpreter's allocations do not go through the host process's `malloc` (whose heap XLA's
/// compiles fragment). `allocator = system` declares none, for a crate with its own
/// `#[global_allocator]` (two in one crate do not compile) or one that wants the process's `malloc`.
#[proc_macro]
pub fn export_library(input: TokenStream) -> TokenStream {
    kernel_macros_core::export_library(input.into()).into()
}

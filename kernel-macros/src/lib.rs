//! The `#[tpu_kernel]` and `#[kernel_fn]` attribute macros.
//!
//! Both macros keep the annotated function a plain Rust `fn` (same name,
//! visibility, generics, parameters and return type). Only its body is
//! rewritten, so that calling it during tracing with handle-typed arguments
//! records kernel IR. Most of the body is kept verbatim: the runtime types
//! overload the arithmetic operators and every runtime API is
//! `#[track_caller]`. The macro rewrites only what Rust cannot overload:
//!
//! | user code                      | generated code (`P` = `::tpu_kernel::__private`)          |
//! |--------------------------------|-----------------------------------------------------------|
//! | `a == b`, `a != b`             | `P::TraceEq::trace_eq(a, b)`, `P::TraceEq::trace_ne(a, b)` |
//! | `a < b`, `<=`, `>`, `>=`       | `P::TraceOrd::trace_lt(a, b)`, `trace_le`, `trace_gt`, `trace_ge` |
//! | `a && b`, `a \|\| b`           | `P::TraceLogic::trace_and(a, b)`, `P::TraceLogic::trace_or(a, b)` |
//! | `if c { A } else { B }`        | `P::if_else(c, vars, \|vars\| .., \|vars\| ..)`             |
//! | `for i in lo..hi { .. }`       | `P::for_range(lo, hi, vars, \|i, vars\| ..)`                |
//! | `for i in (lo..hi).step_by(s)` | `P::for_range_step(lo, hi, s, vars, \|i, vars\| ..)`        |
//! | `while c { .. }`               | `P::while_loop(vars, \|vars\| c, \|vars\| ..)`              |
//! | `for p in unroll(lo..hi) { .. }` | `for p in P::unroll_range(lo, hi) { .. }` (a Rust loop: the body traced per `p`) |
//! | `o.at(..) += v` (not a place)  | `P::TraceCompoundAssign::<P::AddOp, _>::trace_compound_assign(o.at(..), v)` (`-= *= /= %=`: `SubOp`, ...) |
//! | `o: RefMut<T>` parameter       | `#[allow(unused_mut)] mut o: RefMut<T>` (so `o += v`, Rust's own, stores into `o`) |
//!
//! `vars` are the *carried variables*: outer variables assigned inside a
//! branch or loop body (see `carried.rs`). They are passed into the closures
//! by value and assigned back afterwards, which is what lets the runtime build
//! `scf.if` / `scf.for` / `scf.while` results.
//!
//! Note that `a && b` and `a || b` evaluate **both** operands (they become a
//! traced logical and/or, not a short-circuiting branch).
//!
//! Constructs that cannot be traced (closures, `return`, `match`, `loop`,
//! `break`, references, macros, unknown methods, ...) are compile errors
//! spanned at the offending tokens; all of them are reported at once.
//!
//! The pipeline is `parse` (tokens -> `parse::Kernel`) -> `check`
//! (signature and body rules, every error collected) -> `generate` (the
//! rewrites). When `check` fails the errors are emitted next to a best-effort
//! rewrite of the function, so that names stay resolvable for IDEs and the
//! body does not produce follow-up type errors from untranslated comparisons.

// Every unsafe block says why it is sound; every unsafe fn, what its caller must uphold.
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

mod body;
mod carried;
mod check;
mod export;
mod generate;
mod parse;
mod syntax;

#[cfg(test)]
mod tests;

use parse::MacroKind;

/// Marks a kernel entry point.
///
/// The function must return `()` and take handle parameters by value
/// (`x: Ref<f32>`, `o: RefMut<f32>`); outputs are written with `.store(..)`.
/// See the crate documentation for the body rewrites.
#[proc_macro_attribute]
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(MacroKind::Kernel, attr.into(), item.into()).into()
}

/// Marks a helper function that kernels (and other helpers) can call.
///
/// Any parameters and return type are allowed; the body follows the same
/// rules as a `#[tpu_kernel]` body.
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(MacroKind::KernelFn, attr.into(), item.into()).into()
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
    export::export(attr.into(), item.into()).into()
}

/// Generates the C ABI of a kernel library (a `cdylib` crate) over its `#[export]`ed launch
/// functions: `export_library!("my_kernels", [module::kernel_a, kernel_b]);`.
#[proc_macro]
pub fn export_library(input: TokenStream) -> TokenStream {
    export::export_library(input.into()).into()
}

/// `parse -> check -> generate`, with errors turned into `compile_error!`s
/// at the edge.
pub(crate) fn expand(kind: MacroKind, attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let kernel = match parse::parse(kind, attr, item.clone()) {
        Ok(kernel) => kernel,
        Err(err) => {
            // Not a function at all: report it and leave the item untouched.
            let mut out = err.into_compile_error();
            out.extend(item);
            return out;
        }
    };
    let checked = check::check(&kernel);
    let generated = generate::generate(kernel);
    match checked {
        Ok(()) => generated,
        Err(err) => {
            let mut out = err.into_compile_error();
            out.extend(generated);
            out
        }
    }
}

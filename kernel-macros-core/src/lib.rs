//! The logic of the `#[tpu_kernel]`, `#[kernel_fn]` and `#[export]` attribute macros and of
//! `export_library!`, over `proc_macro2` tokens.
//!
//! This is a plain library, not a proc-macro crate, so the expansions can be called from unit
//! tests and from the fuzz driver (`tests/fuzz/main.rs`); `kernel-macros` is the thin proc-macro entry
//! whose attributes each forward to one function here.
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
//! A syntax error inside the body does not stop the rest: the body is recovered
//! statement by statement (`recover.rs`), the broken statement reported and kept
//! as written, everything around it checked and rewritten.
//!
//! The pipeline is `parse` (tokens -> `parse::Kernel`) -> `check`
//! (signature and body rules, every error collected) -> `generate` (the
//! rewrites). When `check` fails the errors are emitted next to a best-effort
//! rewrite of the function, so that names stay resolvable for IDEs and the
//! body does not produce follow-up type errors from untranslated comparisons.

// Every unsafe block says why it is sound; every unsafe fn, what its caller must uphold.
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use proc_macro2::TokenStream;

mod body;
mod carried;
mod check;
mod export;
mod generate;
mod parse;
mod recover;
mod syntax;

#[cfg(test)]
mod tests;

use parse::MacroKind;

/// `#[tpu_kernel]`: a kernel entry point (see the crate documentation for the rewrites).
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(MacroKind::Kernel, attr, item)
}

/// `#[kernel_fn]`: a helper function that kernels (and other helpers) can call.
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(MacroKind::KernelFn, attr, item)
}

/// `#[export]`: a launch function exposed through a kernel library's C ABI.
pub fn export(attr: TokenStream, item: TokenStream) -> TokenStream {
    export::export(attr, item)
}

/// `export_library!("name", [kernel_a, module::kernel_b], host = [helper])`: the C ABI symbols over
/// `#[export]`s and host functions.
pub fn export_library(input: TokenStream) -> TokenStream {
    export::export_library(input)
}

/// `parse -> check -> generate`, with errors turned into `compile_error!`s
/// at the edge.
pub(crate) fn expand(kind: MacroKind, attr: TokenStream, item: TokenStream) -> TokenStream {
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

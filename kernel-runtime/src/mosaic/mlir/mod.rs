//! The MLIR writer (feature `mlir`): the Mosaic module as data made into a melior module and verified
//! by MLIR (`--emit mlir`, `PallasCall::mosaic_mlir`, the snapshots), and the serialized body read back
//! and written the long way ([`serde`]: the reference the direct bytecode writer is held to).
//!
//! The only part of the crate besides `mosaic_cpu` that links LLVM/MLIR. Nothing that ships a kernel
//! calls it: lowering, serialization, the interpreter and the library ABI work without this feature.

mod build;
mod context;
pub mod serde;

use crate::error::{kerr, Result, SourceLoc};
use crate::mosaic::model::MModule;
pub use context::with_context;
use melior::ir::operation::OperationLike;
use melior::ir::{Attribute, Location, Module};
use melior::Context;
pub use serde::{read_body, reference_bytecode};

/// Build the MLIR module for `m` in `ctx` and verify it.
pub fn build<'c>(ctx: &'c Context, m: &MModule) -> Result<Module<'c>> {
    let module = build::module(ctx, m)?;
    if !module.as_operation().verify() {
        return Err(kerr!(
            Lowering,
            "the generated Mosaic module for `{}` does not verify (a tpu-kernel bug); module:\n{}",
            m.name,
            module.as_operation()
        ));
    }
    Ok(module)
}

/// How [`text`] prints a module.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Form {
    /// Each op in its custom syntax, no locations (`--emit mlir`) — except the few whose custom syntax
    /// differs between LLVM 22 and jaxlib's MLIR, printed generically so jaxlib parses the text too.
    #[default]
    Custom,
    /// Each op in its custom syntax with its Rust source location (`loc(...)`), e.g. to map a Mosaic
    /// diagnostic back to the kernel line that produced the op.
    WithLocations,
    /// MLIR's generic op form (`"vector.extract_strided_slice"(%0) <{offsets = ...}>`): every op printed
    /// the same way whatever its custom syntax, so an MLIR of another version (jaxlib's) parses it. The
    /// custom form of some ops differs between LLVM 22 and jaxlib's MLIR (e.g.
    /// `vector.extract_strided_slice`'s braces), so text meant for other tools is generic.
    Generic,
}

/// The verified module `m` as MLIR text.
pub fn text(m: &MModule, form: Form) -> Result<String> {
    with_context(|ctx| {
        let module = build(ctx, m)?;
        let flags = melior::ir::operation::OperationPrintingFlags::new();
        let flags = match form {
            Form::Custom => return Ok(portable(&module.as_operation().to_string())),
            Form::WithLocations => flags.enable_debug_info(true, false),
            Form::Generic => flags.print_generic_operation_form(),
        };
        let text = module
            .as_operation()
            .to_string_with_flags(flags)
            .map_err(|e| kerr!(Lowering, "printing the module: {e}"))?;
        Ok(if form == Form::Generic {
            text
        } else {
            portable(&text)
        })
    })
}

/// The custom-form text with the ops whose custom syntax differs between LLVM 22 and jaxlib's MLIR
/// written in the generic form, which every MLIR parses, so the readable text parses under jaxlib too:
/// `vector.extract_strided_slice %x {offsets = .., sizes = .., strides = ..} : T to U` (jaxlib:
/// `%x offsets = .., ..`) becomes `"vector.extract_strided_slice"(%x) <{..}> : (T) -> U`.
fn portable(text: &str) -> String {
    const OP: &str = " = vector.extract_strided_slice ";
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        out.push_str(&portable_line(line, OP).unwrap_or_else(|| line.to_string()));
    }
    out
}

fn portable_line(line: &str, op: &str) -> Option<String> {
    let (head, rest) = line.split_once(op)?;
    let (operand, rest) = rest.split_once(" {")?;
    let (attrs, rest) = rest.split_once("} : ")?;
    let (from, rest) = rest.split_once(" to ")?;
    // The result type is a vector type; a location or the newline may follow.
    let end = rest.find('>')? + 1;
    let (to, tail) = rest.split_at(end);
    Some(format!(
        "{head} = \"vector.extract_strided_slice\"({operand}) <{{{attrs}}}> : ({from}) -> {to}{tail}"
    ))
}

/// The attribute `text` in `ctx`, parsed once per context (see `context::memo_attr`).
pub(crate) fn parse_attr<'c>(ctx: &'c Context, text: &str) -> Result<Attribute<'c>> {
    context::memo_attr(ctx, text)
        .ok_or_else(|| kerr!(Lowering, "MLIR could not parse the attribute `{text}`"))
}

/// The type `text` in `ctx`, parsed once per context.
pub(crate) fn parse_type<'c>(ctx: &'c Context, text: &str) -> Result<melior::ir::Type<'c>> {
    context::memo_type(ctx, text)
        .ok_or_else(|| kerr!(Lowering, "MLIR could not parse the type `{text}`"))
}

pub(crate) fn location<'c>(ctx: &'c Context, loc: &SourceLoc) -> Location<'c> {
    Location::new(ctx, loc.file, loc.line as usize, loc.col as usize)
}

//! Reading an emitted op: its name, its attributes as text (for ops written as they are) and its
//! typed attributes (integer arrays, integers), each missing or malformed one a `Lowering` error.
//!
//! May depend on: melior, `crate::error`; nothing else of `mosaic_cpu`.

use crate::error::{kerr, Result};
use melior::ir::attribute::{DenseI32ArrayAttribute, DenseI64ArrayAttribute, IntegerAttribute};
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::Attribute;
use std::fmt::Write;

/// A malformed emitted op: `mosaic_cpu: \`name\`: what` (a `Lowering` error: the lowering wrote
/// something this engine's rules do not read).
pub(in crate::mosaic_cpu) fn bad(
    op: OperationRef<'_, '_>,
    what: impl std::fmt::Display,
) -> crate::error::KernelError {
    kerr!(Lowering, "mosaic_cpu: `{}`: {what}", op_name(op))
}

/// Operand `i` of `op` (a malformed op without it is [`bad`]).
pub(in crate::mosaic_cpu) fn operand<'c, 'a>(
    op: OperationRef<'c, 'a>,
    i: usize,
) -> Result<melior::ir::Value<'c, 'a>> {
    op.operand(i)
        .map_err(|_| bad(op, format!("expected an operand {i}")))
}

/// The name of an op (`arith.addf`, `tpu.matmul`, ...).
pub(in crate::mosaic_cpu) fn op_name(op: OperationRef<'_, '_>) -> String {
    op.name()
        .as_string_ref()
        .as_str()
        .map(str::to_string)
        .unwrap_or_default()
}

/// ` {name = value, ...}` for an op's attributes (except `skip`), or nothing.
pub(in crate::mosaic_cpu) fn attrs_text(op: OperationRef<'_, '_>, skip: &[&str]) -> String {
    let mut items = Vec::new();
    for (name, value) in op.attributes() {
        let Ok(name) = name.as_string_ref().as_str().map(str::to_string) else {
            continue;
        };
        if skip.contains(&name.as_str()) {
            continue;
        }
        let mut s = String::new();
        let _ = write!(s, "{name} = {value}");
        items.push(s);
    }
    if items.is_empty() {
        String::new()
    } else {
        format!(" {{{}}}", items.join(", "))
    }
}

fn missing(op: OperationRef<'_, '_>, name: &str) -> crate::error::KernelError {
    kerr!(
        Lowering,
        "mosaic_cpu: `{}` has no valid `{name}` attribute",
        op_name(op)
    )
}

pub(in crate::mosaic_cpu) fn attr<'c>(
    op: OperationRef<'c, '_>,
    name: &str,
) -> Result<Attribute<'c>> {
    op.attribute(name).map_err(|_| missing(op, name))
}

pub(in crate::mosaic_cpu) fn i64_array(op: OperationRef<'_, '_>, name: &str) -> Result<Vec<i64>> {
    let a = DenseI64ArrayAttribute::try_from(attr(op, name)?).map_err(|_| missing(op, name))?;
    (0..a.len())
        .map(|i| a.element(i).map_err(|_| missing(op, name)))
        .collect()
}

pub(in crate::mosaic_cpu) fn i32_array(op: OperationRef<'_, '_>, name: &str) -> Result<Vec<i64>> {
    let a = DenseI32ArrayAttribute::try_from(attr(op, name)?).map_err(|_| missing(op, name))?;
    (0..a.len())
        .map(|i| a.element(i).map(i64::from).map_err(|_| missing(op, name)))
        .collect()
}

pub(in crate::mosaic_cpu) fn int_attr(op: OperationRef<'_, '_>, name: &str) -> Result<i64> {
    IntegerAttribute::try_from(attr(op, name)?)
        .map(|a| a.value())
        .map_err(|_| missing(op, name))
}

//! The elementwise ops of the IR: the definitions of the `kernel-ops` crate (name, traced method,
//! operand dtypes — one row per op), re-exported, and the operand check against this crate's dtypes.
//!
//! The consumers' columns live with the consumers, each an exhaustive `match`: the Mosaic op in
//! `lower/rules/elementwise.rs`, the CPU meaning in `interpret/ops.rs`; the traced methods and free
//! functions are generated from the rows in `trace/`. Composite ops (`expm1`, `sign`) have one column,
//! their expansion into table ops for a target (`crate::expand`), run before either engine.

use crate::dtype::DType;
pub use kernel_ops::{
    for_each_binary, for_each_composite, for_each_unary, BinaryOp, CompositeOp, ElementClass,
    Operands, UnaryOp,
};

/// Whether an operand class takes dtype `d`.
pub trait Accepts {
    fn accepts(self, d: DType) -> bool;
}

impl Accepts for Operands {
    fn accepts(self, d: DType) -> bool {
        self.accepts_class(d.class())
    }
}

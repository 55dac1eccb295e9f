//! Ops on rank-0 values — a kernel's index arithmetic, loop bounds, page numbers and their
//! comparisons (the plan's `scalar`) — run straight from the region loop: the same element
//! functions as at every other shape (`elementwise::binary`, `compare`), without the general
//! dispatch's list of results.

use super::*;

impl<'k> Machine<'k> {
    /// The rank-0 result of a constant, binary op or comparison the plan marked `scalar`, and where
    /// it goes.
    pub(super) fn scalar_op(&self, op: &Op) -> Result<(ValueId, Tensor)> {
        let [res] = op.results[..] else {
            return Err(internal("a scalar op without one result"));
        };
        let operand = |i: usize| {
            op.operands
                .get(i)
                .ok_or_else(|| internal("a scalar op's operand"))
                .and_then(|v| self.tensor(*v))
        };
        let t = match &op.kind {
            OpKind::Const(l) => Tensor::splat(*l, &[]),
            OpKind::Binary(b) => elementwise::binary(*b, operand(0)?, operand(1)?, &Sink::fresh())?,
            OpKind::Compare(c) => {
                elementwise::compare(*c, operand(0)?, operand(1)?, &Sink::fresh())?
            }
            _ => return Err(internal("a scalar op of another kind")),
        };
        Ok((res, t))
    }
}

//! Ops on rank-0 values — a kernel's index arithmetic, loop bounds, page numbers and their
//! comparisons (the plan's `scalar`) — run straight from the region loop: the same element
//! functions as at every other shape (`elementwise::binary`, `compare`), without the general
//! dispatch's list of results. A binary op on two `i32`s held inline (`Buf::One`: every index and
//! loop counter) applies that element function to the two values directly.

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
            OpKind::Binary(b) => {
                let (x, y) = (operand(0)?, operand(1)?);
                let direct = match (inline_i32(x), inline_i32(y)) {
                    // `elementwise::binary`'s element function for i32 (`ops::binary_int`).
                    (Some(x), Some(y)) => crate::interpret::ops::binary_int!(
                        *b, i32,
                        f => Some(Tensor::scalar(f(x, y))),
                        else None
                    ),
                    _ => None,
                };
                match direct {
                    Some(t) => t,
                    None => elementwise::binary(*b, x, y, &Sink::fresh())?,
                }
            }
            OpKind::Compare(c) => {
                elementwise::compare(*c, operand(0)?, operand(1)?, &Sink::fresh())?
            }
            _ => return Err(internal("a scalar op of another kind")),
        };
        Ok((res, t))
    }
}

/// The value of a rank-0 `i32` held inline.
fn inline_i32(t: &Tensor) -> Option<i32> {
    match &t.buf {
        Buf::One(one) if t.shape.is_empty() => one.slice::<i32>().map(|v| v[0]),
        _ => None,
    }
}

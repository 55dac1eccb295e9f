//! `dot` in a grid step: a `dot` whose accumulator is its ref's contents runs in place in the ref's
//! buffer (see [`super::Plan`]'s `acc_in_place`).

use super::{Machine, Value};
use crate::dtype::DType;
use crate::error::Result;
use crate::interpret::dot::{dot, dot_into};
use crate::interpret::plan::Plan;
use crate::interpret::tensor::{internal, recycle, Buf, Tensor};
use crate::ir::{Op, OpKind, ValueId};

impl Machine<'_> {
    /// A `dot` op, as written.
    pub(super) fn dot(&mut self, op: &Op, tl: bool, tr: bool) -> Result<Tensor> {
        let acc = match op.operands.get(2) {
            Some(v) => Some(self.tensor(*v)?),
            None => None,
        };
        let out = self.func.ty(op.results[0]).dtype();
        let (l, r) = (self.tensor(op.operands[0])?, self.tensor(op.operands[1])?);
        dot(l, r, acc, tl, tr, out)
    }

    /// A `dot` whose accumulator operand dies here (see [`Plan`]'s `acc_owned`): when the accumulator
    /// is a row-major buffer of the result's dtype that nothing else holds (a fresh `acc * alpha`),
    /// the product accumulates into that buffer instead of a copy of it; else a plain `dot`.
    pub(super) fn dot_owned_acc(&mut self, op: &Op, sub: &[Plan]) -> Result<Vec<Value>> {
        let Some((transposes, av)) = dot_with_acc(op) else {
            return self.op(op, sub);
        };
        let out = self.func.ty(op.results[0]).dtype();
        let acc = match self.env.get_mut(av.0 as usize) {
            Some(slot @ Some(Value::T(_))) => match slot.take() {
                Some(Value::T(t)) => t,
                _ => return Err(internal("dot accumulator")),
            },
            _ => return self.op(op, sub),
        };
        Ok(vec![Value::T(
            self.dot_consuming(op, transposes, out, acc)?,
        )])
    }

    /// A `dot` accumulating in place into the buffer of ref `rf` (see [`Plan`]): when the accumulator
    /// is exactly the ref's contents in an f32 (float operands) or i32 (i8 operands) buffer nothing
    /// else holds, the buffer is taken from the ref (the result's only use stores it back whole)
    /// instead of being copied; else a plain `dot`.
    pub(super) fn dot_in_place(
        &mut self,
        op: &Op,
        rf: ValueId,
        sub: &[Plan],
    ) -> Result<Vec<Value>> {
        let Some((transposes, av)) = dot_with_acc(op) else {
            return self.op(op, sub);
        };
        let out = self.func.ty(op.results[0]).dtype();
        let r = self.ref_index(rf)?;
        let same = match (&self.refs[r].content, self.env.get(av.0 as usize)) {
            (Some(c), Some(Some(Value::T(a)))) => {
                Buf::same(&c.buf, &a.buf)
                    && c.offset == a.offset
                    && c.shape == a.shape
                    && c.strides == a.strides
            }
            _ => false,
        };
        if !same || !matches!(out, DType::F32 | DType::I32) {
            return self.op(op, sub);
        }
        // The accumulator value has no other use (see `acc_in_place_ref`); drop it so the ref holds
        // the only reference to the buffer.
        self.env[av.0 as usize] = None;
        let content = self.refs[r]
            .content
            .take()
            .ok_or_else(|| internal("acc contents"))?;
        Ok(vec![Value::T(
            self.dot_consuming(op, transposes, out, content)?,
        )])
    }

    /// `dot` op `op` with the accumulator `acc`, which is ours to consume: a row-major buffer of the
    /// result's dtype that nothing else holds becomes the result (accumulated into in place); any
    /// other accumulator is read as a plain `dot` reads it.
    fn dot_consuming(
        &mut self,
        op: &Op,
        (tl, tr): (bool, bool),
        out: DType,
        acc: Tensor,
    ) -> Result<Tensor> {
        let owned = if acc.dtype == out
            && acc.is_contiguous()
            && acc.offset == 0
            && acc.buf.len() == acc.numel()
        {
            match acc.buf.try_unwrap() {
                Ok(data) => Ok((acc.shape, data)),
                Err(buf) => Err(Tensor { buf, ..acc }),
            }
        } else {
            Err(acc)
        };
        let (l, r) = (self.tensor(op.operands[0])?, self.tensor(op.operands[1])?);
        Ok(match owned {
            Ok((shape, data)) => dot_into(l, r, &shape, data, tl, tr)?,
            Err(acc) => {
                let t = dot(l, r, Some(&acc), tl, tr, out)?;
                recycle(acc);
                t
            }
        })
    }
}

/// A `dot` with an accumulator operand: its `(transpose_lhs, transpose_rhs)` and the accumulator.
fn dot_with_acc(op: &Op) -> Option<((bool, bool), ValueId)> {
    match (&op.kind, &op.operands[..]) {
        (
            OpKind::Dot {
                transpose_lhs,
                transpose_rhs,
            },
            [_, _, acc],
        ) => Some(((*transpose_lhs, *transpose_rhs), *acc)),
        _ => None,
    }
}

//! `dot` in a grid step: operands that are views of the caller's inputs widened once per run
//! ([`WidenCache`]), and a `dot` whose accumulator is its ref's contents run in place in the ref's
//! buffer (see [`super::Plan`]'s `acc_in_place`).

use super::{Machine, Value};
use crate::dtype::DType;
use crate::error::Result;
use crate::interpret::dot::{dot, dot_into};
use crate::interpret::elementwise;
use crate::interpret::plan::Plan;
use crate::interpret::tensor::{internal, recycle, Buf, Dims, Tensor};
use crate::ir::{Op, OpKind, ValueId};
use std::collections::HashMap;

/// The f32 widening of bf16 views of the caller's input arrays, kept across grid steps: a matmul's input
/// blocks recur (block (i, k) of `x` for every j), and widening them again on every step cost as much as
/// a tenth of a large matmul. The input buffers are immutable for the whole run (we hold a reference to
/// each, so none is freed or reused), so a view's buffer, offset, shape and strides determine its
/// contents, and the cached copy has exactly the bits a fresh widening would.
pub(crate) struct WidenCache {
    inputs: Vec<Buf>,
    map: HashMap<(usize, usize, Dims, Dims), Tensor>,
    bytes: usize,
}

/// At most this many bytes of widened copies per machine; past it, operands are widened per use.
const WIDEN_BUDGET: usize = 64 << 20;

impl WidenCache {
    pub fn new(inputs: Vec<Buf>) -> Self {
        WidenCache {
            inputs,
            map: HashMap::new(),
            bytes: 0,
        }
    }

    /// `t` widened to f32 when it is a bf16 view of an input array (cached), else None.
    fn widen(&mut self, t: &Tensor) -> Result<Option<Tensor>> {
        // Where bf16 products run natively, `dot` takes bf16 operands as they are.
        if t.dtype != DType::BF16 || crate::interpret::dot::bf16_native() {
            return Ok(None);
        }
        let Some(no) = self.inputs.iter().position(|b| Buf::same(b, &t.buf)) else {
            return Ok(None);
        };
        let key = (no, t.offset, t.shape.clone(), t.strides.clone());
        if let Some(w) = self.map.get(&key) {
            return Ok(Some(w.clone()));
        }
        let bytes = t.shape.iter().product::<usize>() * 4;
        if self.bytes + bytes > WIDEN_BUDGET {
            return Ok(None);
        }
        let w = elementwise::cast(t, DType::F32)?;
        self.bytes += bytes;
        self.map.insert(key, w.clone());
        Ok(Some(w))
    }
}

impl Machine<'_> {
    /// The operands of `dot` op `op`, widened from the cache where it has them.
    fn dot_operands(&mut self, op: &Op) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (l, r) = (
            self.tensor(op.operands[0])?.clone(),
            self.tensor(op.operands[1])?.clone(),
        );
        Ok((self.widened.widen(&l)?, self.widened.widen(&r)?))
    }

    /// Factor `i` of `dot` op `op`: its widened copy when [`Machine::dot_operands`] made one.
    fn factor<'a>(&'a self, widened: &'a Option<Tensor>, op: &Op, i: usize) -> Result<&'a Tensor> {
        match widened {
            Some(w) => Ok(w),
            None => self.tensor(op.operands[i]),
        }
    }

    /// A `dot` op, as written.
    pub(super) fn dot(&mut self, op: &Op, tl: bool, tr: bool) -> Result<Tensor> {
        let (wl, wr) = self.dot_operands(op)?;
        let acc = match op.operands.get(2) {
            Some(v) => Some(self.tensor(*v)?),
            None => None,
        };
        let out = self.func.ty(op.results[0]).dtype();
        let (l, r) = (self.factor(&wl, op, 0)?, self.factor(&wr, op, 1)?);
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
        let (wl, wr) = self.dot_operands(op)?;
        let (l, r) = (self.factor(&wl, op, 0)?, self.factor(&wr, op, 1)?);
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

//! `dot` in a grid step: a `dot` whose accumulator is its ref's contents runs in place in the ref's
//! buffer (see [`super::Plan`]'s `acc_in_place`); a `select` that only makes a `dot`'s right factor
//! runs inside it where it can (the plan's `select_rhs`); a `dot` a `select` reads only in some
//! columns computes those (the plan's `live_columns`).

use super::{Machine, Value, Values};
use crate::dtype::DType;
use crate::error::Result;
use crate::interpret::dot::{dot, dot_into, KeepRows};
use crate::interpret::elementwise::{self, Sink};
use crate::interpret::plan::{LiveColumns, Plan};
use crate::interpret::tensor::{internal, recycle, Buf, Tensor};
use crate::ir::BinaryOp;
use crate::ir::{Op, OpKind, Region, ValueId};

/// The rows a `dot` keeps of its right factor, from a `select`'s condition (see [`KeepRows`]).
pub(super) struct Kept {
    cond: Tensor,
    stride: usize,
}

impl Kept {
    fn rows(&self) -> Result<KeepRows<'_>> {
        Ok(KeepRows {
            data: self.cond.data::<bool>()?,
            off: self.cond.offset,
            stride: self.stride,
        })
    }
}

impl Machine<'_> {
    /// A `dot` op, as written.
    pub(super) fn dot(&mut self, op: &Op, tl: bool, tr: bool) -> Result<Tensor> {
        self.dot_keeping(op, (tl, tr), None)
    }

    /// A `dot` op whose right factor's rows `keep` drops (see [`KeepRows`]), if given.
    fn dot_keeping(
        &mut self,
        op: &Op,
        (tl, tr): (bool, bool),
        keep: Option<&Kept>,
    ) -> Result<Tensor> {
        let acc = match op.operands.get(2) {
            Some(v) => Some(self.tensor(*v)?),
            None => None,
        };
        let out = self.func.ty(op.results[0]).dtype();
        let (l, r) = (self.tensor(op.operands[0])?, self.tensor(op.operands[1])?);
        let keep = keep.map(Kept::rows).transpose()?;
        dot(l, r, keep, acc, tl, tr, out)
    }

    /// Op `op` as written, or, with `keep`, the `dot` it is, keeping those rows of its right factor.
    pub(super) fn dot_op(&mut self, op: &Op, sub: &[Plan], keep: Option<Kept>) -> Result<Values> {
        match (&op.kind, keep) {
            (
                OpKind::Dot {
                    transpose_lhs,
                    transpose_rhs,
                },
                Some(keep),
            ) => Ok(smallvec::smallvec![Value::T(self.dot_keeping(
                op,
                (*transpose_lhs, *transpose_rhs),
                Some(&keep),
            )?)]),
            (_, None) => self.op(op, sub),
            _ => Err(internal("kept rows at an op that is not a dot")),
        }
    }

    /// A `dot` whose result a `select` reads only in some columns (the plan's `live_columns`): the
    /// product of the columns up to the last one read, zeros after it (which the select never
    /// picks). Which columns are read is the select's condition, run here on one row of columns with
    /// the elementwise ops' own definitions; when its operands are not at hand, the whole product.
    pub(super) fn dot_live_columns(
        &mut self,
        op: &Op,
        live: Option<LiveColumns>,
        keep: Option<Kept>,
    ) -> Result<Values> {
        let (
            Some(live),
            OpKind::Dot {
                transpose_lhs: tl,
                transpose_rhs: tr,
            },
        ) = (live, &op.kind)
        else {
            return self.dot_op(op, &[], keep);
        };
        let shape = self.func.ty(op.results[0]).shape();
        let [m, n] = shape[..] else {
            return Err(internal("a live-column dot's result is not a matrix"));
        };
        let out = self.func.ty(op.results[0]).dtype();
        if out != DType::F32 {
            return Err(internal("a live-column dot's result is not f32"));
        }
        let end = match self.last_live_column(live, n)? {
            Some(end) if end < n => end,
            _ => return self.dot_op(op, &[], keep),
        };
        let (l, r) = (self.tensor(op.operands[0])?, self.tensor(op.operands[1])?);
        // The right factor's first `end` columns as the product multiplies it (its rows if transposed).
        let (starts, mut sizes) = ([0, 0], [r.shape[0], r.shape[1]]);
        sizes[usize::from(!*tr)] = end;
        let r = r.window(&starts, &sizes, &[false, false]);
        let keep = keep.as_ref().map(Kept::rows).transpose()?;
        let part = dot(l, &r, keep, None, *tl, *tr, out)?;
        let mut c = crate::interpret::tensor::take_vec::<f32>(m * n);
        c.resize(m * n, 0.0);
        if end > 0 {
            let part = part.to_vec::<f32>()?;
            for (row, from) in c.chunks_mut(n).zip(part.chunks(end)) {
                row[..end].copy_from_slice(from);
            }
        }
        Ok(smallvec::smallvec![Value::T(Tensor::from_vec([m, n], c))])
    }

    /// One past the last column `live`'s comparison holds in, of `n` (None when its operands are
    /// not at hand).
    fn last_live_column(&self, live: LiveColumns, n: usize) -> Result<Option<usize>> {
        let at_hand = |v: ValueId| matches!(self.env.get(v.0 as usize), Some(Some(Value::T(_))));
        if !at_hand(live.x) || !at_hand(live.y) {
            return Ok(None);
        }
        let (x, y) = (self.tensor(live.x)?, self.tensor(live.y)?);
        let columns = Tensor::from_vec([n], (0..n as i32).collect::<Vec<i32>>());
        let (xs, ys) = (x.broadcast_to(&[n])?, y.broadcast_to(&[n])?);
        let sum = match live.iota_first {
            true => elementwise::binary(BinaryOp::Add, &columns, &xs, &Sink::fresh())?,
            false => elementwise::binary(BinaryOp::Add, &xs, &columns, &Sink::fresh())?,
        };
        let holds = elementwise::compare(live.cmp, &sum, &ys, &Sink::fresh())?;
        let holds = holds.to_vec::<bool>()?;
        Ok(Some(holds.iter().rposition(|h| *h).map_or(0, |j| j + 1)))
    }

    /// The `select` that op `i` (a `dot`) takes as its right factor, if the plan runs one there
    /// (`select_rhs`): where its condition is the same along each row of the factor as the `dot`
    /// multiplies it and its other choice is +0 (every element), its chosen operand stands for its
    /// result and the rows to keep come back — the `dot` reads those rows in place and zeros for the
    /// others, the select's own values —; else its result, computed as written.
    pub(super) fn select_rhs(&mut self, r: &Region, plan: &Plan, i: usize) -> Result<Option<Kept>> {
        let Some(j) = plan.select_rhs[i] else {
            return Ok(None);
        };
        let (sel, op) = (&r.ops[j], &r.ops[i]);
        let ([c, x, y], [res]) = (&sel.operands[..], &sel.results[..]) else {
            return Err(internal("select operands"));
        };
        let tr = matches!(
            op.kind,
            OpKind::Dot {
                transpose_rhs: true,
                ..
            }
        );
        let (c, x, y) = (self.tensor(*c)?, self.tensor(*x)?, self.tensor(*y)?);
        if let Some(stride) = rows_of(c, x, y, tr) {
            let kept = Kept {
                cond: c.clone(),
                stride,
            };
            self.env[res.0 as usize] = Some(Value::T(x.clone()));
            return Ok(Some(kept));
        }
        let value = elementwise::select(c, x, y, &Sink::fresh())?;
        self.env[res.0 as usize] = Some(Value::T(value));
        Ok(None)
    }

    /// A `dot` whose accumulator operand dies here (see [`Plan`]'s `acc_owned`): when the accumulator
    /// is a row-major buffer of the result's dtype that nothing else holds (a fresh `acc * alpha`),
    /// the product accumulates into that buffer instead of a copy of it; else a plain `dot`.
    pub(super) fn dot_owned_acc(
        &mut self,
        op: &Op,
        sub: &[Plan],
        keep: Option<Kept>,
    ) -> Result<Values> {
        let Some((transposes, av)) = dot_with_acc(op) else {
            return self.dot_op(op, sub, keep);
        };
        let out = self.func.ty(op.results[0]).dtype();
        let acc = match self.env.get_mut(av.0 as usize) {
            Some(slot @ Some(Value::T(_))) => match slot.take() {
                Some(Value::T(t)) => t,
                _ => return Err(internal("dot accumulator")),
            },
            _ => return self.dot_op(op, sub, keep),
        };
        Ok(smallvec::smallvec![Value::T(self.dot_consuming(
            op,
            transposes,
            (out, acc),
            keep.as_ref(),
        )?)])
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
        keep: Option<Kept>,
    ) -> Result<Values> {
        let Some((transposes, av)) = dot_with_acc(op) else {
            return self.dot_op(op, sub, keep);
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
            return self.dot_op(op, sub, keep);
        }
        // The accumulator value has no other use (see `acc_in_place_ref`); drop it so the ref holds
        // the only reference to the buffer.
        self.env[av.0 as usize] = None;
        let content = self.refs[r]
            .content
            .take()
            .ok_or_else(|| internal("acc contents"))?;
        Ok(smallvec::smallvec![Value::T(self.dot_consuming(
            op,
            transposes,
            (out, content),
            keep.as_ref(),
        )?)])
    }

    /// `dot` op `op` with the accumulator `acc`, which is ours to consume: a row-major buffer of the
    /// result's dtype that nothing else holds becomes the result (accumulated into in place); any
    /// other accumulator is read as a plain `dot` reads it.
    fn dot_consuming(
        &mut self,
        op: &Op,
        (tl, tr): (bool, bool),
        (out, acc): (DType, Tensor),
        keep: Option<&Kept>,
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
        let keep = keep.map(Kept::rows).transpose()?;
        Ok(match owned {
            Ok((shape, data)) => dot_into(l, (r, keep), &shape, data, tl, tr)?,
            Err(acc) => {
                let t = dot(l, r, keep, Some(&acc), tl, tr, out)?;
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

/// The stride of the rows a `select(c, x, y)` keeps of a `dot`'s right factor `x` (`k × n` as the dot
/// multiplies it, `tr`: stored transposed), where `c` is the same along each of those rows (stride 0
/// or size 1 along the other dimension) and `y` is +0 everywhere (a broadcast of +0.0 in bf16 or f32);
/// else None.
fn rows_of(c: &Tensor, x: &Tensor, y: &Tensor, tr: bool) -> Option<usize> {
    if x.shape.len() != 2 || c.shape != x.shape || y.shape != x.shape || c.dtype != DType::Bool {
        return None;
    }
    let (k_dim, n_dim) = if tr { (1, 0) } else { (0, 1) };
    if c.strides[n_dim] != 0 && c.shape[n_dim] != 1 {
        return None;
    }
    if y.dtype != x.dtype || y.strides.iter().any(|s| *s != 0) {
        return None;
    }
    let zero = matches!(y.dtype, DType::BF16 | DType::F32) && y.literal().ok()?.bits == 0;
    zero.then_some(c.strides[k_dim])
}

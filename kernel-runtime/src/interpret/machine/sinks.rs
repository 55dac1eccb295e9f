//! Elementwise work written straight into an output block: fused chains (the plan's `chain`) and
//! results only stored whole into a ref (`sink_to`).

use super::*;
use crate::interpret::fused;

impl<'k> Machine<'k> {
    /// Run a fused chain ending at `op`, into the output block of `sink` when possible.
    pub(super) fn chain(&mut self, op: &Op, ch: &Chain, sink: Option<ValueId>) -> Result<Values> {
        let dest = match sink.map(|r| self.ref_index(r)) {
            Some(Ok(ri)) if !self.refs[ri].written_through => {
                self.dests.get(ri).and_then(|d| d.clone())
            }
            _ => None,
        };
        let out = self.func.ty(op.results[0]).dtype();
        let first = self.tensor(ch.first)?;
        let exts = ch
            .exts
            .iter()
            .map(|v| self.tensor(*v))
            .collect::<Result<Vec<_>>>()?;
        let (epi, store) = match &ch.reduce {
            Some((e, _, store)) => (Some(e), *store),
            None => (None, true),
        };
        let (value, reduced) =
            fused::run_chain(first, &ch.links, &exts, out, dest.as_ref(), epi, store)?;
        if let (Some((_, res, _)), Some(t)) = (&ch.reduce, reduced) {
            self.env[res.0 as usize] = Some(Value::T(t));
        }
        // Without a value (sunk into the output block, or needed only by the folded reduction) the
        // result is a placeholder its single remaining use (a store) or none reads.
        Ok(smallvec::smallvec![value.map_or(Value::Sunk, Value::T)])
    }

    /// An elementwise op whose result is only stored whole into ref `r`: write it straight into the
    /// output block when that block lives in the output array.
    pub(super) fn sunk_op(&mut self, op: &Op, r: ValueId) -> Result<Values> {
        // Not while the block already lives in the array: a load between this op and the store must
        // still see the previous contents.
        let dest = match self.ref_index(r) {
            Ok(ri) if !self.refs[ri].written_through => self.dests.get(ri).and_then(|d| d.clone()),
            _ => None,
        };
        let Some(dest) = dest else {
            return self.op(op, &[]);
        };
        // SAFETY: `dests` only holds blocks of the output arrays that this chunk owns exclusively
        // (see `grid::Runner::enter`), and nothing reads them while the op runs.
        let sink = unsafe { Sink::offer(&dest) };
        let t = self.op_to(op, &[], &sink).and_then(single_tensor)?;
        Ok(smallvec::smallvec![if sink.filled() {
            Value::Sunk
        } else {
            Value::T(t)
        }])
    }
}

//! Loads of packed 32-bit words used only by word-half casts (the plan's `load_halves`, a packed
//! key/value cache's words split into keys and values): the casts' bf16 results made at the load.

use super::views::forward_for_free;
use super::walk::{self, kept_sizes};
use super::*;

impl<'k> Machine<'k> {
    /// A bf16 cast of a packed word's half, its `shl`/`and` and `bitcast` skipped (the plan's
    /// `word_half`).
    pub(super) fn word_half(&self, w: ValueId, half: WordHalf) -> Result<Values> {
        let t = elementwise::word_half_to_bf16(self.tensor(w)?, half)?;
        Ok(smallvec::smallvec![Value::T(t)])
    }

    /// A load whose words are used only by word-half casts (the plan's `load_halves`): each cast's
    /// bf16 result, read straight from the ref's 16-bit rows where the load reads through a view
    /// that assembles each word from two of them (or, for a `dot` factor, those rows themselves when
    /// they are evenly spaced), else split from the loaded words.
    pub(super) fn load_halves(&self, op: &Op, halves: &[HalfCast]) -> Result<Vec<Tensor>> {
        let OpKind::Load(w) = &op.kind else {
            return Err(internal("load_halves at an op that is not a load"));
        };
        if let Some(Some(Value::View(v))) = self.env.get(op.operands[0].0 as usize) {
            if let Some(ts) = self.load_view_halves(op, w, v, halves)? {
                return Ok(ts);
            }
        }
        let words = self.load(op, w)?;
        let out = halves
            .iter()
            .map(|c| elementwise::word_half_to_bf16(&words, c.half))
            .collect();
        recycle(words);
        out
    }

    /// [`Self::load_view`] of 32-bit words split into bf16 `halves` (the plan's `load_halves`): read
    /// straight from the ref's 16-bit elements when every piece of the window carries one whole
    /// element into one half of a word; None otherwise (the caller loads the words).
    fn load_view_halves(
        &self,
        op: &Op,
        w: &Window,
        v: &RefView,
        halves: &[HalfCast],
    ) -> Result<Option<Vec<Tensor>>> {
        let (p, starts) = self.view_access_start(op, w, v, false)?;
        let base = self.contents(v.r)?;
        if p.result().1 != DType::U32 || forward_for_free(&base, &p)?.is_some() {
            return Ok(None);
        }
        let kept = kept_sizes(&w.sizes, &w.squeezed);
        let n = kept.iter().product();
        let window = (&starts[..], &w.sizes[..], &w.squeezed[..]);
        let segs = self
            .segments
            .window(&p, (&base.strides, base.offset), window, &w.strides)?;
        walk::read_halves(&base, &segs, &kept, n, halves)
    }
}

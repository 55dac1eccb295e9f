//! The rows a `dot` keeps of its right factor: a `select(keep, rhs, 0)` whose condition is the same
//! along each row, folded into the product (the plan's `select_rhs`, `machine/dots.rs`).

use super::matrix;
use crate::dtype::DType;
use crate::error::Result;
use crate::interpret::tensor::{internal, Tensor};

/// Which rows of a product's right factor (`k × n`, as multiplied) it keeps: row `r` is kept where
/// `data[off + r·stride]` holds; a dropped row reads as +0 — a `select(keep, rhs, 0)` whose condition
/// is the same along each row, folded into the `dot` (the plan's `select_rhs`).
#[derive(Clone, Copy)]
pub(crate) struct KeepRows<'a> {
    pub data: &'a [bool],
    pub off: usize,
    pub stride: usize,
}

impl KeepRows<'_> {
    #[inline]
    pub(crate) fn keeps(&self, r: usize) -> bool {
        self.data[self.off + r * self.stride]
    }

    /// Whether row `k - 1` lies in `data` (then every row does).
    fn covers(&self, k: usize) -> bool {
        k == 0 || self.off + (k - 1) * self.stride < self.data.len()
    }
}

/// `rhs` and the rows it keeps as the product's kernel takes them: the bf16 kernel packs the kept
/// rows itself (zeros for the others); for every other kernel the dropped rows are zeroed in a copy
/// first (what the `select` would have made).
pub(super) fn with_kept<'t>(
    lhs: &Tensor,
    rhs: &'t Tensor,
    keep: Option<KeepRows<'t>>,
    tr: bool,
    dropped: &'t mut Option<Tensor>,
) -> Result<(&'t Tensor, Option<KeepRows<'t>>)> {
    let Some(keep) = keep else {
        return Ok((rhs, None));
    };
    let (k, _, _, _) = matrix(rhs, tr)?;
    if !keep.covers(k) {
        return Err(internal("dot kept rows out of their buffer"));
    }
    if lhs.dtype == DType::BF16
        && rhs.dtype == DType::BF16
        && crate::interpret::dot_bf16_order::packs_kept_rows()
    {
        return Ok((rhs, Some(keep)));
    }
    let mut t = rhs.materialize()?;
    let cols = t.shape[1];
    crate::interpret::elementwise::with_dtype!(t.dtype, T => {
        let d = t.buf.elems_mut::<T>()?;
        for (i, row) in d.chunks_mut(cols.max(1)).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                if !keep.keeps(if tr { j } else { i }) {
                    *x = T::default();
                }
            }
        }
    });
    Ok((dropped.insert(t), None))
}

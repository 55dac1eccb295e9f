//! One element of a ref: `memref.load` / `memref.store`, what the lowering emits for an SMEM ref's
//! scalar (`idx_ref[i]` in the body or in an index map, an SMEM scratch cell). The ref is a flat buffer
//! (its memory space dropped, see `rewrite::map_type`): the indices are bounds-checked, as the
//! interpreter checks them, and linearized row-major.

use super::rewrite::{bad, key, row_major, Rewriter, SiteKind, Ty, Val};
use super::rules::window_in_bounds;
use crate::error::Result;
use melior::ir::operation::{OperationLike, OperationRef};

/// The ref (operand `base`) and its `index` indices, checked against each other.
fn ref_and_indices(
    rw: &Rewriter<'_>,
    op: OperationRef<'_, '_>,
    base: usize,
) -> Result<(Val, Vec<Val>, Vec<usize>, String)> {
    let operands = rw.operands(op)?;
    let (Some(r), Some(indices)) = (operands.get(base), operands.get(base + 1..)) else {
        return Err(bad(op, "expected a ref and its indices"));
    };
    let Ty::Mem { shape, elem } = &r.ty else {
        return Err(bad(op, "the base is not a ref"));
    };
    if indices.len() != shape.len() || indices.iter().any(|i| i.ty != Ty::Scalar("index".into())) {
        return Err(bad(
            op,
            format!(
                "{} indices for a ref of rank {} (one `index` per dimension)",
                indices.len(),
                shape.len()
            ),
        ));
    }
    Ok((r.clone(), indices.to_vec(), shape.clone(), elem.clone()))
}

/// The bounds check of one element access: (in bounds `i1`, row-major offset, check number).
fn checked_offset(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    base: usize,
    indices: &[Val],
    shape: &[usize],
    store: bool,
) -> (String, String, i64) {
    let ref_id = op
        .operand(base)
        .ok()
        .and_then(|v| rw.refs.get(&key(v)).copied());
    let site = rw.site(
        op,
        SiteKind::Element {
            store,
            shape: shape.to_vec(),
            index_map: rw.index_map,
        },
        ref_id,
    );
    let ok = window_in_bounds(rw, indices, shape, &[], &[]);
    let terms: Vec<(String, usize)> = indices
        .iter()
        .map(|i| i.name.clone())
        .zip(row_major(shape))
        .collect();
    let at = rw.linear(&terms, None);
    (ok, at, site)
}

/// `memref.load %ref[%i, ...]`: out of bounds, the check is recorded and element 0 read instead (the
/// step fails; nothing past the buffer is touched).
pub(super) fn load(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    super::rules::not_in_hbm(op, 0)?;
    let (r, indices, shape, elem) = ref_and_indices(rw, op, 0)?;
    if rw.result_ty(op, 0)? != Ty::Scalar(elem.clone()) {
        return Err(bad(op, "the result is not one element of the ref"));
    }
    if shape.contains(&0) {
        return Err(bad(op, "a load from an empty ref"));
    }
    let (ok, at, site) = checked_offset(rw, op, 0, &indices, &shape, false);
    let c0 = rw.index(0);
    let safe = rw.fresh();
    rw.line(format!("{safe} = arith.select {ok}, {at}, {c0} : index"));
    rw.if_else(&ok, |_| Ok(()), |rw| rw.record(site, &indices))?;
    let x = rw.load(&r, &safe);
    rw.bind_result(
        op,
        0,
        Val {
            name: x,
            ty: Ty::Scalar(elem),
        },
    )
}

/// `memref.store %value, %ref[%i, ...]`: out of bounds, the check is recorded and nothing stored.
pub(super) fn store(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    super::rules::not_in_hbm(op, 1)?;
    let (r, indices, shape, elem) = ref_and_indices(rw, op, 1)?;
    let value = rw.val(
        op.operand(0)
            .map_err(|_| bad(op, "expected a value to store"))?,
    )?;
    if value.ty != Ty::Scalar(elem) {
        return Err(bad(op, "the value is not one element of the ref"));
    }
    let (ok, at, site) = checked_offset(rw, op, 1, &indices, &shape, true);
    rw.if_else(
        &ok,
        |rw| {
            rw.store(&value.name, &r, &at);
            Ok(())
        },
        |rw| rw.record(site, &indices),
    )
}

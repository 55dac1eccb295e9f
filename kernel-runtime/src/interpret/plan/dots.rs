//! The dot pass: a `dot` that accumulates in place into its ref's buffer, or into the buffer of an
//! accumulator that dies at it; a `select` that only makes a `dot`'s right factor, run inside it.

use super::deep_uses;
use crate::dtype::DType;
use crate::ir::{Func, Op, OpKind, Region, ValueId};
use std::collections::HashMap;

/// Whether `op` is a `dot` whose accumulator operand dies at it (`dead` lists the values freed after
/// the op) and is not also one of its factors.
pub(super) fn acc_dies_at(op: &Op, dead: &[ValueId]) -> bool {
    matches!(
        (&op.kind, &op.operands[..]),
        (OpKind::Dot { .. }, [l, r, acc]) if l != acc && r != acc && dead.contains(acc)
    )
}

/// The ref a `dot` (op `i`) may accumulate into in place: its accumulator is a full, single-use load of
/// the ref in this region, and its result's single use is a full unmasked store into the same ref, with
/// no other use of the ref between the dot and the store.
pub(super) fn acc_in_place_ref(
    f: &Func,
    r: &Region,
    i: usize,
    op: &Op,
    all_uses: &HashMap<ValueId, usize>,
) -> Option<ValueId> {
    let (OpKind::Dot { .. }, [_, _, acc], [res]) = (&op.kind, &op.operands[..], &op.results[..])
    else {
        return None;
    };
    // The accumulators `dot_into` takes: f32 (float operands) and i32 (i8 operands).
    if !matches!(f.ty(*res).dtype(), DType::F32 | DType::I32) {
        return None;
    }
    if all_uses.get(acc) != Some(&1) || all_uses.get(res) != Some(&1) {
        return None;
    }
    let load = r.ops[..i].iter().find(|o| o.results.contains(acc))?;
    let OpKind::Load(w) = &load.kind else {
        return None;
    };
    let rf = *load.operands.first()?;
    if !w.is_full(f.ty(rf).shape()) || !super::plain_ref(f, rf) {
        return None;
    }
    let j = (i + 1..r.ops.len()).find(|&j| r.ops[j].operands.contains(res))?;
    match &r.ops[j] {
        Op {
            kind:
                OpKind::Store {
                    window,
                    masked: false,
                },
            operands,
            ..
        } if operands.first() == Some(&rf)
            && operands.get(1) == Some(res)
            && window.is_full(f.ty(rf).shape()) => {}
        _ => return None,
    }
    let mut uses = Vec::new();
    for o in &r.ops[i + 1..j] {
        uses.clear();
        deep_uses(o, &mut uses);
        if uses.contains(&rf) {
            return None;
        }
    }
    Some(rf)
}

/// `dot`s whose right factor is the result of a `select` in this region that nothing else uses and no
/// other pass has taken: the select's index, per dot. The select is skipped and runs at the dot
/// (`exec_at`, so its operands live until then): where its condition is the same along each row of
/// the factor and its other choice is +0, the `dot` reads the chosen rows in place and zeros for the
/// others (`interpret::dot::KeepRows`); else the select runs there as written.
pub(super) fn select_rhs(
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
    (skip, taken): (&mut [bool], &[bool]),
    exec_at: &mut [usize],
) -> Vec<Option<usize>> {
    let mut out = vec![None; r.ops.len()];
    for (i, op) in r.ops.iter().enumerate() {
        let (OpKind::Dot { .. }, Some(rhs)) = (&op.kind, op.operands.get(1)) else {
            continue;
        };
        if all_uses.get(rhs) != Some(&1) {
            continue;
        }
        let Some(j) = r.ops[..i].iter().position(|o| o.results == [*rhs]) else {
            continue;
        };
        if matches!(r.ops[j].kind, OpKind::Select) && !skip[j] && !taken[j] && exec_at[j] == j {
            skip[j] = true;
            exec_at[j] = i;
            out[i] = Some(j);
        }
    }
    out
}

//! The dot pass: a `dot` that accumulates in place into its ref's buffer, or into the buffer of an
//! accumulator that dies at it; a `select` that only makes a `dot`'s right factor, run inside it; a
//! `dot` a `select` reads only in some columns, computed in those ([`LiveColumns`]).

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

/// The columns of a `dot`'s result that something reads: the dot's result reaches, through
/// elementwise ops each the only use of the one before, only the chosen operand of a `select` whose
/// condition (or one factor of an `and` making it) is `cmp(iota along the columns + x, y)` — `x` and
/// `y` rank-0 `i32` values defined outside the region or before the dot. A column where that
/// comparison is false is the other choice's in the select's result, whatever the dot put there
/// (a score past a sequence's kv length, masked: `q kᵀ` over a KV block it fills only in part).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveColumns {
    pub cmp: crate::ir::CmpOp,
    /// The iota's operand position in the `add` (0 or 1), so the add runs as written.
    pub iota_first: bool,
    pub x: ValueId,
    pub y: ValueId,
    /// The select that reads the result.
    pub select: usize,
}

/// [`LiveColumns`] per op, for `dot`s to f32 without an accumulator whose result is read only as
/// described there.
pub(super) fn live_columns(
    f: &Func,
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
) -> Vec<Option<LiveColumns>> {
    let mut out = vec![None; r.ops.len()];
    let def =
        |v: ValueId, before: usize| r.ops[..before].iter().rposition(|o| o.results.contains(&v));
    for (i, op) in r.ops.iter().enumerate() {
        let (OpKind::Dot { .. }, [_, _], [res]) = (&op.kind, &op.operands[..], &op.results[..])
        else {
            continue;
        };
        let shape = f.ty(*res).shape();
        // (f32: the result of every float product the interpreter computes.)
        if shape.len() != 2 || f.ty(*res).dtype() != DType::F32 {
            continue;
        }
        // Follow the single uses to the select.
        let (mut v, mut at) = (*res, i);
        let select = loop {
            if all_uses.get(&v) != Some(&1) {
                break None;
            }
            let Some(j) = (at + 1..r.ops.len()).find(|&j| r.ops[j].operands.contains(&v)) else {
                break None;
            };
            let user = &r.ops[j];
            match (&user.kind, &user.operands[..], &user.results[..]) {
                (OpKind::Select, [c, t, e], [_]) if *t == v && *c != v && *e != v => break Some(j),
                (OpKind::Unary(_) | OpKind::Binary(_) | OpKind::Cast(_), _, [next])
                    if f.ty(*next).shape() == shape && f.ty(*next).dtype().is_float() =>
                {
                    (v, at) = (*next, j);
                }
                _ => break None,
            }
        };
        let Some(s) = select else {
            continue;
        };
        let cond = r.ops[s].operands[0];
        if f.ty(cond).shape() != shape {
            continue;
        }
        // Rank-0 values the dot can read: defined outside the region or before the dot.
        let ready = |v: ValueId| {
            f.ty(v).shape().is_empty()
                && f.ty(v).dtype() == DType::I32
                && r.ops
                    .iter()
                    .position(|o| o.results.contains(&v))
                    .is_none_or(|d| d < i)
        };
        // The comparison, itself or a factor of `and`s (a column false there is false in all).
        let mut todo = vec![cond];
        let mut found = None;
        while let (Some(c), None) = (todo.pop(), found) {
            let Some(d) = def(c, s) else { continue };
            let o = &r.ops[d];
            match (&o.kind, &o.operands[..]) {
                (OpKind::Binary(crate::ir::BinaryOp::And), [a, b]) => todo.extend([*b, *a]),
                (OpKind::Compare(cmp), [lhs, rhs]) => {
                    let (Some(add), Some(bc)) = (def(*lhs, s), def(*rhs, s)) else {
                        continue;
                    };
                    let (OpKind::Broadcast, [y]) = (&r.ops[bc].kind, &r.ops[bc].operands[..])
                    else {
                        continue;
                    };
                    let (OpKind::Binary(crate::ir::BinaryOp::Add), [p, q]) =
                        (&r.ops[add].kind, &r.ops[add].operands[..])
                    else {
                        continue;
                    };
                    let is_iota = |v: &ValueId| {
                        def(*v, s).is_some_and(|k| {
                            matches!(r.ops[k].kind, OpKind::Iota { dim: 1 })
                                && f.ty(*v).dtype() == DType::I32
                        })
                    };
                    let bcast_of = |v: &ValueId| {
                        def(*v, s).and_then(|k| match (&r.ops[k].kind, &r.ops[k].operands[..]) {
                            (OpKind::Broadcast, [x]) => Some(*x),
                            _ => None,
                        })
                    };
                    let (iota_first, x) = match (is_iota(p), is_iota(q)) {
                        (true, false) => (true, bcast_of(q)),
                        (false, true) => (false, bcast_of(p)),
                        _ => continue,
                    };
                    if let Some(x) = x.filter(|x| ready(*x) && ready(*y)) {
                        found = Some(LiveColumns {
                            cmp: *cmp,
                            iota_first,
                            x,
                            y: *y,
                            select: s,
                        });
                    }
                }
                _ => {}
            }
        }
        out[i] = found;
    }
    out
}

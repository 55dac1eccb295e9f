//! Loops whose iterations are independent, so the executor may run them on several threads
//! (`machine/split.rs`): a `for` with no carried values whose body starts no copy and touches no
//! semaphore, and where every ref the body writes is only read and written, in the body, through
//! windows that take a single index along one dimension — the loop's induction variable itself. Two
//! iterations then touch disjoint parts of every ref either writes, and read nothing the other
//! writes: any order of the iterations, or any overlap of them, leaves the same bits.
//!
//! This is the shape of a kernel's loop over heads (`for h in 0..kv_heads` reading and writing
//! `stats.at((0, h, ..))`, `acc.at((h, ..))`), which is most of a decode's work.

use crate::ir::{Func, Op, OpKind, Region, Start, ValueId, Window};
use std::collections::{HashMap, HashSet};

/// A loop the executor may split across threads: the refs its body writes, each with the dimension
/// its windows index by the induction variable, and the values the body uses from outside it.
#[derive(Clone, Debug)]
pub(crate) struct SplitLoop {
    pub(crate) written: Vec<(ValueId, usize)>,
    pub(crate) free: Vec<ValueId>,
}

/// Which ref each view value is a view of (`RefView`, `RefBitcast`, `RefReshape`), over the function.
pub(super) fn view_bases(f: &Func) -> HashMap<ValueId, ValueId> {
    let mut bases = HashMap::new();
    f.walk(&mut |op| {
        if matches!(
            op.kind,
            OpKind::RefView(_) | OpKind::RefBitcast | OpKind::RefReshape
        ) {
            if let (Some(r), Some(base)) = (op.results.first(), op.operands.first()) {
                bases.insert(*r, *base);
            }
        }
    });
    bases
}

fn root(bases: &HashMap<ValueId, ValueId>, mut v: ValueId) -> ValueId {
    while let Some(b) = bases.get(&v) {
        v = *b;
    }
    v
}

/// One ref access in a loop body: the ref operand, and for a load or store its window and dynamic
/// start operands (a view op has neither: it is an access the rule refuses on a written ref).
struct Access<'a> {
    r: ValueId,
    window: Option<(&'a Window, &'a [ValueId])>,
    store: bool,
}

/// The split of `op`, if it is a `for` loop whose iterations are independent (see the module docs).
pub(super) fn split_loop(op: &Op, bases: &HashMap<ValueId, ValueId>) -> Option<SplitLoop> {
    if !matches!(op.kind, OpKind::For) || op.operands.len() != 3 || !op.results.is_empty() {
        return None;
    }
    let body = op.regions.first()?;
    let [iv] = body.args[..] else { return None };
    let mut accesses = Vec::new();
    let mut defined = HashSet::new();
    let mut used = Vec::new();
    if !collect(body, &mut accesses, &mut defined, &mut used) {
        return None;
    }
    let written: HashSet<ValueId> = accesses
        .iter()
        .filter(|a| a.store)
        .map(|a| root(bases, a.r))
        .collect();
    if written.is_empty() {
        return None; // nothing to split: a loop that writes no ref computes nothing it keeps
    }
    let mut dims: HashMap<ValueId, Vec<usize>> = HashMap::new();
    for a in &accesses {
        let r = root(bases, a.r);
        if !written.contains(&r) {
            continue;
        }
        // A written ref is touched only directly (no view of it), at the induction variable.
        let (w, dynamic) = a.window.filter(|_| a.r == r)?;
        let at_iv = iv_dims(w, dynamic, iv);
        let d = dims.entry(r).or_insert_with(|| at_iv.clone());
        d.retain(|x| at_iv.contains(x));
        if d.is_empty() {
            return None;
        }
    }
    let mut written: Vec<(ValueId, usize)> = dims.into_iter().map(|(r, d)| (r, d[0])).collect();
    written.sort_by_key(|(r, _)| r.0);
    let mut free: Vec<ValueId> = used.into_iter().filter(|v| !defined.contains(v)).collect();
    free.sort_by_key(|v| v.0);
    free.dedup();
    Some(SplitLoop { written, free })
}

/// The dimensions of `w` indexed by the single element at `iv` (a dynamic start that is `iv` itself).
fn iv_dims(w: &Window, dynamic: &[ValueId], iv: ValueId) -> Vec<usize> {
    let mut next = 0;
    let mut out = Vec::new();
    for (d, s) in w.starts.iter().enumerate() {
        if let Start::Dynamic = s {
            let v = dynamic.get(next).copied();
            next += 1;
            if v == Some(iv) && w.sizes[d] == 1 && !w.dynamic_sizes[d] {
                out.push(d);
            }
        }
    }
    out
}

/// Walk a loop body: its ref accesses, the values it defines and uses. False when it holds an op
/// that orders iterations (a copy, a semaphore, a scope's allocation, a trace region).
fn collect<'a>(
    r: &'a Region,
    accesses: &mut Vec<Access<'a>>,
    defined: &mut HashSet<ValueId>,
    used: &mut Vec<ValueId>,
) -> bool {
    defined.extend(r.args.iter().copied());
    for op in &r.ops {
        defined.extend(op.results.iter().copied());
        used.extend(op.operands.iter().copied());
        match &op.kind {
            OpKind::DmaStart
            | OpKind::DmaWait
            | OpKind::SemSignal
            | OpKind::SemWait
            | OpKind::SemRead
            | OpKind::RemoteDmaStart
            | OpKind::RemoteDmaWait { .. }
            | OpKind::SemSignalRemote
            | OpKind::BarrierSemaphore
            | OpKind::Scoped
            | OpKind::TraceStart(_)
            | OpKind::TraceStop => return false,
            OpKind::Load(w) | OpKind::Store { window: w, .. } => {
                let store = matches!(op.kind, OpKind::Store { .. });
                let first = if store { 2 } else { 1 };
                let (Some(&r), Some(dynamic)) = (
                    op.operands.first(),
                    op.operands.get(first..first + w.n_dynamic()),
                ) else {
                    return false;
                };
                accesses.push(Access {
                    r,
                    window: Some((w, dynamic)),
                    store,
                });
            }
            OpKind::RefView(_) | OpKind::RefBitcast | OpKind::RefReshape => {
                let Some(&r) = op.operands.first() else {
                    return false;
                };
                accesses.push(Access {
                    r,
                    window: None,
                    store: false,
                });
            }
            _ => {}
        }
        for g in &op.regions {
            if !collect(g, accesses, defined, used) {
                return false;
            }
        }
    }
    true
}

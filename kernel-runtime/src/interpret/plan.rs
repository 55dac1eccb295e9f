//! The interpreter's execution plan of a function: what the executor (`machine.rs`) does differently
//! from running op by op, decided once per kernel and printable (`--emit plan`), so every fast path is
//! observable and a test can assert that it fires.
//!
//! Per region, per op: which values die after it (liveness), whether it is folded into a fused
//! elementwise chain ([`super::fused`]) that runs at a later op (with an optional last-axis reduction
//! epilogue and deferred widening casts), whether its result is sunk straight into the output block of
//! the ref its only use stores to, and whether a `dot` accumulates in place into its ref.

use super::fused::{self, Epilogue, Link};
use crate::dtype::DType;
use crate::ir::{Func, Op, OpKind, Region, ValueId};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// Per region: which values die after each op (uses inside nested regions count at the parent op), and
/// which elementwise ops only feed a full store into a ref (`sink_to`: that ref), so they may write
/// straight into the output block.
pub(crate) struct Plan {
    pub(crate) dead_after: Vec<Vec<ValueId>>,
    pub(crate) sink_to: Vec<Option<ValueId>>,
    /// Ops folded into a fused chain that runs at a later op.
    pub(crate) skip: Vec<bool>,
    /// Fused chains, at the op that ends them.
    pub(crate) chain: Vec<Option<Chain>>,
    /// `dot`s whose accumulator is a full load of a ref used only by the dot, and whose result is only
    /// stored whole into that same ref with no use of the ref in between: the ref (may accumulate in
    /// place into the ref's buffer).
    pub(crate) acc_in_place: Vec<Option<ValueId>>,
    /// `dot`s whose accumulator operand dies at them (and is not one of their factors): its buffer,
    /// when nothing else holds it, may become the result instead of being copied.
    pub(crate) acc_owned: Vec<bool>,
    pub(crate) sub: Vec<Vec<Plan>>,
}

/// A fused elementwise chain (see [`super::fused`]): the input value, the links, their external operands.
pub(crate) struct Chain {
    pub(crate) first: ValueId,
    pub(crate) links: Vec<Link>,
    pub(crate) exts: Vec<ValueId>,
    /// A last-axis reduction of the chain's value computed in the same pass: the epilogue, the
    /// reduction's result value, and whether the value itself is still needed.
    pub(crate) reduce: Option<(Epilogue, ValueId, bool)>,
}

/// The link an op would be in a fused chain fed by `prev` (its single float-to-float operand).
fn as_link(f: &Func, op: &Op, prev: ValueId) -> Option<(Link, Option<ValueId>)> {
    let [res] = op.results[..] else { return None };
    let d = f.ty(res).dtype();
    if !d.is_float() || op.operands.iter().any(|v| !f.ty(*v).dtype().is_float()) {
        return None;
    }
    match (&op.kind, &op.operands[..]) {
        (OpKind::Unary(u), [a]) if *a == prev && fused::supported_unary(*u) => {
            Some((Link::Unary(*u, d), None))
        }
        (OpKind::Cast(to), [a]) if *a == prev => Some((Link::Cast(*to), None)),
        (OpKind::Binary(b), [x, y])
            if fused::supported_binary(*b) && (*x == prev) != (*y == prev) =>
        {
            let lhs = *x == prev;
            Some((Link::Binary(*b, lhs, d), Some(if lhs { *y } else { *x })))
        }
        _ => None,
    }
}

/// Find fused chains in a region: each member's result has exactly one use, the next member.
/// Whether `op` can be the first link of a fused chain (a float unary/binary/cast on float operands).
fn can_start(f: &Func, op: &Op) -> bool {
    let float = |v: &ValueId| f.ty(*v).dtype().is_float();
    op.results.len() == 1
        && float(&op.results[0])
        && match (&op.kind, &op.operands[..]) {
            (OpKind::Unary(u), [a]) => fused::supported_unary(*u) && float(a),
            (OpKind::Cast(_), [a]) => float(a),
            (OpKind::Binary(b), [x, y]) => fused::supported_binary(*b) && float(x) && float(y),
            _ => false,
        }
}

/// Returns which ops are folded away, the chains (at their last op), and where each op runs.
fn find_chains(
    f: &Func,
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
) -> (Vec<bool>, Vec<Option<Chain>>, Vec<usize>) {
    let n = r.ops.len();
    let mut exec_at: Vec<usize> = (0..n).collect();
    let (mut skip, mut chain) = (vec![false; n], (0..n).map(|_| None).collect::<Vec<_>>());
    // next[i] = the op that uses op i's result, when op i can feed a chain link there.
    let mut next: Vec<Option<usize>> = vec![None; n];
    let mut has_prev = vec![false; n];
    for (i, op) in r.ops.iter().enumerate() {
        let [v] = op.results[..] else { continue };
        if all_uses.get(&v) != Some(&1) || !f.ty(v).dtype().is_float() {
            continue;
        }
        let starts = can_start(f, op);
        if !starts {
            continue;
        }
        if let Some(j) = (i + 1..n).find(|&j| r.ops[j].operands.contains(&v)) {
            // One predecessor per member: a second one stays a materialized external operand.
            if !has_prev[j] && as_link(f, &r.ops[j], v).is_some() {
                next[i] = Some(j);
                has_prev[j] = true;
            }
        }
    }
    for start in 0..n {
        // A chain starts at an op no link feeds; a lone op qualifies when a reduction can fold in.
        if has_prev[start]
            || !can_start(f, &r.ops[start])
            || (next[start].is_none() && epilogue(f, r, start, all_uses).is_none())
        {
            continue;
        }
        let op = &r.ops[start];
        let (first, mut links, mut exts) = match (&op.kind, &op.operands[..]) {
            (OpKind::Binary(b), [x, y]) => (
                *x,
                vec![Link::Binary(*b, true, f.ty(op.results[0]).dtype())],
                vec![*y],
            ),
            (OpKind::Unary(u), [a]) => (
                *a,
                vec![Link::Unary(*u, f.ty(op.results[0]).dtype())],
                vec![],
            ),
            (OpKind::Cast(to), [a]) => (*a, vec![Link::Cast(*to)], vec![]),
            _ => continue,
        };
        let mut members = vec![start];
        let mut cur = start;
        while let Some(j) = next[cur] {
            let Some((link, ext)) = as_link(f, &r.ops[j], r.ops[cur].results[0]) else {
                break;
            };
            links.push(link);
            exts.extend(ext);
            members.push(j);
            cur = j;
        }
        for &m in &members {
            skip[m] = m != cur;
            exec_at[m] = cur;
        }
        let reduce = epilogue(f, r, cur, all_uses).map(|(j, epi, res, store)| {
            skip[j] = true;
            exec_at[j] = cur;
            (epi, res, store)
        });
        chain[cur] = Some(Chain {
            first,
            links,
            exts,
            reduce,
        });
    }
    (skip, chain, exec_at)
}

/// A float reduction over the last axis of op `i`'s result, later in the region: its index, the
/// epilogue, its result, and whether op `i`'s value has other uses (and so must still be stored).
fn epilogue(
    f: &Func,
    r: &Region,
    i: usize,
    all_uses: &HashMap<ValueId, usize>,
) -> Option<(usize, Epilogue, ValueId, bool)> {
    let [v] = r.ops[i].results[..] else {
        return None;
    };
    let ty = f.ty(v);
    let rank = ty.shape().len();
    if !ty.dtype().is_float() || rank == 0 || ty.shape()[rank - 1] < 2 {
        return None;
    }
    let j = (i + 1..r.ops.len()).find(|&j| r.ops[j].operands.contains(&v))?;
    let op = &r.ops[j];
    match (&op.kind, &op.operands[..], &op.results[..]) {
        (OpKind::Reduce { kind, axes, .. }, [a], [res]) if *a == v && axes[..] == [rank - 1] => {
            let rt = f.ty(*res);
            let epi = Epilogue {
                kind: *kind,
                shape: rt.shape().to_vec(),
                dtype: rt.dtype(),
            };
            Some((j, epi, *res, all_uses.get(&v).copied().unwrap_or(0) > 1))
        }
        _ => None,
    }
}

/// A bf16 → f32 or i32 → f32 cast whose every use is an operand read by fused chains is not
/// materialized: the chains read the cast's operand and convert it as they go (as the cast does: bf16
/// exactly, i32 with its one rounding, so the bits are those of the cast's result). The cast's operand
/// then lives until the last of those chains has run.
fn defer_widening_casts(
    f: &Func,
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
    skip: &mut [bool],
    chain: &mut [Option<Chain>],
    exec_at: &mut [usize],
) {
    for (i, op) in r.ops.iter().enumerate() {
        let (OpKind::Cast(DType::F32), [u], [v]) = (&op.kind, &op.operands[..], &op.results[..])
        else {
            continue;
        };
        if skip[i] || chain[i].is_some() || !matches!(f.ty(*u).dtype(), DType::BF16 | DType::I32) {
            continue;
        }
        let reads =
            |ch: &Chain| usize::from(ch.first == *v) + ch.exts.iter().filter(|e| *e == v).count();
        let (mut n, mut last) = (0, i);
        for (j, ch) in chain.iter().enumerate() {
            if let Some(ch) = ch {
                let k = reads(ch);
                if k > 0 {
                    n += k;
                    last = last.max(j);
                }
            }
        }
        if n == 0 || all_uses.get(v) != Some(&n) {
            continue;
        }
        for ch in chain.iter_mut().flatten() {
            if ch.first == *v {
                ch.first = *u;
            }
            for e in ch.exts.iter_mut().filter(|e| **e == *v) {
                *e = *u;
            }
        }
        skip[i] = true;
        exec_at[i] = last;
    }
}

fn deep_uses(op: &Op, out: &mut Vec<ValueId>) {
    out.extend_from_slice(&op.operands);
    for r in &op.regions {
        for o in &r.ops {
            deep_uses(o, out);
        }
    }
}

pub(crate) fn plan(f: &Func, fuse: bool) -> Plan {
    let mut uses: HashMap<ValueId, usize> = HashMap::new();
    f.walk(&mut |op| {
        for v in &op.operands {
            *uses.entry(*v).or_insert(0) += 1;
        }
    });
    plan_region(f, &f.body, &uses, fuse)
}

fn plan_region(f: &Func, r: &Region, all_uses: &HashMap<ValueId, usize>, fuse: bool) -> Plan {
    let (skip, chain, exec_at) = if fuse {
        let (mut skip, mut chain, mut exec_at) = find_chains(f, r, all_uses);
        defer_widening_casts(f, r, all_uses, &mut skip, &mut chain, &mut exec_at);
        (skip, chain, exec_at)
    } else {
        (
            vec![false; r.ops.len()],
            r.ops.iter().map(|_| None).collect(),
            (0..r.ops.len()).collect(),
        )
    };
    let mut defined: HashSet<ValueId> = r.args.iter().copied().collect();
    for op in &r.ops {
        defined.extend(op.results.iter().copied());
    }
    // Last use of each value defined here, at the position where the using op actually runs.
    let mut last: HashMap<ValueId, usize> = HashMap::new();
    let mut uses = Vec::new();
    for (i, op) in r.ops.iter().enumerate() {
        uses.clear();
        deep_uses(op, &mut uses);
        for v in &uses {
            if defined.contains(v) {
                let at = last.entry(*v).or_insert(exec_at[i]);
                *at = (*at).max(exec_at[i]);
            }
        }
    }
    let mut dead_after = vec![Vec::new(); r.ops.len()];
    for (v, i) in &last {
        dead_after[*i].push(*v);
    }
    for (i, op) in r.ops.iter().enumerate() {
        dead_after[exec_at[i]].extend(op.results.iter().filter(|v| !last.contains_key(v)));
    }
    let mut sink_to = vec![None; r.ops.len()];
    for (i, op) in r.ops.iter().enumerate() {
        let elementwise = op.kind.is_elementwise();
        let [v] = op.results[..] else { continue };
        if !fuse || !elementwise || all_uses.get(&v) != Some(&1) {
            continue;
        }
        let store = r.ops[i + 1..].iter().find(|o| o.operands.contains(&v));
        if let Some(Op {
            kind:
                OpKind::Store {
                    window,
                    masked: false,
                },
            operands,
            ..
        }) = store
        {
            if operands.get(1) == Some(&v) && window.is_full(f.ty(operands[0]).shape()) {
                sink_to[i] = Some(operands[0]);
            }
        }
    }
    let acc_in_place = r
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            if !fuse {
                return None;
            }
            acc_in_place_ref(f, r, i, op, all_uses)
        })
        .collect::<Vec<_>>();
    let acc_owned = r
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| fuse && acc_in_place[i].is_none() && acc_dies_at(op, &dead_after[i]))
        .collect();
    let sub = r
        .ops
        .iter()
        .map(|op| {
            op.regions
                .iter()
                .map(|reg| plan_region(f, reg, all_uses, fuse))
                .collect()
        })
        .collect();
    Plan {
        dead_after,
        sink_to,
        skip,
        chain,
        acc_in_place,
        acc_owned,
        sub,
    }
}

/// Whether `op` is a `dot` whose accumulator operand dies at it (`dead` lists the values freed after
/// the op) and is not also one of its factors.
fn acc_dies_at(op: &Op, dead: &[ValueId]) -> bool {
    matches!(
        (&op.kind, &op.operands[..]),
        (OpKind::Dot { .. }, [l, r, acc]) if l != acc && r != acc && dead.contains(acc)
    )
}

/// The ref a `dot` (op `i`) may accumulate into in place: its accumulator is a full, single-use load of
/// the ref in this region, and its result's single use is a full unmasked store into the same ref, with
/// no other use of the ref between the dot and the store.
fn acc_in_place_ref(
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
    if !w.is_full(f.ty(rf).shape()) {
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

impl Plan {
    /// The plan, one line per op that is not run as written (plus a summary), indented by region.
    pub(crate) fn describe(&self, f: &Func) -> String {
        let mut out = String::new();
        self.describe_region(&f.body, 0, &mut out);
        out
    }

    fn describe_region(&self, r: &Region, depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        for (i, op) in r.ops.iter().enumerate() {
            let at = format!("{pad}op {i} ({})", crate::ir::op_label(&op.kind));
            if self.skip[i] {
                let _ = writeln!(out, "{at}: folded into a fused chain");
            }
            if let Some(ch) = &self.chain[i] {
                let links: Vec<String> = ch.links.iter().map(link_label).collect();
                let _ = write!(
                    out,
                    "{at}: fused chain from %{} [{}]",
                    ch.first.0,
                    links.join(" -> ")
                );
                if let Some((e, v, keep)) = &ch.reduce {
                    let _ = write!(
                        out,
                        ", {:?} epilogue over the last axis -> %{}{}",
                        e.kind,
                        v.0,
                        if *keep { "" } else { " (value not kept)" }
                    );
                }
                out.push('\n');
            }
            if let Some(rf) = self.sink_to[i] {
                let _ = writeln!(
                    out,
                    "{at}: result sunk into the output block of ref %{}",
                    rf.0
                );
            }
            if let Some(rf) = self.acc_in_place[i] {
                let _ = writeln!(out, "{at}: dot accumulates in place into ref %{}", rf.0);
            }
            if self.acc_owned[i] {
                let _ = writeln!(
                    out,
                    "{at}: dot accumulates into its accumulator's buffer (its last use)"
                );
            }
            for (k, (sub, region)) in self.sub[i].iter().zip(&op.regions).enumerate() {
                let mut inner = String::new();
                sub.describe_region(region, depth + 1, &mut inner);
                if !inner.is_empty() {
                    let _ = writeln!(out, "{at}: region {k}");
                    out.push_str(&inner);
                }
            }
        }
    }

    /// Counts of what fires, over the whole function: (fused chains, ops folded, reduction epilogues,
    /// sunk results, in-place dots).
    pub(crate) fn counts(&self) -> PlanCounts {
        let mut c = PlanCounts::default();
        self.count(&mut c);
        c
    }

    fn count(&self, c: &mut PlanCounts) {
        c.chains += self.chain.iter().flatten().count();
        c.folded += self.skip.iter().filter(|s| **s).count();
        c.epilogues += self
            .chain
            .iter()
            .flatten()
            .filter(|ch| ch.reduce.is_some())
            .count();
        c.sunk += self.sink_to.iter().flatten().count();
        c.in_place_dots += self.acc_in_place.iter().flatten().count();
        for subs in &self.sub {
            for s in subs {
                s.count(c);
            }
        }
    }
}

/// What a plan makes fire, summed over the function (`interpret::plan_counts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCounts {
    /// The grid runs in larger row bands than written (see `coalesce`).
    pub row_bands: bool,
    /// Grid axes split into chunks run in parallel.
    pub parallel_axes: usize,
    pub chains: usize,
    pub folded: usize,
    pub epilogues: usize,
    pub sunk: usize,
    pub in_place_dots: usize,
}

fn link_label(l: &Link) -> String {
    match l {
        Link::Unary(u, d) => format!("{}:{}", u.name(), dtype_label(*d)),
        Link::Binary(b, lhs, d) => format!(
            "{}{}:{}",
            b.name(),
            if *lhs { "" } else { "(rev)" },
            dtype_label(*d)
        ),
        Link::Cast(d) => format!("cast:{}", dtype_label(*d)),
    }
}

fn dtype_label(d: DType) -> String {
    d.to_string()
}

//! The interpreter's execution plan of a function: what the executor (`machine.rs`) does differently
//! from running op by op, decided once per kernel and printable (`--emit plan`), so every fast path is
//! observable and a test can assert that it fires.
//!
//! Per region, per op: which values die after it (liveness), whether it is folded into a fused
//! elementwise chain ([`super::fused`]) that runs at a later op (with an optional last-axis reduction
//! epilogue and deferred widening casts), whether its result is sunk straight into the output block of
//! the ref its only use stores to, whether a bf16 cast of a packed word's half runs as one pass, and
//! whether a `dot` accumulates in place into its ref.

//!
//! Each decision is a pass of its own, in this folder: [`fusion`] (fused chains, reduction epilogues,
//! deferred widening casts), [`dots`] (in-place and owned-accumulator dots), the sinks and liveness
//! here, and [`describe`] (the printed plan and its counts). `super::coalesce` decides, per kernel,
//! whether the grid runs over row bands instead of blocks. Every pass is off with `fuse: false` (the
//! plain path), and every fast path gives the plain path's bits (tested bit for bit).

mod describe;
mod dots;
mod fusion;
mod split;

use super::fused::{Epilogue, Link};
use crate::ir::{Func, Op, OpKind, Region, ValueId};
pub use describe::PlanCounts;
pub(crate) use dots::LiveColumns;
use dots::{acc_dies_at, acc_in_place_ref};
use fusion::{defer_widening_casts, find_chains, word_halves};
pub(crate) use fusion::{HalfCast, WordHalf};
pub(crate) use split::SplitLoop;
use std::collections::{HashMap, HashSet};

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
    /// bf16 casts of a packed word's half (`fusion::word_halves`): the word operand and which half,
    /// at the cast (its `shl`/`and` and `bitcast` are skipped).
    pub(crate) word_half: Vec<Option<(ValueId, WordHalf)>>,
    /// `load`s of 32-bit words used only by word-half casts (`fusion::load_halves`): the casts, run
    /// at the load (the casts are skipped).
    pub(crate) load_halves: Vec<Option<Vec<HalfCast>>>,
    /// `dot`s whose accumulator is a full load of a ref used only by the dot, and whose result is only
    /// stored whole into that same ref with no use of the ref in between: the ref (may accumulate in
    /// place into the ref's buffer).
    pub(crate) acc_in_place: Vec<Option<ValueId>>,
    /// `dot`s whose right factor is a `select` used only by them (`dots::select_rhs`): the select's
    /// index; it runs at the dot (skipped where it stands), inside the product where it can.
    pub(crate) select_rhs: Vec<Option<usize>>,
    /// `dot`s whose result only a `select` reads, in the columns its condition picks it
    /// (`dots::live_columns`): how to tell them; the others are not computed.
    pub(crate) live_columns: Vec<Option<LiveColumns>>,
    /// `dot`s whose accumulator operand dies at them (and is not one of their factors): its buffer,
    /// when nothing else holds it, may become the result instead of being copied.
    pub(crate) acc_owned: Vec<bool>,
    /// Value bitcasts whose operand dies at them: its buffer, when nothing else holds it, may become
    /// the result (same width: the same bytes) instead of being copied.
    pub(crate) bitcast_owned: Vec<bool>,
    /// `for` loops whose iterations are independent (see [`split`]): they may run on several threads.
    pub(crate) split: Vec<Option<SplitLoop>>,
    /// Constants, binary ops and comparisons of rank 0 (index arithmetic, loop bounds, page numbers):
    /// run straight from the region loop (`machine/scalars.rs`), not through the general dispatch.
    pub(crate) scalar: Vec<bool>,
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

pub(super) fn deep_uses(op: &Op, out: &mut Vec<ValueId>) {
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
    let bases = split::view_bases(f);
    let cx = Context {
        all_uses: &uses,
        bases: &bases,
        fuse,
    };
    plan_region(f, &f.body, &cx)
}

/// What every region's plan is made from: the function's use counts and view bases, and whether the
/// fast paths are on.
struct Context<'a> {
    all_uses: &'a HashMap<ValueId, usize>,
    bases: &'a HashMap<ValueId, ValueId>,
    fuse: bool,
}

fn plan_region(f: &Func, r: &Region, cx: &Context<'_>) -> Plan {
    let (all_uses, fuse) = (cx.all_uses, cx.fuse);
    let sink_to = sinks(f, r, all_uses, fuse);
    let (skip, chain, exec_at, word_half, load_halves, select_rhs) = if fuse {
        let (mut skip, mut chain, mut exec_at) = find_chains(f, r, all_uses);
        defer_widening_casts(f, r, all_uses, &mut skip, &mut chain, &mut exec_at);
        let halves = word_halves(f, r, all_uses, (&mut skip, &chain, &sink_to), &mut exec_at);
        let loads = fusion::load_halves(
            r,
            all_uses,
            &halves,
            (&mut skip, &chain, &sink_to),
            &mut exec_at,
        );
        // Ops another pass runs differently: a select among them stays where it is.
        let taken: Vec<bool> = (0..r.ops.len())
            .map(|i| chain[i].is_some() || sink_to[i].is_some() || halves[i].is_some())
            .collect();
        let selects = dots::select_rhs(r, all_uses, (&mut skip, &taken), &mut exec_at);
        (skip, chain, exec_at, halves, loads, selects)
    } else {
        (
            vec![false; r.ops.len()],
            r.ops.iter().map(|_| None).collect(),
            (0..r.ops.len()).collect(),
            vec![None; r.ops.len()],
            vec![None; r.ops.len()],
            vec![None; r.ops.len()],
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
    let live_columns = match fuse {
        true => dots::live_columns(f, r, all_uses),
        false => vec![None; r.ops.len()],
    };
    let acc_owned = r
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| fuse && acc_in_place[i].is_none() && acc_dies_at(op, &dead_after[i]))
        .collect();
    let bitcast_owned = r
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            fuse && matches!(op.kind, OpKind::Bitcast)
                && op.operands.len() == 1
                && dead_after[i].contains(&op.operands[0])
        })
        .collect();
    let sub = r
        .ops
        .iter()
        .map(|op| {
            op.regions
                .iter()
                .map(|reg| plan_region(f, reg, cx))
                .collect()
        })
        .collect();
    let split = r
        .ops
        .iter()
        .map(|op| fuse.then(|| split::split_loop(op, cx.bases)).flatten())
        .collect();
    let scalar = r
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let rank0 = matches!(op.results[..], [v] if f.ty(v).shape().is_empty());
            let kind = matches!(
                op.kind,
                OpKind::Const(_) | OpKind::Binary(_) | OpKind::Compare(_)
            );
            fuse && rank0 && kind && !skip[i] && chain[i].is_none() && sink_to[i].is_none()
        })
        .collect();
    Plan {
        dead_after,
        sink_to,
        skip,
        chain,
        word_half,
        load_halves,
        acc_in_place,
        select_rhs,
        live_columns,
        acc_owned,
        bitcast_owned,
        split,
        scalar,
        sub,
    }
}

/// Elementwise ops whose result's only use is a full unmasked store into a ref: that ref (the result
/// may be written straight into the output block).
fn sinks(
    f: &Func,
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
    fuse: bool,
) -> Vec<Option<ValueId>> {
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
            if operands.get(1) == Some(&v)
                && window.is_full(f.ty(operands[0]).shape())
                && plain_ref(f, operands[0])
            {
                sink_to[i] = Some(operands[0]);
            }
        }
    }
    sink_to
}

/// Whether `r` is a ref of its own (not a window taken as a ref) in a body that takes no bitcast or
/// reshape view of any ref: what the direct-write paths (sunk stores, in-place dots) need, since they
/// address the ref's own buffer and a view could reach it under another name.
pub(super) fn plain_ref(f: &Func, r: ValueId) -> bool {
    fn views(reg: &Region, r: ValueId) -> bool {
        reg.ops.iter().any(|op| {
            matches!(op.kind, OpKind::RefBitcast | OpKind::RefReshape)
                || (matches!(op.kind, OpKind::RefView(_)) && op.results.contains(&r))
                || op.regions.iter().any(|g| views(g, r))
        })
    }
    !views(&f.body, r)
}

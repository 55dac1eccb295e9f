//! The fusion pass: elementwise chains (a value through unary/binary/cast links, each link's other
//! operand external) that run in one pass at the op that ends them, with an optional last-axis
//! reduction epilogue and widening casts deferred into their consumer; and the bf16 halves of packed
//! 32-bit words (`shl`/`and`, `bitcast`, `cast`) as one pass at the cast ([`word_halves`]).

use super::super::fused::{self, Epilogue, Link};
use super::Chain;
use crate::dtype::DType;
use crate::ir::{BinaryOp, Func, Op, OpKind, Region, ValueId};
use std::collections::HashMap;

/// The dtypes a fused chain computes in (f32, rounding bf16 at each link): the arithmetic floats of
/// the dtype table. The storage floats (f16, 8-bit) stay out: their casts run unfused.
fn fuses(d: DType) -> bool {
    matches!(d, DType::F32 | DType::BF16)
}

/// The link an op would be in a fused chain fed by `prev` (its single float-to-float operand).
pub(super) fn as_link(f: &Func, op: &Op, prev: ValueId) -> Option<(Link, Option<ValueId>)> {
    let [res] = op.results[..] else { return None };
    let d = f.ty(res).dtype();
    if !fuses(d) || op.operands.iter().any(|v| !fuses(f.ty(*v).dtype())) {
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
pub(super) fn can_start(f: &Func, op: &Op) -> bool {
    let float = |v: &ValueId| fuses(f.ty(*v).dtype());
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
pub(super) fn find_chains(
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
        if all_uses.get(&v) != Some(&1) || !fuses(f.ty(v).dtype()) {
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
pub(super) fn epilogue(
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
    if !fuses(ty.dtype()) || rank == 0 || ty.shape()[rank - 1] < 2 {
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
pub(super) fn defer_widening_casts(
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

/// Which half of a 32-bit word a word-half cast reads (see [`word_halves`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WordHalf {
    /// `w << 16`: the low 16 bits as the high half of an f32.
    Low,
    /// `w & 0xFFFF_0000`: the high 16 bits, in place.
    High,
}

impl WordHalf {
    /// The f32 bits the unfused `shl` or `and` gives the `bitcast` (16 < 32: no shift overflow).
    #[inline(always)]
    pub(crate) fn f32_bits(self, w: u32) -> u32 {
        match self {
            WordHalf::Low => w << 16,
            WordHalf::High => w & 0xFFFF_0000,
        }
    }

    /// Where this half sits in its word: the shift of its lowest bit.
    #[inline(always)]
    pub(crate) fn shift(self) -> u32 {
        match self {
            WordHalf::Low => 0,
            WordHalf::High => 16,
        }
    }

    /// The word-half cast of word `w`: `cast<bf16>(bitcast<f32>(half(w)))`, rounded by the cast's own
    /// `bf16_from_f32` (the definition both the word-half pass and the halves load compute).
    #[inline(always)]
    pub(crate) fn to_bf16(self, w: u32) -> half::bf16 {
        crate::interpret::tensor::bf16_from_f32(f32::from_bits(self.f32_bits(w)))
    }
}

/// `cast<bf16>(bitcast<f32>(w << 16))` and `cast<bf16>(bitcast<f32>(w & 0xFFFF0000))` of u32 words
/// `w` — a bf16 unpacked from a packed 32-bit word, as kernels read packed key/value caches (and as
/// Mosaic wants it written) — run as one pass at the cast: the `shl`/`and` and the `bitcast` are
/// skipped and `w` lives until the cast. Only where each intermediate has that one use, no op of the
/// three is in a fused chain, and the cast's result is not sunk into a ref. The pass computes
/// `cast(bitcast(half(w)))` per element with the cast's own rounding, so the bits are the unfused ops'.
pub(super) fn word_halves(
    f: &Func,
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
    (skip, chain, sink_to): (&mut [bool], &[Option<Chain>], &[Option<ValueId>]),
    exec_at: &mut [usize],
) -> Vec<Option<(ValueId, WordHalf)>> {
    let mut out = vec![None; r.ops.len()];
    let mut def: HashMap<ValueId, usize> = HashMap::new();
    for (i, op) in r.ops.iter().enumerate() {
        for v in &op.results {
            def.insert(*v, i);
        }
    }
    let free = |i: usize, skip: &[bool]| !skip[i] && chain[i].is_none() && sink_to[i].is_none();
    let one_use = |v: &ValueId| all_uses.get(v) == Some(&1);
    let const_u32 = |v: &ValueId| match def.get(v).map(|&k| &r.ops[k].kind) {
        Some(OpKind::Const(lit)) if lit.dtype == DType::U32 => Some(lit.bits),
        _ => None,
    };
    for (i, op) in r.ops.iter().enumerate() {
        let (OpKind::Cast(DType::BF16), [b]) = (&op.kind, &op.operands[..]) else {
            continue;
        };
        let Some(&j) = def.get(b) else { continue };
        let (OpKind::Bitcast, [s]) = (&r.ops[j].kind, &r.ops[j].operands[..]) else {
            continue;
        };
        let Some(&k) = def.get(s) else { continue };
        let (OpKind::Binary(bin), [w, c]) = (&r.ops[k].kind, &r.ops[k].operands[..]) else {
            continue;
        };
        let half = match (bin, const_u32(c)) {
            (BinaryOp::Shl, Some(16)) => WordHalf::Low,
            (BinaryOp::And, Some(0xFFFF_0000)) => WordHalf::High,
            _ => continue,
        };
        if f.ty(*b).dtype() != DType::F32
            || f.ty(*w).dtype() != DType::U32
            || !one_use(b)
            || !one_use(s)
            || ![i, j, k].iter().all(|&n| free(n, skip))
        {
            continue;
        }
        skip[j] = true;
        skip[k] = true;
        exec_at[j] = i;
        exec_at[k] = i;
        out[i] = Some((*w, half));
    }
    out
}

/// A `load` whose 32-bit words are used only by [`word_halves`] casts (a packed key/value cache's
/// words, split into the keys and the values): the casts run at the load, which reads each half
/// straight from the ref's 16-bit rows into its bf16 array (`Machine::load_halves`) instead of
/// assembling the words and splitting them again. Only where the load itself is not folded into a
/// chain or sunk. The casts' results are what the word-half pass gives, so the bits are the unfused
/// ops'. Returns, at each such load, its casts.
pub(super) fn load_halves(
    r: &Region,
    all_uses: &HashMap<ValueId, usize>,
    word_half: &[Option<(ValueId, WordHalf)>],
    (skip, chain, sink_to): (&mut [bool], &[Option<Chain>], &[Option<ValueId>]),
    exec_at: &mut [usize],
) -> Vec<Option<Vec<HalfCast>>> {
    let mut out = vec![None; r.ops.len()];
    let mut casts: HashMap<ValueId, Vec<(usize, WordHalf)>> = HashMap::new();
    for (j, h) in word_half.iter().enumerate() {
        if let Some((w, half)) = h {
            casts.entry(*w).or_default().push((j, *half));
        }
    }
    for (i, op) in r.ops.iter().enumerate() {
        let (OpKind::Load(_), [w]) = (&op.kind, &op.results[..]) else {
            continue;
        };
        let Some(list) = casts.get(w) else { continue };
        if all_uses.get(w) != Some(&list.len())
            || skip[i]
            || chain[i].is_some()
            || sink_to[i].is_some()
            || list.iter().any(|&(j, _)| j <= i)
        {
            continue;
        }
        for &(j, _) in list {
            // The cast and the `shl`/`and` and `bitcast` it runs for, now at the load.
            for at in exec_at.iter_mut().filter(|at| **at == j) {
                *at = i;
            }
            skip[j] = true;
        }
        let cast = |&(j, half): &(usize, WordHalf)| HalfCast {
            op: j,
            half,
            only_dot_factor: r.ops[j]
                .results
                .first()
                .is_some_and(|c| only_dot_factor(r, all_uses, *c)),
        };
        out[i] = Some(list.iter().map(cast).collect());
    }
    out
}

/// A word-half cast run at its load (see [`load_halves`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HalfCast {
    /// The cast's op index.
    pub op: usize,
    pub half: WordHalf,
    /// Every use of the cast's result is a factor of a `dot` of this region, directly or through
    /// `select`s ([`only_dot_factor`]). The result may then be the ref's 16-bit elements in place
    /// (`Machine::load_halves`) instead of their copy through the cast: the two differ only where an
    /// element is a signaling NaN, which the cast quiets and a `dot` quiets alike
    /// (`tests/interpret.rs::halves_read_in_place_for_dots_give_the_unfused_bits`).
    pub only_dot_factor: bool,
}

/// Whether every use of `v` (`all_uses` counts them in the whole function) is, among `r`'s ops, a
/// factor of a `dot` (never its accumulator) or a branch of a `select` whose result is again used only
/// so: a signaling NaN in `v` reaches nothing but a `dot`, which quiets it.
fn only_dot_factor(r: &Region, all_uses: &HashMap<ValueId, usize>, v: ValueId) -> bool {
    let mut uses = 0;
    for op in &r.ops {
        for (k, _) in op.operands.iter().enumerate().filter(|(_, o)| **o == v) {
            let ok = match op.kind {
                OpKind::Dot { .. } => k < 2,
                OpKind::Select => {
                    k > 0
                        && op
                            .results
                            .first()
                            .is_some_and(|&s| s != v && only_dot_factor(r, all_uses, s))
                }
                _ => false,
            };
            if !ok {
                return false;
            }
            uses += 1;
        }
    }
    uses > 0 && all_uses.get(&v) == Some(&uses)
}

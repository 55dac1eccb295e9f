//! Grid coalescing: kernels whose blocks are independent slices of rows run over larger row bands.
//!
//! When every output element depends only on the input elements at the same position — the body loads
//! whole blocks, applies elementwise ops and stores whole blocks, every operand is blocked the same way
//! with the identity index map over a grid that tiles the arrays exactly, and nothing reads the grid
//! indices or keeps state — then every partition of the arrays into blocks computes the same bits. Such
//! a kernel is run over contiguous bands of rows instead of its own (often narrow) blocks: fewer grid
//! steps, and each step streams whole rows of memory instead of strided block rows. An `add` over
//! (256, 256) blocks of 1024² arrays runs as 4 bands of 256 full rows.
//!
//! A one-axis grid whose steps each take their own band of rows ([`coalesce_rows`]) is merged the same
//! way when a dataflow check shows the body never mixes rows: row-wise reductions and broadcasts of
//! row-invariant operands (a weight row under a constant index map) are fine; a reduction over rows,
//! an `iota` along rows, a reshape, a transpose, a `dot`, control flow, grid-index use or scratch are
//! not. A softmax over (8, 1024) blocks then takes 4 steps of 256 rows instead of 128 steps of 8: the
//! per-step and per-op costs are paid 32 times less often, for the same bits (each row is computed by
//! exactly the same ops in the same order).

use crate::ir::{DimensionSemantics, Func, Kernel, OpKind, OperandRole, Type, ValueId, Window};

/// Elements per band aimed for: large enough that the per-step cost vanishes (softmax 1024²: 1.35 ms
/// sequential in 8-row blocks, 1.11 in 32-row bands, 1.07 in 128 or 256), small enough that a band's
/// operands stay within a core's L2.
const BAND_ELEMENTS: usize = 256 << 10;
/// Bands are not split below this many elements just to give every thread one: a step costs a few
/// microseconds, a hand-off to another thread more.
const MIN_BAND_ELEMENTS: usize = 32 << 10;

/// The kernel rewritten to run over row bands, or None when it is not purely elementwise (see the
/// module docs). `threads`: how many chunks should be able to run at once.
pub(crate) fn coalesce(k: &Kernel, threads: usize) -> Option<Kernel> {
    let first = k.operands.first()?;
    let block = first.block.as_ref()?.block_shape.clone();
    let shape = first.shape.clone();
    let rank = shape.len();
    if rank == 0 || k.grid.len() != rank || shape.contains(&0) {
        return None;
    }
    for o in &k.operands {
        let b = o.block.as_ref()?;
        if o.role == OperandRole::Scratch
            || o.shape != shape
            || b.block_shape != block
            || b.squeezed.iter().any(|s| *s)
            || !is_identity(&b.index_map)
        {
            return None;
        }
    }
    if (0..rank).any(|d| k.grid[d] * block[d] != shape[d]) {
        return None;
    }
    if !elementwise_body(&k.body, &block) {
        return None;
    }
    // Bands of whole rows (all dims but the first in full), so each band is one contiguous range.
    let row: usize = shape[1..].iter().product();
    let by_size = BAND_ELEMENTS.div_ceil(row).max(1);
    let by_threads = shape[0]
        .div_ceil(threads.max(1))
        .max(MIN_BAND_ELEMENTS.div_ceil(row));
    let band = by_size.min(by_threads).clamp(1, shape[0]);
    let mut new_block = shape.clone();
    new_block[0] = band;
    if new_block == block {
        return None;
    }
    let mut grid = vec![1; rank];
    grid[0] = shape[0].div_ceil(band);
    let all = |n| vec![true; n];
    Some(rebanded(
        k,
        grid,
        &all(k.operands.len()),
        &all(k.body.values.len()),
        |s| s.clone_from(&new_block),
    ))
}

/// `k` on a new grid (every axis parallel), with `resize` applied to the block shape of each operand
/// and the shape of each body value marked in `operands` / `values`; whole-block loads and stores
/// follow their ref's new shape.
fn rebanded(
    k: &Kernel,
    grid: Vec<usize>,
    operands: &[bool],
    values: &[bool],
    resize: impl Fn(&mut Vec<usize>),
) -> Kernel {
    let mut out = k.clone();
    out.dimension_semantics = vec![DimensionSemantics::Parallel; grid.len()];
    out.grid = grid;
    for (o, r) in out.operands.iter_mut().zip(operands) {
        if let (true, Some(b)) = (r, &mut o.block) {
            resize(&mut b.block_shape);
        }
    }
    for (t, r) in out.body.values.iter_mut().zip(values) {
        if let (true, Type::Vector(s, _) | Type::Ref(s, _, _)) = (r, t) {
            resize(s);
        }
    }
    let types = &out.body.values;
    for op in &mut out.body.body.ops {
        if let (OpKind::Load(w) | OpKind::Store { window: w, .. }, Some(r)) =
            (&mut op.kind, op.operands.first())
        {
            *w = Window::full(types[r.0 as usize].shape());
        }
    }
    out
}

/// `|i, j, ..| (i, j, ..)`.
fn is_identity(f: &Func) -> bool {
    match f.body.ops.last() {
        Some(ret) if matches!(ret.kind, OpKind::Return) => ret.operands == f.body.args,
        _ => false,
    }
}

/// Straight-line whole-block loads, elementwise ops and whole-block unmasked stores, every vector and
/// ref of the block's shape, and no use of the grid indices (the body's scalar arguments).
fn elementwise_body(f: &Func, block: &[usize]) -> bool {
    let values_ok = f.values.iter().all(|t| match t {
        Type::Vector(s, _) | Type::Ref(s, _, _) => s == block,
        Type::Scalar(_) => true,
    });
    let scalar_args: Vec<_> = f
        .body
        .args
        .iter()
        .filter(|a| matches!(f.ty(**a), Type::Scalar(_)))
        .collect();
    values_ok
        && f.body.ops.iter().all(|op| {
            let kind_ok = match &op.kind {
                k if k.is_elementwise() => true,
                OpKind::Const(_) | OpKind::Return => true,
                OpKind::Load(w) => w.is_full(block) && w.n_dynamic() == 0,
                OpKind::Store { window, masked } => {
                    !masked && window.is_full(block) && window.n_dynamic() == 0
                }
                _ => false,
            };
            kind_ok
                && op.regions.is_empty()
                && op
                    .results
                    .iter()
                    .all(|r| !matches!(f.ty(*r), Type::Scalar(_)))
                && !op.operands.iter().any(|v| scalar_args.contains(&v))
        })
}

/// The kernel rewritten to run over larger bands of rows, or None (see the module docs): a one-axis
/// grid, every operand blocked, outputs and "row" inputs indexed `(i, const..)` with the same block rows
/// tiling the arrays exactly, other inputs under constant maps, no scratch, and a body that keeps rows
/// apart.
pub(crate) fn coalesce_rows(k: &Kernel, threads: usize) -> Option<Kernel> {
    let [g] = k.grid[..] else { return None };
    if g < 2 {
        return None;
    }
    // Per operand: Some(true) for a row operand, Some(false) for a row-invariant input.
    let mut rows_of = None;
    let mut is_row = Vec::new();
    for o in &k.operands {
        let b = o.block.as_ref()?;
        if o.role == OperandRole::Scratch || b.squeezed.iter().any(|s| *s) || o.shape.is_empty() {
            return None;
        }
        if o.role == OperandRole::Input && b.index_map.is_constant_map() {
            is_row.push(false);
            continue;
        }
        if !is_row_map(&b.index_map) || b.block_shape[0] * g != o.shape[0] {
            return None;
        }
        if *rows_of.get_or_insert(b.block_shape[0]) != b.block_shape[0] {
            return None;
        }
        is_row.push(true);
    }
    let rows = rows_of?;
    let band_of = row_values(&k.body, &is_row, rows)?;
    // Bands: a whole number of blocks dividing the grid, about BAND_ELEMENTS each, one per thread at least.
    let row: usize = k
        .operands
        .iter()
        .zip(&is_row)
        .filter(|(_, r)| **r)
        .map(|(o, _)| o.shape[1..].iter().product::<usize>())
        .max()
        .unwrap_or(1)
        .max(1);
    let per_block = rows * row;
    let m = (1..=g)
        .filter(|m| g % m == 0)
        .filter(|m| m * per_block <= BAND_ELEMENTS.max(per_block))
        .filter(|m| g / m >= threads.min(g) || *m == 1)
        .max()?;
    if m == 1 {
        return None;
    }
    let band = rows * m;
    Some(rebanded(k, vec![g / m], &is_row, &band_of, |s| s[0] = band))
}

/// `|i| (i, c1, c2, ..)` with constants `c`.
fn is_row_map(f: &Func) -> bool {
    let Some(ret) = f.body.ops.last() else {
        return false;
    };
    let consts = f.constants();
    matches!(ret.kind, OpKind::Return)
        && f.body.args.len() == 1
        && ret.operands.first() == f.body.args.first()
        && ret.operands[1..].iter().all(|v| consts.contains(v))
}

/// Which values of the body carry the rows of the band in their first dimension (`rows` long now), or
/// None when the body mixes rows or uses something the check does not model. Union-find over values
/// whose first dimensions must stay equal, with two anchors: the band, and "fixed" (must keep its
/// shape: row-invariant operands, iotas along rows, reduction operands over rows).
fn row_values(f: &Func, is_row: &[bool], rows: usize) -> Option<Vec<bool>> {
    let n = f.values.len();
    let (band, fixed) = (n, n + 1);
    let mut uf = UnionFind::new(n + 2);
    let vector = |v: &ValueId| !matches!(f.ty(*v), Type::Scalar(_));
    // Body args: the grid index (must be unused), then one ref per operand.
    let (grid_args, refs) = f
        .body
        .args
        .split_at(f.body.args.len().checked_sub(is_row.len())?);
    for (r, row) in refs.iter().zip(is_row) {
        uf.union(r.0 as usize, if *row { band } else { fixed });
    }
    for op in &f.body.ops {
        if !op.regions.is_empty() || op.operands.iter().any(|v| grid_args.contains(v)) {
            return None;
        }
        let res = op.results.first().map(|v| v.0 as usize);
        match &op.kind {
            OpKind::Const(_) | OpKind::Return => {}
            k if k.is_elementwise() => {
                let res = res?;
                if !vector(&op.results[0]) {
                    return None;
                }
                for v in &op.operands {
                    if !vector(v) {
                        return None;
                    }
                    uf.union(res, v.0 as usize);
                }
            }
            OpKind::Broadcast => {
                let (v, res) = (*op.operands.first()?, res?);
                let (from, to) = (f.ty(v).shape(), f.ty(op.results[0]).shape());
                if from.is_empty() || to.is_empty() {
                    // A scalar splat: the result's rows are free.
                } else if from.len() == to.len() && from[0] == to[0] {
                    uf.union(res, v.0 as usize);
                } else if from.len() < to.len() || from[0] != 1 {
                    // The operand's first dimension is not the result's: it must not be the band.
                    uf.union(v.0 as usize, fixed);
                }
            }
            OpKind::Iota { dim } => {
                if *dim == 0 {
                    uf.union(res?, fixed);
                }
            }
            OpKind::Reduce { axes, keepdims, .. } => {
                let (v, res) = (*op.operands.first()?, res?);
                if axes.contains(&0) {
                    uf.union(v.0 as usize, fixed);
                } else if *keepdims || !f.ty(op.results[0]).shape().is_empty() {
                    uf.union(res, v.0 as usize);
                }
            }
            OpKind::Load(w) => {
                if w.n_dynamic() != 0 || !w.is_full(f.ty(*op.operands.first()?).shape()) {
                    return None;
                }
                uf.union(res?, op.operands[0].0 as usize);
            }
            OpKind::Store { window, masked } => {
                let (r, v) = (*op.operands.first()?, *op.operands.get(1)?);
                if *masked || window.n_dynamic() != 0 || !window.is_full(f.ty(r).shape()) {
                    return None;
                }
                uf.union(r.0 as usize, v.0 as usize);
            }
            _ => return None,
        }
    }
    if uf.find(band) == uf.find(fixed) {
        return None;
    }
    let in_band: Vec<bool> = (0..n).map(|v| uf.find(v) == uf.find(band)).collect();
    for (v, b) in in_band.iter().enumerate() {
        if *b && f.values[v].shape().first() != Some(&rows) {
            return None;
        }
    }
    Some(in_band)
}

struct UnionFind(Vec<usize>);

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind((0..n).collect())
    }
    fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        self.0[a] = b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::SourceLoc;
    use crate::ir::{Op, Region};

    fn map(rank: usize, identity: bool) -> Func {
        let args: Vec<_> = (0..rank as u32).map(crate::ir::ValueId).collect();
        let mut ret = args.clone();
        if !identity {
            ret.reverse();
        }
        Func {
            name: "transform".into(),
            values: vec![Type::Scalar(crate::dtype::DType::I32); rank],
            body: Region {
                args,
                ops: vec![Op {
                    kind: OpKind::Return,
                    operands: ret,
                    results: vec![],
                    regions: vec![],
                    loc: SourceLoc::caller(),
                }],
            },
            result_types: vec![],
            loc: SourceLoc::caller(),
        }
    }

    #[test]
    fn identity_maps_are_recognized() {
        assert!(is_identity(&map(2, true)));
        assert!(!is_identity(&map(2, false)));
    }
}

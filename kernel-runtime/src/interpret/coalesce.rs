//! Grid coalescing for purely elementwise kernels.
//!
//! When every output element depends only on the input elements at the same position — the body loads
//! whole blocks, applies elementwise ops and stores whole blocks, every operand is blocked the same way
//! with the identity index map over a grid that tiles the arrays exactly, and nothing reads the grid
//! indices or keeps state — then every partition of the arrays into blocks computes the same bits. Such
//! a kernel is run over contiguous bands of rows instead of its own (often narrow) blocks: fewer grid
//! steps, and each step streams whole rows of memory instead of strided block rows. An `add` over
//! (256, 256) blocks of 1024² arrays runs as 8 bands of 128 full rows.

use crate::ir::{DimensionSemantics, Func, Kernel, OpKind, OperandRole, Type, Window};

/// Elements per band aimed for: large enough that the per-step cost vanishes, small enough that a
/// band's operands stay in a core's L2.
const BAND_ELEMENTS: usize = 128 << 10;
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
    let mut out = k.clone();
    out.grid = vec![1; rank];
    out.grid[0] = shape[0].div_ceil(band);
    out.dimension_semantics = vec![DimensionSemantics::Parallel; rank];
    for o in &mut out.operands {
        if let Some(b) = &mut o.block {
            b.block_shape = new_block.clone();
        }
    }
    for t in &mut out.body.values {
        match t {
            Type::Vector(s, _) | Type::Ref(s, _, _) => *s = new_block.clone(),
            Type::Scalar(_) => {}
        }
    }
    for op in &mut out.body.body.ops {
        match &mut op.kind {
            OpKind::Load(w) | OpKind::Store { window: w, .. } => *w = Window::full(&new_block),
            _ => {}
        }
    }
    Some(out)
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
                OpKind::Const(_)
                | OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Compare(_)
                | OpKind::Select
                | OpKind::Cast(_)
                | OpKind::Return => true,
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

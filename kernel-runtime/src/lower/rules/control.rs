//! Control flow: `scf.if` / `scf.for` / `scf.while` with their regions, and the terminators
//! (`scf.yield`, `scf.condition`, `func.return`).

use super::*;

pub(super) fn terminator(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    name: &'static str,
) -> Result<()> {
    let args = operands(lw, &op.operands)?;
    emit(lw, block, op, name, &args, &[], &[])?;
    Ok(())
}

/// Append an op with regions (scf.if / scf.for / scf.while) and bind its results.
pub(super) fn with_regions(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    name: &'static str,
    regions: Vec<Option<MBlock>>,
) -> Result<()> {
    let tys: Vec<MType> = (0..op.results.len())
        .map(|i| result_type(lw, op, i))
        .collect::<Result<_>>()?;
    let args = operands(lw, &op.operands)?;
    let res = emit(lw, block, op, name, &args, &tys, &[])?;
    if let Some(last) = block.last_mut() {
        last.regions = regions;
    }
    for (id, v) in op.results.iter().zip(res) {
        lw.bind(*id, v);
    }
    Ok(())
}

pub(super) fn if_(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op) -> Result<()> {
    let then_r = Some(lw.region(&op.regions[0])?);
    // An else that only yields nothing is left empty (scf.if allows that without results).
    let else_ir = &op.regions[1];
    let else_r = if op.results.is_empty() && else_ir.ops.len() == 1 {
        None
    } else {
        Some(lw.region(else_ir)?)
    };
    with_regions(lw, block, op, "scf.if", vec![then_r, else_r])
}

pub(super) fn for_(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op) -> Result<()> {
    let body = lw.region(&op.regions[0])?;
    with_regions(lw, block, op, "scf.for", vec![Some(body)])
}

pub(super) fn while_(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op) -> Result<()> {
    let before = Some(lw.region(&op.regions[0])?);
    let after = Some(lw.region(&op.regions[1])?);
    with_regions(lw, block, op, "scf.while", vec![before, after])
}

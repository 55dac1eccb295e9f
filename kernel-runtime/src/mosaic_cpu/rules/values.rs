//! The `tpu` ops that build values from values, as loop nests: `tpu.concatenate` (each operand copied
//! into its run of the result along `dimension`), `tpu.dynamic_rotate` and `tpu.reduce_index`.
//!
//! May depend on: the shared helpers of `rules.rs` and `rewrite` (the [`Rewriter`], its types).

use super::{bad, gather, mem, offset, result_buffer};
use crate::error::{kerr, Result};
use crate::mosaic_cpu::rewrite::{attr, int_attr, row_major, Rewriter, Ty};
use melior::ir::operation::{OperationLike, OperationRef};

pub(super) fn concatenate(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let dim = int_attr(op, "dimension")?;
    let out = result_buffer(rw, op)?;
    let (shape, _) = mem(op, &out, "the result")?;
    let dim = usize::try_from(dim)
        .ok()
        .filter(|d| *d < shape.len())
        .ok_or_else(|| {
            bad(
                op,
                format!("dimension {dim} of a rank-{} result", shape.len()),
            )
        })?;
    let ostrides = row_major(&shape);
    let mut at = 0;
    for (k, src) in operands.iter().enumerate() {
        let (sshape, _) = mem(op, src, &format!("operand {k}"))?;
        let fits = sshape.len() == shape.len()
            && (0..shape.len()).all(|d| d == dim || sshape[d] == shape[d]);
        if !fits {
            return Err(bad(
                op,
                format!("operand {k} of shape {sshape:?} in a result of shape {shape:?}"),
            ));
        }
        let base = at * ostrides[dim];
        rw.nest(&sshape, |rw, ivs| {
            let from = offset(rw, ivs, &sshape);
            let base = rw.constant(&format!("{base} : index"), "index");
            let terms: Vec<(String, usize)> = ivs
                .iter()
                .enumerate()
                .map(|(d, iv)| (iv.clone(), ostrides[d]))
                .collect();
            let to = rw.linear(&terms, Some(base));
            let x = rw.load(src, &from);
            rw.store(&x, &out, &to);
            Ok(())
        })?;
        at += sshape[dim];
    }
    if at != shape[dim] {
        return Err(bad(
            op,
            format!("operands fill {at} of {} along dimension {dim}", shape[dim]),
        ));
    }
    Ok(())
}

/// `tpu.dynamic_rotate %x by %amount dim d`: `out[i] = x[(i - amount) mod n]` along `d`, the amount
/// taken mod n whatever its sign (`jnp.roll`, the rule of Pallas's interpret mode).
pub(super) fn dynamic_rotate(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src, amount] = &operands[..] else {
        return Err(bad(op, "expected a value and an amount"));
    };
    if op.attribute("stride").is_ok() || op.attribute("stride_dimension").is_ok() {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: tpu.dynamic_rotate with a stride"
        ));
    }
    let Ty::Scalar(aty) = &amount.ty else {
        return Err(bad(op, "the amount is not a scalar"));
    };
    let dim = int_attr(op, "dimension")?;
    let (shape, _) = mem(op, src, "the source")?;
    let out = result_buffer(rw, op)?;
    let dim = usize::try_from(dim)
        .ok()
        .filter(|d| *d < shape.len())
        .ok_or_else(|| {
            bad(
                op,
                format!("dimension {dim} of a rank-{} value", shape.len()),
            )
        })?;
    let n = rw.index(shape[dim]);
    let (a, r, r2, sh) = (rw.fresh(), rw.fresh(), rw.fresh(), rw.fresh());
    rw.line(format!(
        "{a} = arith.index_cast {} : {aty} to index",
        amount.name
    ));
    rw.line(format!("{r} = arith.remsi {a}, {n} : index"));
    rw.line(format!("{r2} = arith.addi {r}, {n} : index"));
    rw.line(format!("{sh} = arith.remsi {r2}, {n} : index"));
    let strides = row_major(&shape);
    gather(rw, src, &out, &shape, |rw, ivs| {
        let (t, t2, j) = (rw.fresh(), rw.fresh(), rw.fresh());
        rw.line(format!("{t} = arith.addi {}, {n} : index", ivs[dim]));
        rw.line(format!("{t2} = arith.subi {t}, {sh} : index"));
        rw.line(format!("{j} = arith.remui {t2}, {n} : index"));
        let terms: Vec<(String, usize)> = ivs
            .iter()
            .enumerate()
            .map(|(d, iv)| (if d == dim { j.clone() } else { iv.clone() }, strides[d]))
            .collect();
        rw.linear(&terms, None)
    })
}

/// `tpu.reduce_index {axis, kind = arg_max | arg_min}` of an f32 value: the first index of the
/// extreme along `axis` (dropped from the result), a NaN being the extreme (jnp's rule, which the
/// interpreter shares; the TPU's NaN rule is not documented).
pub(super) fn reduce_index(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let kind = attr(op, "kind")?.to_string();
    let better = match kind.as_str() {
        "#tpu.reduction_kind<arg_max>" => "ogt",
        "#tpu.reduction_kind<arg_min>" => "olt",
        other => {
            return Err(kerr!(
                Unsupported,
                "mosaic_cpu: tpu.reduce_index kind {other}"
            ))
        }
    };
    let axis = int_attr(op, "axis")?;
    let (sshape, elem) = mem(op, src, "the source")?;
    let out = result_buffer(rw, op)?;
    let (shape, oelem) = mem(op, &out, "the result")?;
    let axis = usize::try_from(axis)
        .ok()
        .filter(|d| *d < sshape.len())
        .ok_or_else(|| bad(op, format!("axis {axis} of a rank-{} value", sshape.len())))?;
    let mut kept = sshape.clone();
    kept.remove(axis);
    if elem != "f32" || oelem != "i32" || kept != shape {
        return Err(bad(
            op,
            format!("{elem} {sshape:?} reduced over {axis} into {oelem} {shape:?}"),
        ));
    }
    let sstrides = row_major(&sshape);
    rw.nest(&shape, |rw, kivs| {
        // The source position of reduced index `i` at this result position.
        let at = |rw: &mut Rewriter<'_>, i: &str| {
            let mut terms = Vec::with_capacity(sstrides.len());
            let mut k = kivs.iter();
            for (d, stride) in sstrides.iter().enumerate() {
                let iv = if d == axis {
                    i.to_string()
                } else {
                    k.next().cloned().unwrap_or_default()
                };
                terms.push((iv, *stride));
            }
            rw.linear(&terms, None)
        };
        let c0 = rw.index(0);
        let best = rw.nest_acc(&[sshape[axis]], c0, "index", &mut |rw, ivs, best| {
            let (pb, pc) = (at(rw, best), at(rw, &ivs[0]));
            let (b, c) = (rw.load(src, &pb), rw.load(src, &pc));
            let (bn, cn, gt, take, keep, t, next) = (
                rw.fresh(),
                rw.fresh(),
                rw.fresh(),
                rw.fresh(),
                rw.fresh(),
                rw.fresh(),
                rw.fresh(),
            );
            rw.line(format!("{bn} = arith.cmpf uno, {b}, {b} : f32"));
            rw.line(format!("{cn} = arith.cmpf uno, {c}, {c} : f32"));
            rw.line(format!("{gt} = arith.cmpf {better}, {c}, {b} : f32"));
            rw.line(format!("{take} = arith.ori {cn}, {gt} : i1"));
            let tru = rw.constant("true", "i1");
            rw.line(format!("{keep} = arith.xori {bn}, {tru} : i1"));
            rw.line(format!("{t} = arith.andi {take}, {keep} : i1"));
            rw.line(format!(
                "{next} = arith.select {t}, {}, {best} : index",
                ivs[0]
            ));
            Ok(next)
        })?;
        let r = rw.fresh();
        rw.line(format!("{r} = arith.index_cast {best} : index to i32"));
        let to = offset(rw, kivs, &shape);
        rw.store(&r, &out, &to);
        Ok(())
    })
}

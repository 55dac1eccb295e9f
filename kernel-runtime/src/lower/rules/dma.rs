//! Ref views, DMA and semaphores, in the forms Pallas emits them (checked against Pallas's Mosaic for
//! the same kernels: `tpu.memref_slice` with i32 starts and i32 run-time sizes (`?` dims), `tpu.memref_squeeze` for indexed dimensions,
//! `tpu.enqueue_dma` / `tpu.wait_dma` with the source, target and target-semaphore segments).

use super::*;

/// A window of a ref as a ref: `tpu.memref_slice` (+ `tpu.memref_squeeze` when a dimension is indexed).
pub(super) fn ref_view(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    w: &Window,
) -> Result<()> {
    use crate::ir::DYNAMIC;
    let Type::Ref(_, d, space) = lw.func.ty(op.operands[0]).clone() else {
        return Err(kerr!(Lowering, "a view of a non-ref (internal error)"));
    };
    let mut args = vec![lw.v(op.operands[0])?];
    let mut dynamic = op.operands[1..].iter();
    let i32_ty = Type::Scalar(DType::I32);
    for s in &w.starts {
        args.push(match s {
            Start::Static(v) => {
                let l = Literal::from_i64(DType::I32, *v as i64);
                const_value(lw, block, op, &i32_ty, l)?
            }
            Start::Dynamic => {
                let id = dynamic
                    .next()
                    .ok_or_else(|| kerr!(Lowering, "missing dynamic view start"))?;
                lw.v(*id)?
            }
        });
    }
    // Run-time sizes: `?` in the sliced type, one i32 operand each (Pallas's `_slice_memref`).
    let sizes: Vec<usize> = w
        .sizes
        .iter()
        .zip(&w.dynamic_sizes)
        .map(|(n, dynamic)| if *dynamic { DYNAMIC } else { *n })
        .collect();
    let n_sizes = dynamic.len();
    for id in dynamic {
        args.push(lw.v(*id)?);
    }
    let sliced = lw.ty(&Type::Ref(sizes, d, space))?;
    let segments = format!("array<i32: 1, {}, {n_sizes}>", w.starts.len());
    let mut r = emit(
        lw,
        block,
        op,
        "tpu.memref_slice",
        &args,
        &[sliced],
        &[("operandSegmentSizes", segments)],
    )?[0];
    if w.squeezed.iter().any(|s| *s) {
        let out = lw.ty(&lw.func.ty(op.results[0]).clone())?;
        r = emit(lw, block, op, "tpu.memref_squeeze", &[r], &[out], &[])?[0];
    }
    lw.bind(op.results[0], r);
    Ok(())
}

/// `tpu.enqueue_dma` (start) or `tpu.wait_dma` (wait) of `source` into `target`, signalling the DMA
/// semaphore `target_semaphore`.
pub(super) fn dma(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, wait: bool) -> Result<()> {
    let args = operands(lw, &op.operands)?;
    let mut attrs = vec![
        (
            "operandSegmentSizes",
            "array<i32: 1, 0, 1, 1, 0, 0, 0>".to_string(),
        ),
        ("priority", "0 : i32".to_string()),
        ("strict_ordering", "false".to_string()),
    ];
    let name = if wait {
        attrs.push(("wait_target", "true".to_string()));
        "tpu.wait_dma"
    } else {
        "tpu.enqueue_dma"
    };
    emit(lw, block, op, name, &args, &[], &attrs)?;
    Ok(())
}

/// `(tpu.device_id / stride) % size` in unsigned arithmetic (`arith.divui`, `arith.remui`), as
/// Pallas lowers `lax.axis_index`.
pub(super) fn axis_index(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    stride: u32,
    size: u32,
) -> Result<()> {
    let i32_ty = Type::Scalar(DType::I32);
    let ty = [lw.ty(&i32_ty)?];
    let int = |v: u32| Literal::from_i64(DType::I32, v as i64);
    let id = emit(lw, block, op, "tpu.device_id", &[], &ty, &[])?[0];
    let stride = const_value(lw, block, op, &i32_ty, int(stride))?;
    let q = emit(lw, block, op, "arith.divui", &[id, stride], &ty, &[])?[0];
    let size = const_value(lw, block, op, &i32_ty, int(size))?;
    let r = emit(lw, block, op, "arith.remui", &[q, size], &ty, &[])?[0];
    lw.bind(op.results[0], r);
    Ok(())
}

/// A remote copy as Pallas emits it: `tpu.enqueue_dma` (`wait: None`) or `tpu.wait_dma` with
/// `wait_target` false (the send) or true (the receive), each with the source, the send semaphore
/// (`source_semaphore`), the target, the receive semaphore (`target_semaphore`) and the device id.
pub(super) fn remote_dma(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    wait: Option<bool>,
) -> Result<()> {
    let [src, dst, send, recv, device] = op.operands[..] else {
        return Err(kerr!(Lowering, "a remote copy's operands (internal error)"));
    };
    let args = operands(lw, &[src, send, dst, recv, device])?;
    let mut attrs = vec![
        (
            "operandSegmentSizes",
            "array<i32: 1, 1, 1, 1, 1, 0, 0>".to_string(),
        ),
        ("priority", "0 : i32".to_string()),
        ("strict_ordering", "false".to_string()),
    ];
    let name = match wait {
        None => "tpu.enqueue_dma",
        Some(recv) => {
            attrs.push(("wait_target", recv.to_string()));
            "tpu.wait_dma"
        }
    };
    emit(lw, block, op, name, &args, &[], &attrs)?;
    Ok(())
}

/// `tpu.sem_signal` (with a device id: on another device), `tpu.sem_wait`, `tpu.sem_read`.
pub(super) fn semaphore(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    name: &'static str,
) -> Result<()> {
    let args = operands(lw, &op.operands)?;
    let attrs: &[(&'static str, String)] = match name {
        "tpu.sem_signal" if op.operands.len() == 3 => {
            &[("operandSegmentSizes", "array<i32: 1, 1, 1, 0, 0>".into())]
        }
        "tpu.sem_signal" => &[("operandSegmentSizes", "array<i32: 1, 1, 0, 0, 0>".into())],
        _ => &[],
    };
    let results: Vec<MType> = (0..op.results.len())
        .map(|i| result_type(lw, op, i))
        .collect::<Result<_>>()?;
    let r = emit(lw, block, op, name, &args, &results, attrs)?;
    for (id, v) in op.results.iter().zip(r) {
        lw.bind(*id, v);
    }
    Ok(())
}

/// `tpu.region` holding the scope's allocations (`memref.alloca` for VMEM/SMEM buffers,
/// `tpu.sem_alloc` for semaphores) and its body, ended by `tpu.yield` (as Pallas lowers
/// `pl.run_scoped`).
pub(super) fn scoped(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op) -> Result<()> {
    let region = op
        .regions
        .first()
        .ok_or_else(|| kerr!(Lowering, "a scope without a body (internal error)"))?;
    let mut body = Vec::new();
    for a in &region.args {
        let ty = lw.func.ty(*a).clone();
        let mty = lw.ty(&ty)?;
        let v = match ty {
            Type::Ref(_, _, MemSpace::Sem(_)) => {
                emit(lw, &mut body, op, "tpu.sem_alloc", &[], &[mty], &[])?
            }
            _ => emit(
                lw,
                &mut body,
                op,
                "memref.alloca",
                &[],
                &[mty],
                &[("operandSegmentSizes", "array<i32: 0, 0>".into())],
            )?,
        }[0];
        lw.bind(*a, v);
    }
    for inner in &region.ops {
        if matches!(inner.kind, OpKind::Yield) {
            emit(lw, &mut body, inner, "tpu.yield", &[], &[], &[])?;
        } else {
            lower_op(lw, &mut body, inner).map_err(|e| e.at(inner.loc))?;
        }
    }
    emit(lw, block, op, "tpu.region", &[], &[], &[])?;
    if let Some(last) = block.last_mut() {
        last.regions = vec![Some(MBlock {
            args: Vec::new(),
            arg_loc: Some(lw.func.loc),
            ops: body,
        })];
    }
    Ok(())
}

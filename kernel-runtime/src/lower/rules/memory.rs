//! Loads and stores of a ref window: `vector.load` / `tpu.vector_store` (masked stores carry their
//! mask), `memref.load` / `memref.store` for one SMEM element, with the window's index operands. A
//! strided window (`ds(s, n).stride(k)`) is `tpu.strided_load` / `tpu.strided_store` with one stride
//! per ref dimension, as Pallas lowers `pl.ds(s, n, k)`.

use super::*;

/// Index operands of a window: constants for static starts, `index_cast`s of the dynamic i32 starts.
pub(super) fn window_indices(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    w: &Window,
    dynamic: &[ValueId],
) -> Result<Vec<MValue>> {
    let mut dyn_it = dynamic.iter();
    let mut out = Vec::new();
    let ity = MType::index();
    for s in &w.starts {
        out.push(match s {
            Start::Static(v) => index_const(lw, block, op, *v)?,
            Start::Dynamic => {
                let id = dyn_it
                    .next()
                    .ok_or_else(|| kerr!(Lowering, "missing dynamic index operand"))?;
                let v = lw.v(*id)?;
                emit(
                    lw,
                    block,
                    op,
                    "arith.index_cast",
                    &[v],
                    std::slice::from_ref(&ity),
                    &[],
                )?[0]
            }
        });
    }
    Ok(out)
}

pub(super) fn load(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, w: &Window) -> Result<()> {
    let ref_ty = lw.func.ty(op.operands[0]).clone();
    let out_ty = lw.func.ty(op.results[0]).clone();
    let idx = window_indices(lw, block, op, w, &op.operands[1..])?;
    if let (Type::Scalar(_), Type::Ref(_, _, MemSpace::Smem)) = (&out_ty, &ref_ty) {
        // One SMEM element: `memref.load` (what Pallas emits for `idx_ref[i]`).
        let base = lw.v(op.operands[0])?;
        let mut args = vec![base];
        args.extend(idx);
        let mty = lw.ty(&out_ty)?;
        let r = emit(lw, block, op, "memref.load", &args, &[mty], &[])?[0];
        lw.bind(op.results[0], r);
        return Ok(());
    }
    if matches!(out_ty, Type::Scalar(_)) {
        return Err(kerr!(
            Lowering,
            "a scalar load from a {ref_ty} reached lowering (the trace rejects it; internal error)"
        ));
    }
    let base = lw.v(op.operands[0])?;
    let mut args = vec![base];
    args.extend(idx);
    let full_ty = lw.ty(&Type::Vector(w.sizes.clone(), ref_ty.dtype()))?;
    let mut r = match w.is_strided() {
        true => {
            let strides = ("strides", i32_array(&w.strides));
            emit(
                lw,
                block,
                op,
                "tpu.strided_load",
                &args,
                &[full_ty],
                &[strides],
            )?[0]
        }
        false => emit(lw, block, op, "vector.load", &args, &[full_ty], &[])?[0],
    };
    if w.squeezed.iter().any(|s| *s) {
        let mty = lw.ty(&out_ty)?;
        r = emit(lw, block, op, "vector.shape_cast", &[r], &[mty], &[])?[0];
    }
    lw.bind(op.results[0], r);
    Ok(())
}

pub(super) fn store(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    w: &Window,
    masked: bool,
) -> Result<()> {
    let ref_ty = lw.func.ty(op.operands[0]).clone();
    let n_dyn = w.n_dynamic();
    let dynamic = &op.operands[2..2 + n_dyn];
    let idx = window_indices(lw, block, op, w, dynamic)?;
    if let Type::Ref(_, _, MemSpace::Smem) = ref_ty {
        // One SMEM element: `memref.store value, ref[indices]`.
        let mut args = vec![lw.v(op.operands[1])?, lw.v(op.operands[0])?];
        args.extend(idx);
        emit(lw, block, op, "memref.store", &args, &[], &[])?;
        return Ok(());
    }
    let mut value = lw.v(op.operands[1])?;
    let mut mask = match masked {
        true => Some(lw.v(op.operands[2 + n_dyn])?),
        false => None,
    };
    if w.squeezed.iter().any(|s| *s) {
        let vty = lw.ty(&Type::Vector(w.sizes.clone(), ref_ty.dtype()))?;
        value = emit(lw, block, op, "vector.shape_cast", &[value], &[vty], &[])?[0];
        if let Some(m) = mask {
            let mty = lw.ty(&Type::Vector(w.sizes.clone(), DType::Bool))?;
            mask = Some(emit(lw, block, op, "vector.shape_cast", &[m], &[mty], &[])?[0]);
        }
    }
    let base = lw.v(op.operands[0])?;
    let mut args = vec![value, base];
    if w.is_strided() {
        // The trace refuses a mask here (`tpu.strided_store` takes none).
        args.extend(idx);
        let strides = ("strides", i32_array(&w.strides));
        emit(lw, block, op, "tpu.strided_store", &args, &[], &[strides])?;
        return Ok(());
    }
    let n_idx = idx.len();
    args.extend(idx);
    args.extend(mask);
    let segments = format!("array<i32: 1, 1, {n_idx}, {}>", masked as u8);
    emit(
        lw,
        block,
        op,
        "tpu.vector_store",
        &args,
        &[],
        &[
            ("operandSegmentSizes", segments),
            ("strides", "array<i32>".into()),
        ],
    )?;
    Ok(())
}

/// A `DenseI32ArrayAttr`: `array<i32: 1, 2>`.
fn i32_array(xs: &[usize]) -> String {
    let xs: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    format!("array<i32: {}>", xs.join(", "))
}

//! `arith` and `math` ops — every op of those dialects, table entry or not — and `tpu.logistic` kept
//! on scalars and applied per element on vectors ([`per_element`]; the ops the vector math defines
//! become calls of it, `scalar.rs`), and `arith.constant` (scalars kept, vector splats as filled
//! buffers).
//!
//! May depend on: the shared helpers of `rules.rs`, `rewrite` (the [`Rewriter`] and its types) and
//! `scalar.rs` (the guarded scalar ops); nothing else in `rules/`.

use super::{bad, result_buffer, scalar};
use crate::error::{kerr, Result};
use crate::mosaic_cpu::rewrite::{attr, attrs_text, op_name, Rewriter, Ty, Val};
use crate::mosaic_cpu::scalar::scalar_op;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::{Attribute, AttributeLike};

pub(super) fn elementwise(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let name = op_name(op);
    let attrs = attrs_text(op, &[]);
    per_element(rw, op, &mut |rw, args, ty| {
        scalar_op(rw, &name, args, ty, &attrs)
    })
}

/// The scalar code of an element-wise op: its scalar operands and result type → its result.
type Scalar<'a, 'f> = dyn FnMut(&mut Rewriter<'f>, &[Val], &str) -> Result<String> + 'a;

/// An element-wise op: `f` on scalars, or `f` per element of same-shaped vector operands (scalar
/// operands, like `arith.select`'s condition, are used as they are).
fn per_element<'f>(
    rw: &mut Rewriter<'f>,
    op: OperationRef<'_, '_>,
    f: &mut Scalar<'_, 'f>,
) -> Result<()> {
    if op.result_count() != 1 || op.region_count() != 0 {
        return Err(bad(op, "expected one result and no regions"));
    }
    let operands = rw.operands(op)?;
    match rw.result_ty(op, 0)? {
        Ty::Scalar(t) => {
            if operands.iter().any(|v| matches!(v.ty, Ty::Mem { .. })) {
                return Err(bad(op, "a scalar result from vector operands"));
            }
            let r = f(rw, &operands, &t)?;
            rw.bind_result(op, 0, scalar(r, &t))
        }
        Ty::Mem { shape, elem } => {
            for v in &operands {
                if let Some(s) = v.ty.shape() {
                    if s != shape.as_slice() {
                        return Err(bad(op, format!("operand shape {s:?} ≠ result {shape:?}")));
                    }
                }
            }
            let out = result_buffer(rw, op)?;
            let n: usize = shape.iter().product();
            rw.nest(&[n], |rw, ivs| {
                let i = &ivs[0];
                let args: Vec<Val> = operands
                    .iter()
                    .map(|v| match &v.ty {
                        Ty::Mem { elem, .. } => scalar(rw.load(v, i), elem),
                        Ty::Scalar(_) => v.clone(),
                    })
                    .collect();
                let r = f(rw, &args, &elem)?;
                rw.store(&r, &out, i);
                Ok(())
            })
        }
    }
}

pub(super) fn constant(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let Ty::Mem { shape, elem } = rw.result_ty(op, 0)? else {
        return rw.keep(op, &[]);
    };
    let value = attr(op, "value")?;
    let raw = value.to_raw();
    // SAFETY: `raw` is a live attribute of the emitted module; the splat value is owned by its context.
    let splat = unsafe {
        (mlir_sys::mlirAttributeIsADenseElements(raw)
            && mlir_sys::mlirDenseElementsAttrIsSplat(raw))
        .then(|| Attribute::from_raw(mlir_sys::mlirDenseElementsAttrGetSplatValue(raw)))
    };
    let splat = splat.ok_or_else(|| {
        kerr!(
            Unsupported,
            "mosaic_cpu: vector constants other than splats ({value})"
        )
    })?;
    let c = rw.constant(&splat.to_string(), &elem);
    let out = result_buffer(rw, op)?;
    rw.nest(&[shape.iter().product()], |rw, ivs| {
        rw.store(&c, &out, &ivs[0]);
        Ok(())
    })
}

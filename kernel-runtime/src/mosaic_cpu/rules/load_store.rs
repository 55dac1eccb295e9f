//! Loads and stores of a window of a ref: `vector.load`, `tpu.strided_load`, `tpu.vector_store`
//! (masked and strided) and `tpu.strided_store`,
//! bounds-checked at run time, and the two checks `dma.rs` and `memref.rs` share with them —
//! [`window_in_bounds`] and [`not_in_hbm`] (a load or store on a ref in HBM is refused: only DMA
//! reaches it).
//!
//! May depend on: the shared helpers of `rules.rs`, `rewrite` (the [`Rewriter`], its types and
//! check sites) and `views` (one element of a ref view); nothing else in `rules/`.

use super::{bad, mem, offset, result_buffer};
use crate::error::{kerr, Result};
use crate::mosaic_cpu::rewrite::{
    i32_array, op_name, ref_space, RefView, Rewriter, SiteKind, Space, Val,
};
use crate::mosaic_cpu::views;
use melior::ir::operation::{OperationLike, OperationRef};

/// `i1`: every window start of `starts` within `shape`; the window covers `sizes` (the trailing dims)
/// with `strides` between its elements; leading dims are single indices.
pub(in crate::mosaic_cpu) fn window_in_bounds(
    rw: &mut Rewriter<'_>,
    starts: &[Val],
    shape: &[usize],
    sizes: &[usize],
    strides: &[usize],
) -> String {
    let lead = shape.len() - sizes.len();
    let mut ok: Option<String> = None;
    for (d, s) in starts.iter().enumerate() {
        let extent = if d < lead {
            1
        } else {
            let k = d - lead;
            sizes[k].saturating_sub(1) * strides[k] + 1
        };
        let zero = rw.index(0);
        let ge = rw.fresh();
        rw.line(format!("{ge} = arith.cmpi sge, {}, {zero} : index", s.name));
        let e = rw.index(extent);
        let end = rw.fresh();
        rw.line(format!("{end} = arith.addi {}, {e} : index", s.name));
        let dim = rw.index(shape[d]);
        let le = rw.fresh();
        rw.line(format!("{le} = arith.cmpi sle, {end}, {dim} : index"));
        for c in [ge, le] {
            ok = Some(match ok {
                None => c,
                Some(prev) => {
                    let r = rw.fresh();
                    rw.line(format!("{r} = arith.andi {prev}, {c} : i1"));
                    r
                }
            });
        }
    }
    ok.unwrap_or_else(|| rw.constant("true", "i1"))
}

/// Operand `i` of a load or store must not be a ref in HBM (`any`, `hbm`): the TPU's vector and
/// scalar units reach VMEM and SMEM only, HBM is reached by DMA (Pallas refuses such a load or
/// store, and so does the trace). Run on the CPU it would work, hiding a wrong lowering.
pub(in crate::mosaic_cpu) fn not_in_hbm(op: OperationRef<'_, '_>, i: usize) -> Result<()> {
    let v = op
        .operand(i)
        .map_err(|_| bad(op, format!("expected an operand {i}")))?;
    match ref_space(melior::ir::ValueLike::r#type(&v))? {
        Some(s @ (Space::Any | Space::Hbm)) => Err(kerr!(
            Lowering,
            "mosaic_cpu: `{}` on a ref in {s:?}: only DMA reaches HBM",
            op_name(op)
        )),
        _ => Ok(()),
    }
}

pub(super) fn vector_load(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    load(rw, op, None)
}

/// `tpu.strided_load`: one stride per ref dimension, the result of the ref's rank.
pub(super) fn strided_load(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let strides = i32_array(op, "strides")?;
    load(rw, op, Some(strides))
}

/// Element `i` of the result is the ref's `starts + i * strides` (trailing dims; `strides` all 1
/// when `None`).
fn load(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>, strides: Option<Vec<i64>>) -> Result<()> {
    not_in_hbm(op, 0)?;
    let (base, operands) = ref_and_values(rw, op, 0)?;
    let starts = &operands[..];
    let (shape, elem) = (base.shape.clone(), base.elem().to_string());
    let ref_id = base.ref_id;
    let out = result_buffer(rw, op)?;
    let (sizes, out_elem) = mem(op, &out, "the result")?;
    if starts.len() != shape.len() || sizes.len() > shape.len() || out_elem != elem {
        return Err(bad(op, "indices, shapes or element types do not match"));
    }
    let lead = shape.len() - sizes.len();
    let strides: Vec<usize> = match strides {
        None => vec![1; sizes.len()],
        Some(s) if s.len() == shape.len() && lead == 0 && s.iter().all(|x| *x > 0) => {
            s.iter().map(|x| *x as usize).collect()
        }
        Some(s) => return Err(bad(op, format!("strides {s:?}"))),
    };
    let site = rw.site(
        op,
        SiteKind::Load {
            sizes: extents(&sizes, &strides),
            shape: shape.clone(),
        },
        ref_id,
    );
    let ok = window_in_bounds(rw, starts, &shape, &sizes, &strides);
    let ref_strides = base.strides.clone();
    rw.if_else(
        &ok,
        |rw| {
            let terms: Vec<(String, usize)> = starts
                .iter()
                .map(|s| s.name.clone())
                .zip(ref_strides.iter().copied())
                .collect();
            let start = rw.linear(&terms, Some(base.offset.clone()));
            rw.nest(&sizes, |rw, ivs| {
                let terms: Vec<(String, usize)> = ivs
                    .iter()
                    .enumerate()
                    .map(|(k, iv)| (iv.clone(), strides[k] * ref_strides[lead + k]))
                    .collect();
                let src = rw.linear(&terms, Some(start.clone()));
                let dst = offset(rw, ivs, &sizes);
                let x = views::read(rw, &base, &src);
                rw.store(&x, &out, &dst);
                Ok(())
            })
        },
        |rw| rw.record(site, starts),
    )
}

/// How far each dimension of a window of `sizes` elements `strides` apart reaches.
fn extents(sizes: &[usize], strides: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .zip(strides)
        .map(|(n, k)| n.saturating_sub(1) * k + 1)
        .collect()
}

/// `tpu.strided_store`: value, base, indices (no mask), one stride per ref dimension.
pub(super) fn strided_store(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    not_in_hbm(op, 1)?;
    let (base, operands) = ref_and_values(rw, op, 1)?;
    let [value, starts @ ..] = &operands[..] else {
        return Err(bad(op, "expected a value and a base"));
    };
    let (sizes, velem) = mem(op, value, "the value")?;
    let (shape, elem) = (base.shape.clone(), base.elem().to_string());
    let s = i32_array(op, "strides")?;
    if starts.len() != shape.len() || sizes.len() != shape.len() || velem != elem {
        return Err(bad(op, "indices, shapes or element types do not match"));
    }
    if s.len() != shape.len() || s.iter().any(|x| *x <= 0) {
        return Err(bad(op, format!("strides {s:?}")));
    }
    let strides: Vec<usize> = s.iter().map(|x| *x as usize).collect();
    store(
        rw,
        op,
        (value, &base, starts, None),
        (&sizes, &shape, &strides),
    )
}

pub(super) fn vector_store(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    not_in_hbm(op, 1)?;
    // Operands: value, base, indices..., [mask] — split as the op's segment sizes say.
    let seg = i32_array(op, "operandSegmentSizes")?;
    let (base, operands) = ref_and_values(rw, op, 1)?;
    let [1, 1, n_idx, n_mask] = seg[..] else {
        return Err(bad(op, format!("operand segments {seg:?}")));
    };
    let (n_idx, n_mask) = (n_idx as usize, n_mask as usize);
    if n_mask > 1 || 1 + n_idx + n_mask != operands.len() {
        return Err(bad(op, format!("operand segments {seg:?}")));
    }
    let value = &operands[0];
    let starts = &operands[1..1 + n_idx];
    let mask = operands.get(1 + n_idx).filter(|_| n_mask == 1);
    let (sizes, velem) = mem(op, value, "the value")?;
    let (shape, elem) = (base.shape.clone(), base.elem().to_string());
    if starts.len() != shape.len() || sizes.len() > shape.len() || velem != elem {
        return Err(bad(op, "indices, shapes or element types do not match"));
    }
    if let Some(m) = mask {
        let (mshape, melem) = mem(op, m, "the mask")?;
        if mshape != sizes || melem != "i1" {
            return Err(bad(op, "the mask is not an i1 vector of the value's shape"));
        }
    }
    let lead = shape.len() - sizes.len();
    // `strides` (one per ref dim, may be empty: all 1) step between stored elements.
    let strides: Vec<usize> = match op.attribute("strides") {
        Ok(_) => {
            let s = i32_array(op, "strides")?;
            if s.is_empty() {
                vec![1; sizes.len()]
            } else if s.len() == shape.len() && s.iter().all(|x| *x > 0) {
                s[lead..].iter().map(|x| *x as usize).collect()
            } else {
                return Err(bad(op, format!("strides {s:?}")));
            }
        }
        Err(_) => vec![1; sizes.len()],
    };
    store(
        rw,
        op,
        (value, &base, starts, mask),
        (&sizes, &shape, &strides),
    )
}

/// Store `value` (of `sizes`, the ref's trailing dims) into `base` (of `shape`) at `starts`, its
/// elements `strides` apart, where `mask`.
fn store(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    (value, base, starts, mask): (&Val, &RefView, &[Val], Option<&Val>),
    (sizes, shape, strides): (&[usize], &[usize], &[usize]),
) -> Result<()> {
    let lead = shape.len() - sizes.len();
    let ref_id = base.ref_id;
    let site = rw.site(
        op,
        SiteKind::Store {
            sizes: extents(sizes, strides),
            shape: shape.to_vec(),
        },
        ref_id,
    );
    let ok = window_in_bounds(rw, starts, shape, sizes, strides);
    let ref_strides = base.strides.clone();
    rw.if_else(
        &ok,
        |rw| {
            let terms: Vec<(String, usize)> = starts
                .iter()
                .map(|s| s.name.clone())
                .zip(ref_strides.iter().copied())
                .collect();
            let start = rw.linear(&terms, Some(base.offset.clone()));
            rw.nest(sizes, |rw, ivs| {
                let terms: Vec<(String, usize)> = ivs
                    .iter()
                    .enumerate()
                    .map(|(k, iv)| (iv.clone(), strides[k] * ref_strides[lead + k]))
                    .collect();
                let dst = rw.linear(&terms, Some(start.clone()));
                let src = offset(rw, ivs, sizes);
                let x = rw.load(value, &src);
                match mask {
                    Some(m) => {
                        let keep = rw.load(m, &src);
                        rw.if_else(
                            &keep,
                            |rw| {
                                views::write(rw, base, &dst, &x);
                                Ok(())
                            },
                            |_| Ok(()),
                        )
                    }
                    None => {
                        views::write(rw, base, &dst, &x);
                        Ok(())
                    }
                }
            })
        },
        |rw| rw.record(site, starts),
    )
}

/// Operand `i` of `op` as a ref (a whole ref, a window or a view) and the other operands as values.
fn ref_and_values(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    i: usize,
) -> Result<(RefView, Vec<Val>)> {
    let r = op
        .operand(i)
        .map_err(|_| bad(op, format!("expected an operand {i}")))?;
    let view = rw.view(r)?;
    let values = (0..op.operand_count())
        .filter(|k| *k != i)
        .map(|k| {
            let v = op
                .operand(k)
                .map_err(|_| bad(op, format!("expected an operand {k}")))?;
            rw.val(v)
        })
        .collect::<Result<_>>()?;
    Ok((view, values))
}

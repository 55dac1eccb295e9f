//! n-D `vector` ops (upstream, but not lowered to LLVM for n-D vectors) as loop nests over the flat
//! buffers: `vector.broadcast`, `vector.shape_cast`, `vector.multi_reduction` (its kinds in
//! [`REDUCTION_KINDS`]) and `vector.extract_strided_slice`. `vector.load` is a load: `load_store.rs`.
//!
//! May depend on: the shared helpers of `rules.rs`, `rewrite` (the [`Rewriter`] and its types) and
//! `scalar.rs` (the combining ops); nothing else in `rules/`.

use super::{accumulator, bad, gather, mem, narrow, offset, result_buffer, scalar, widen};
use crate::error::{kerr, Result};
use crate::mosaic_cpu::rewrite::{attr, i64_array, is_float, row_major, Rewriter, Ty, Val};
use crate::mosaic_cpu::scalar::scalar_op;
use melior::ir::operation::OperationRef;
use melior::ir::Attribute;

/// `vector.multi_reduction` kinds: the combining op on floats and on integers.
const REDUCTION_KINDS: &[(&str, Option<&str>, Option<&str>)] = &[
    ("add", Some("arith.addf"), Some("arith.addi")),
    ("mul", Some("arith.mulf"), Some("arith.muli")),
    ("maximumf", Some("arith.maximumf"), None),
    ("minimumf", Some("arith.minimumf"), None),
    ("maxnumf", Some("arith.maxnumf"), None),
    ("minnumf", Some("arith.minnumf"), None),
    ("maxsi", None, Some("arith.maxsi")),
    ("minsi", None, Some("arith.minsi")),
    ("maxui", None, Some("arith.maxui")),
    ("minui", None, Some("arith.minui")),
    ("and", None, Some("arith.andi")),
    ("or", None, Some("arith.ori")),
    ("xor", None, Some("arith.xori")),
];

pub(super) fn broadcast(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let out = result_buffer(rw, op)?;
    let (shape, _) = mem(op, &out, "the result")?;
    match &src.ty {
        Ty::Scalar(_) => rw.nest(&[shape.iter().product()], |rw, ivs| {
            rw.store(&src.name, &out, &ivs[0]);
            Ok(())
        }),
        Ty::Mem { shape: sshape, .. } => {
            let lead = shape
                .len()
                .checked_sub(sshape.len())
                .ok_or_else(|| bad(op, "the source has a higher rank than the result"))?;
            if sshape
                .iter()
                .enumerate()
                .any(|(k, s)| *s != 1 && *s != shape[lead + k])
            {
                return Err(bad(op, format!("cannot broadcast {sshape:?} to {shape:?}")));
            }
            let sstrides = row_major(sshape);
            gather(rw, src, &out, &shape, |rw, ivs| {
                // Source dims of size 1 are stretched (index 0).
                let terms: Vec<(String, usize)> = sshape
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| **s != 1)
                    .map(|(k, _)| (ivs[lead + k].clone(), sstrides[k]))
                    .collect();
                rw.linear(&terms, None)
            })
        }
    }
}

pub(super) fn shape_cast(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let (sshape, elem) = mem(op, src, "the source")?;
    let ty = rw.result_ty(op, 0)?;
    match &ty {
        Ty::Mem { shape, elem: e }
            if shape.iter().product::<usize>() == sshape.iter().product::<usize>()
                && *e == elem =>
        {
            // Row-major buffers: the same buffer read with the new shape.
            rw.bind_result(
                op,
                0,
                Val {
                    name: src.name.clone(),
                    ty,
                },
            )
        }
        _ => Err(bad(op, "element counts or types differ")),
    }
}

/// `#vector.kind<add>` → `add`.
fn kind_name(a: &Attribute<'_>) -> String {
    let text = a.to_string();
    text.split_once('<')
        .and_then(|(_, rest)| rest.strip_suffix('>'))
        .unwrap_or(&text)
        .to_string()
}

pub(super) fn multi_reduction(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src, acc] = &operands[..] else {
        return Err(bad(op, "expected a source and an accumulator"));
    };
    let kind = kind_name(&attr(op, "kind")?);
    let dims: Vec<usize> = i64_array(op, "reduction_dims")?
        .into_iter()
        .map(|d| d as usize)
        .collect();
    let (sshape, elem) = mem(op, src, "the source")?;
    if dims.iter().any(|d| *d >= sshape.len()) {
        return Err(bad(
            op,
            format!("reduction dims {dims:?} of a rank-{} source", sshape.len()),
        ));
    }
    let combine = REDUCTION_KINDS
        .iter()
        .find(|(k, _, _)| *k == kind)
        .and_then(|(_, f, i)| if is_float(&elem) { *f } else { *i })
        .ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: reduction kind `{kind}` on {elem}"))?;
    let kept: Vec<usize> = (0..sshape.len()).filter(|d| !dims.contains(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| sshape[d]).collect();
    let red_shape: Vec<usize> = dims.iter().map(|&d| sshape[d]).collect();
    let acc_ty = accumulator(&elem).to_string();
    let sstrides = row_major(&sshape);
    // One reduced element combined into the running value `a`.
    let step = |rw: &mut Rewriter<'_>, kivs: &[String], rivs: &[String], a: &str| {
        let mut terms = Vec::new();
        for (d, stride) in sstrides.iter().enumerate() {
            let iv = match kept.iter().position(|k| *k == d) {
                Some(p) => &kivs[p],
                None => &rivs[dims.iter().position(|k| *k == d).unwrap_or(0)],
            };
            terms.push((iv.clone(), *stride));
        }
        let at = rw.linear(&terms, None);
        let x = rw.load(src, &at);
        let x = widen(rw, &x, &elem, &acc_ty);
        scalar_op(
            rw,
            combine,
            &[scalar(a.to_string(), &acc_ty), scalar(x, &acc_ty)],
            &acc_ty,
            "",
        )
    };
    match rw.result_ty(op, 0)? {
        Ty::Scalar(t) => {
            if !kept.is_empty() || acc.ty != Ty::Scalar(t.clone()) {
                return Err(bad(op, "a scalar result must reduce every dim"));
            }
            let init = widen(rw, &acc.name, &elem, &acc_ty);
            let r = rw.nest_acc(&red_shape, init, &acc_ty, &mut |rw, rivs, a| {
                step(rw, &[], rivs, a)
            })?;
            let r = narrow(rw, &r, &acc_ty, &elem);
            rw.bind_result(op, 0, scalar(r, &t))
        }
        Ty::Mem { shape, .. } => {
            if shape != kept_shape || acc.ty.shape() != Some(&kept_shape[..]) {
                return Err(bad(
                    op,
                    "the result and accumulator must have the kept dims",
                ));
            }
            let out = result_buffer(rw, op)?;
            rw.nest(&kept_shape, |rw, kivs| {
                let at = offset(rw, kivs, &kept_shape);
                let a0 = rw.load(acc, &at);
                let init = widen(rw, &a0, &elem, &acc_ty);
                let r = rw.nest_acc(&red_shape, init, &acc_ty, &mut |rw, rivs, a| {
                    step(rw, kivs, rivs, a)
                })?;
                let r = narrow(rw, &r, &acc_ty, &elem);
                rw.store(&r, &out, &at);
                Ok(())
            })
        }
    }
}

/// An `I64ArrayAttr` (`[1 : i64, 2 : i64]`, the attribute form of `vector.extract_strided_slice`).
fn i64_list(op: OperationRef<'_, '_>, name: &str) -> Result<Vec<i64>> {
    let a = melior::ir::attribute::ArrayAttribute::try_from(attr(op, name)?)
        .map_err(|_| bad(op, format!("`{name}` is not an array attribute")))?;
    (0..a.len())
        .map(|i| {
            a.element(i)
                .ok()
                .and_then(|e| melior::ir::attribute::IntegerAttribute::try_from(e).ok())
                .map(|e| e.value())
                .ok_or_else(|| bad(op, format!("`{name}` holds a non-integer")))
        })
        .collect()
}

/// `vector.extract_strided_slice`: result element `i` is source element `offsets + i * strides`
/// (dimensions past the attributes' length are taken whole).
pub(super) fn extract_strided_slice(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let (offsets, sizes, strides) = (
        i64_list(op, "offsets")?,
        i64_list(op, "sizes")?,
        i64_list(op, "strides")?,
    );
    let (sshape, _) = mem(op, src, "the source")?;
    let out = result_buffer(rw, op)?;
    let (shape, _) = mem(op, &out, "the result")?;
    let fits = shape.len() == sshape.len()
        && offsets.len() == sizes.len()
        && strides.len() == sizes.len()
        && sizes.len() <= shape.len()
        && (0..sizes.len()).all(|d| {
            offsets[d] >= 0
                && strides[d] >= 1
                && sizes[d] == shape[d] as i64
                && offsets[d] + (sizes[d] - 1) * strides[d] < sshape[d] as i64
        })
        && (sizes.len()..shape.len()).all(|d| shape[d] == sshape[d]);
    if !fits {
        return Err(bad(
            op,
            format!("offsets {offsets:?}, sizes {sizes:?}, strides {strides:?} do not take {shape:?} from {sshape:?}"),
        ));
    }
    let sstrides = row_major(&sshape);
    let base: usize = offsets
        .iter()
        .zip(&sstrides)
        .map(|(o, s)| *o as usize * s)
        .sum();
    let step = |d: usize| strides.get(d).map_or(1, |s| *s as usize);
    gather(rw, src, &out, &shape, |rw, ivs| {
        let base = rw.constant(&format!("{base} : index"), "index");
        let terms: Vec<(String, usize)> = ivs
            .iter()
            .enumerate()
            .map(|(d, iv)| (iv.clone(), sstrides[d] * step(d)))
            .collect();
        rw.linear(&terms, Some(base))
    })
}

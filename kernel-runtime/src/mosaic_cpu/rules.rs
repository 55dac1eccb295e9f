//! The rewrite table: every op a Mosaic module may hold, and the upstream code it becomes. Vector values
//! are flat row-major buffers (see `rewrite`), so each vector or `tpu` op becomes a loop nest over
//! scalars; every attribute that decides what an op computes is read from the emitted op.

use super::rewrite::{
    attr, attrs_text, i32_array, i64_array, int_attr, is_float, key, op_name, ref_space, row_major,
    Rewriter, SiteKind, Space, Ty, Val,
};
use super::scalar::scalar_op;
use crate::error::{kerr, Result};
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::{Attribute, AttributeLike};

pub(super) type Rule = fn(&mut Rewriter<'_>, OperationRef<'_, '_>) -> Result<()>;

/// Op name → rule. Ops of the element-wise dialects ([`ELEMENTWISE`]) need no entry.
const TABLE: &[(&str, Rule)] = &[
    // The tpu dialect (not upstream).
    ("tpu.matmul", matmul),
    ("tpu.vector_store", vector_store),
    ("tpu.iota", iota),
    ("tpu.transpose", transpose),
    ("tpu.assume_multiple", assume_multiple),
    ("tpu.logistic", logistic),
    ("tpu.trace_start", profiler_marker),
    ("tpu.trace_stop", profiler_marker),
    // Ref windows, DMA and semaphores (`dma.rs`): windows are views of a kernel ref's buffer, copies
    // happen at their start, semaphores are i32 counters.
    ("tpu.memref_slice", super::dma::memref_slice),
    ("tpu.memref_squeeze", super::dma::memref_squeeze),
    ("tpu.enqueue_dma", super::dma::enqueue_dma),
    ("tpu.wait_dma", super::dma::wait_dma),
    ("tpu.sem_signal", super::dma::sem_signal),
    ("tpu.sem_wait", super::dma::sem_wait),
    ("tpu.sem_read", super::dma::sem_read),
    // `run_scoped` (`scope.rs`): the region written in place; its allocations fresh (zeroed) at every
    // entry, its semaphores checked back at zero at its end.
    ("tpu.region", super::scope::region),
    ("memref.alloca", super::scope::alloca),
    ("tpu.sem_alloc", super::scope::sem_alloc),
    ("tpu.yield", super::scope::yield_op),
    // n-D vector ops (upstream, but not lowered to LLVM for n-D vectors): loops over the buffers.
    ("vector.load", vector_load),
    ("vector.broadcast", broadcast),
    ("vector.shape_cast", shape_cast),
    ("vector.multi_reduction", multi_reduction),
    ("vector.extract_strided_slice", extract_strided_slice),
    // One element of a ref (SMEM): bounds-checked scalar loads and stores.
    ("memref.load", super::memref::load),
    ("memref.store", super::memref::store),
    // Constants: scalars kept, vector splats become filled buffers.
    ("arith.constant", constant),
    // Structure: kept (types mapped, regions rewritten); `scf.for` checks its step first.
    ("scf.for", for_loop),
    ("scf.if", keep),
    ("scf.while", keep),
    ("scf.yield", keep),
    ("scf.condition", keep),
    ("func.return", keep),
];

/// Dialects whose ops are all element-wise (MLIR's `ElementwiseMappable`): kept on scalars, applied per
/// element on vectors, whatever the op — so ops added to the lowering later need no entry.
const ELEMENTWISE: &[&str] = &["arith.", "math."];

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

/// The rule for op `name`, if there is one.
pub(super) fn rule(name: &str) -> Option<Rule> {
    TABLE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, r)| *r)
        .or_else(|| {
            ELEMENTWISE
                .iter()
                .any(|d| name.starts_with(d))
                .then_some(elementwise as Rule)
        })
}

fn bad(op: OperationRef<'_, '_>, what: impl std::fmt::Display) -> crate::error::KernelError {
    kerr!(Lowering, "mosaic_cpu: `{}`: {what}", op_name(op))
}

fn mem(op: OperationRef<'_, '_>, v: &Val, what: &str) -> Result<(Vec<usize>, String)> {
    match &v.ty {
        Ty::Mem { shape, elem } => Ok((shape.clone(), elem.clone())),
        Ty::Scalar(t) => Err(bad(
            op,
            format!("{what} is a scalar ({t}), expected a vector"),
        )),
    }
}

fn scalar(name: String, ty: &str) -> Val {
    Val {
        name,
        ty: Ty::Scalar(ty.to_string()),
    }
}

/// A fresh buffer for result `i` of `op`, bound to it.
fn result_buffer(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<Val> {
    let ty = rw.result_ty(op, 0)?;
    if !matches!(ty, Ty::Mem { .. }) {
        return Err(bad(op, "expected a vector result"));
    }
    let name = rw.alloc(&ty);
    let v = Val { name, ty };
    rw.bind_result(op, 0, v.clone())?;
    Ok(v)
}

/// Row-major offset of `ivs` in a buffer of `shape`.
fn offset(rw: &mut Rewriter<'_>, ivs: &[String], shape: &[usize]) -> String {
    let terms: Vec<(String, usize)> = ivs.iter().cloned().zip(row_major(shape)).collect();
    rw.linear(&terms, None)
}

fn keep(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    rw.keep(op, &[])
}

fn elementwise(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
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

fn constant(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
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

/// `i1`: every window start of `starts` within `shape`; the window covers `sizes` (the trailing dims)
/// with `strides` between its elements; leading dims are single indices.
pub(super) fn window_in_bounds(
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
pub(super) fn not_in_hbm(op: OperationRef<'_, '_>, i: usize) -> Result<()> {
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

fn vector_load(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    not_in_hbm(op, 0)?;
    let operands = rw.operands(op)?;
    let Some((base, starts)) = operands.split_first() else {
        return Err(bad(op, "no operands"));
    };
    let (shape, elem) = mem(op, base, "the base")?;
    let ref_id = op
        .operand(0)
        .ok()
        .and_then(|v| rw.refs.get(&key(v)).copied());
    let out = result_buffer(rw, op)?;
    let (sizes, out_elem) = mem(op, &out, "the result")?;
    if starts.len() != shape.len() || sizes.len() > shape.len() || out_elem != elem {
        return Err(bad(op, "indices, shapes or element types do not match"));
    }
    let site = rw.site(
        op,
        SiteKind::Load {
            sizes: sizes.clone(),
            shape: shape.clone(),
        },
        ref_id,
    );
    let ok = window_in_bounds(rw, starts, &shape, &sizes, &vec![1; sizes.len()]);
    let ref_strides = row_major(&shape);
    let lead = shape.len() - sizes.len();
    rw.if_else(
        &ok,
        |rw| {
            let terms: Vec<(String, usize)> = starts
                .iter()
                .map(|s| s.name.clone())
                .zip(ref_strides.iter().copied())
                .collect();
            let start = rw.linear(&terms, None);
            rw.nest(&sizes, |rw, ivs| {
                let terms: Vec<(String, usize)> = ivs
                    .iter()
                    .cloned()
                    .zip(ref_strides[lead..].iter().copied())
                    .collect();
                let src = rw.linear(&terms, Some(start.clone()));
                let dst = offset(rw, ivs, &sizes);
                let x = rw.load(base, &src);
                rw.store(&x, &out, &dst);
                Ok(())
            })
        },
        |rw| rw.record(site, starts),
    )
}

fn vector_store(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    not_in_hbm(op, 1)?;
    // Operands: value, base, indices..., [mask] — split as the op's segment sizes say.
    let seg = i32_array(op, "operandSegmentSizes")?;
    let operands = rw.operands(op)?;
    let [1, 1, n_idx, n_mask] = seg[..] else {
        return Err(bad(op, format!("operand segments {seg:?}")));
    };
    let (n_idx, n_mask) = (n_idx as usize, n_mask as usize);
    if n_mask > 1 || 2 + n_idx + n_mask != operands.len() {
        return Err(bad(op, format!("operand segments {seg:?}")));
    }
    let (value, base) = (&operands[0], &operands[1]);
    let starts = &operands[2..2 + n_idx];
    let mask = operands.get(2 + n_idx).filter(|_| n_mask == 1);
    let (sizes, velem) = mem(op, value, "the value")?;
    let (shape, elem) = mem(op, base, "the base")?;
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
    let ref_id = op
        .operand(1)
        .ok()
        .and_then(|v| rw.refs.get(&key(v)).copied());
    let site = rw.site(
        op,
        SiteKind::Store {
            sizes: sizes.clone(),
            shape: shape.clone(),
        },
        ref_id,
    );
    let ok = window_in_bounds(rw, starts, &shape, &sizes, &strides);
    let ref_strides = row_major(&shape);
    rw.if_else(
        &ok,
        |rw| {
            let terms: Vec<(String, usize)> = starts
                .iter()
                .map(|s| s.name.clone())
                .zip(ref_strides.iter().copied())
                .collect();
            let start = rw.linear(&terms, None);
            rw.nest(&sizes, |rw, ivs| {
                let terms: Vec<(String, usize)> = ivs
                    .iter()
                    .enumerate()
                    .map(|(k, iv)| (iv.clone(), strides[k] * ref_strides[lead + k]))
                    .collect();
                let dst = rw.linear(&terms, Some(start.clone()));
                let src = offset(rw, ivs, &sizes);
                let x = rw.load(value, &src);
                match mask {
                    Some(m) => {
                        let keep = rw.load(m, &src);
                        rw.if_else(
                            &keep,
                            |rw| {
                                rw.store(&x, base, &dst);
                                Ok(())
                            },
                            |_| Ok(()),
                        )
                    }
                    None => {
                        rw.store(&x, base, &dst);
                        Ok(())
                    }
                }
            })
        },
        |rw| rw.record(site, starts),
    )
}

fn broadcast(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
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
            rw.nest(&shape, |rw, ivs| {
                // Source dims of size 1 are stretched (index 0).
                let terms: Vec<(String, usize)> = sshape
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| **s != 1)
                    .map(|(k, _)| (ivs[lead + k].clone(), sstrides[k]))
                    .collect();
                let from = rw.linear(&terms, None);
                let to = offset(rw, ivs, &shape);
                let x = rw.load(src, &from);
                rw.store(&x, &out, &to);
                Ok(())
            })
        }
    }
}

fn shape_cast(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
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

/// Widen `x` of element type `from` to `to` (floats `extf`, integers `extsi`); `x` if they agree.
fn widen(rw: &mut Rewriter<'_>, x: &str, from: &str, to: &str) -> String {
    if from == to {
        return x.to_string();
    }
    let op = if is_float(from) { "extf" } else { "extsi" };
    let r = rw.fresh();
    rw.line(format!("{r} = arith.{op} {x} : {from} to {to}"));
    r
}

fn narrow(rw: &mut Rewriter<'_>, x: &str, from: &str, to: &str) -> String {
    if from == to {
        return x.to_string();
    }
    let op = if is_float(from) { "truncf" } else { "trunci" };
    let r = rw.fresh();
    rw.line(format!("{r} = arith.{op} {x} : {from} to {to}"));
    r
}

/// What float accumulations run in: f32 for narrower floats (bf16 sums are rounded once, at the end,
/// as the interpreter and the MXU do), the element type otherwise.
fn accumulator(elem: &str) -> &str {
    if is_float(elem) && elem != "f64" {
        "f32"
    } else {
        elem
    }
}

fn multi_reduction(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
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

fn iota(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let dims = i32_array(op, "dimensions")?;
    let out = result_buffer(rw, op)?;
    let (shape, elem) = mem(op, &out, "the result")?;
    let [d] = dims[..] else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: tpu.iota over dimensions {dims:?} (one dimension is supported)"
        ));
    };
    let d = usize::try_from(d)
        .ok()
        .filter(|d| *d < shape.len())
        .ok_or_else(|| {
            bad(
                op,
                format!("dimension {d} of a rank-{} result", shape.len()),
            )
        })?;
    if is_float(&elem) {
        return Err(bad(op, "a float iota"));
    }
    rw.nest(&shape, |rw, ivs| {
        let v = rw.fresh();
        rw.line(format!(
            "{v} = arith.index_cast {} : index to {elem}",
            ivs[d]
        ));
        let at = offset(rw, ivs, &shape);
        rw.store(&v, &out, &at);
        Ok(())
    })
}

fn transpose(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let perm: Vec<usize> = i64_array(op, "permutation")?
        .into_iter()
        .map(|p| p as usize)
        .collect();
    let (sshape, _) = mem(op, src, "the source")?;
    let out = result_buffer(rw, op)?;
    let (shape, _) = mem(op, &out, "the result")?;
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..sshape.len()).collect::<Vec<_>>()
        || shape.len() != perm.len()
        || perm.iter().enumerate().any(|(d, p)| shape[d] != sshape[*p])
    {
        return Err(bad(
            op,
            format!("permutation {perm:?} does not map {sshape:?} to {shape:?}"),
        ));
    }
    let sstrides = row_major(&sshape);
    rw.nest(&shape, |rw, ivs| {
        // Result dim d is source dim perm[d].
        let terms: Vec<(String, usize)> = ivs
            .iter()
            .enumerate()
            .map(|(d, iv)| (iv.clone(), sstrides[perm[d]]))
            .collect();
        let from = rw.linear(&terms, None);
        let to = offset(rw, ivs, &shape);
        let x = rw.load(src, &from);
        rw.store(&x, &out, &to);
        Ok(())
    })
}

/// `tpu.logistic`: `1 / (1 + e^-x)`, one op on the TPU — computed in f32 and rounded once.
fn logistic(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    per_element(rw, op, &mut |rw, args, ty| {
        let [x] = args else {
            return Err(kerr!(
                Lowering,
                "mosaic_cpu: tpu.logistic takes one operand"
            ));
        };
        if !is_float(ty) {
            return Err(kerr!(Lowering, "mosaic_cpu: tpu.logistic on {ty}"));
        }
        let f = accumulator(ty).to_string();
        let x = widen(rw, &x.name, ty, &f);
        let one = rw.constant(&format!("1.0 : {f}"), &f);
        let v = |name: &str| scalar(name.to_string(), &f);
        let minus = scalar_op(rw, "arith.negf", &[v(&x)], &f, "")?;
        let e = scalar_op(rw, "math.exp", &[v(&minus)], &f, "")?;
        let d = scalar_op(rw, "arith.addf", &[v(&one), v(&e)], &f, "")?;
        let r = scalar_op(rw, "arith.divf", &[v(&one), v(&d)], &f, "")?;
        Ok(narrow(rw, &r, &f, ty))
    })
}

/// `tpu.trace_start` / `tpu.trace_stop`: XProf region markers, nothing to compute.
fn profiler_marker(_: &mut Rewriter<'_>, _: OperationRef<'_, '_>) -> Result<()> {
    Ok(())
}

fn assume_multiple(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [x] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let Ty::Scalar(t) = &x.ty else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: tpu.assume_multiple on a vector"
        ));
    };
    let m = int_attr(op, "multiple")?;
    if m <= 0 {
        return Err(bad(op, format!("multiple {m}")));
    }
    // The hint is a promise the TPU compiler builds on: check it.
    let site = rw.site(op, SiteKind::AssumeMultiple(m), None);
    let c = rw.int(m, t);
    let rem = rw.fresh();
    rw.line(format!("{rem} = arith.remsi {}, {c} : {t}", x.name));
    let zero = rw.int(0, t);
    let off = rw.fresh();
    rw.line(format!("{off} = arith.cmpi ne, {rem}, {zero} : {t}"));
    rw.if_else(
        &off,
        |rw| rw.record(site, std::slice::from_ref(x)),
        |_| Ok(()),
    )?;
    rw.bind_result(op, 0, x.clone())
}

fn for_loop(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let Some(step) = operands.get(2) else {
        return Err(bad(op, "expected bounds and a step"));
    };
    let t = step.ty.text();
    // A step ≤ 0 never ends: report it and run the loop with step 1 instead.
    let site = rw.site(op, SiteKind::ForStep, None);
    let zero = rw.int(0, &t);
    let stuck = rw.fresh();
    rw.line(format!(
        "{stuck} = arith.cmpi sle, {}, {zero} : {t}",
        step.name
    ));
    rw.if_else(
        &stuck,
        |rw| rw.record(site, std::slice::from_ref(step)),
        |_| Ok(()),
    )?;
    let one = rw.int(1, &t);
    let safe = rw.fresh();
    rw.line(format!(
        "{safe} = arith.select {stuck}, {one}, {} : {t}",
        step.name
    ));
    rw.keep(op, &[(2, scalar(safe, &t))])
}

/// `#tpu.dot_dimension_numbers<[lhs contracting], [rhs contracting], [lhs non-contracting],
/// [rhs non-contracting], [output dim order: (operand, dim) pairs], [lhs batch], [rhs batch]>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DotDims {
    pub lhs_contracting: Vec<usize>,
    pub rhs_contracting: Vec<usize>,
    pub lhs_free: Vec<usize>,
    pub rhs_free: Vec<usize>,
    /// Each output dim: (0 = lhs / 1 = rhs, dim of that operand).
    pub output: Vec<(usize, usize)>,
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
}

impl DotDims {
    pub fn parse(text: &str) -> Option<DotDims> {
        let body = text
            .trim()
            .strip_prefix("#tpu.dot_dimension_numbers<")?
            .strip_suffix('>')?;
        let mut lists = Vec::new();
        let mut rest = body;
        while let Some(open) = rest.find('[') {
            let close = rest[open..].find(']')? + open;
            let items = rest[open + 1..close].trim();
            let list: Vec<usize> = if items.is_empty() {
                Vec::new()
            } else {
                items
                    .split(',')
                    .map(|x| x.trim().parse().ok())
                    .collect::<Option<_>>()?
            };
            lists.push(list);
            rest = &rest[close + 1..];
        }
        let [lc, rc, lf, rf, out, lb, rb] = <[Vec<usize>; 7]>::try_from(lists).ok()?;
        if out.len() % 2 != 0 {
            return None;
        }
        Some(DotDims {
            lhs_contracting: lc,
            rhs_contracting: rc,
            lhs_free: lf,
            rhs_free: rf,
            output: out.chunks(2).map(|p| (p[0], p[1])).collect(),
            lhs_batch: lb,
            rhs_batch: rb,
        })
    }

    /// The result shape for operands of shapes `lhs` and `rhs`, if the numbers are consistent.
    fn result_shape(&self, lhs: &[usize], rhs: &[usize]) -> Option<Vec<usize>> {
        let partition = |contracting: &[usize], free: &[usize], rank: usize| {
            let mut all: Vec<usize> = contracting.iter().chain(free).copied().collect();
            all.sort_unstable();
            all == (0..rank).collect::<Vec<_>>()
        };
        let ok = self.lhs_batch.is_empty()
            && self.rhs_batch.is_empty()
            && self.lhs_contracting.len() == self.rhs_contracting.len()
            && partition(&self.lhs_contracting, &self.lhs_free, lhs.len())
            && partition(&self.rhs_contracting, &self.rhs_free, rhs.len())
            && self
                .lhs_contracting
                .iter()
                .zip(&self.rhs_contracting)
                .all(|(l, r)| lhs[*l] == rhs[*r]);
        // The output lists every free dim of both operands exactly once.
        let mut listed: Vec<(usize, usize)> = self.output.clone();
        listed.sort_unstable();
        let mut free: Vec<(usize, usize)> = self
            .lhs_free
            .iter()
            .map(|d| (0, *d))
            .chain(self.rhs_free.iter().map(|d| (1, *d)))
            .collect();
        free.sort_unstable();
        (ok && listed == free).then(|| {
            self.output
                .iter()
                .map(|&(o, d)| if o == 0 { lhs[d] } else { rhs[d] })
                .collect()
        })
    }
}

fn matmul(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [lhs, rhs, acc] = &operands[..] else {
        return Err(bad(op, "expected lhs, rhs and acc"));
    };
    for flag in ["transpose_lhs", "transpose_rhs"] {
        if let Ok(a) = op.attribute(flag) {
            if a.to_string() != "false" {
                return Err(kerr!(
                    Unsupported,
                    "mosaic_cpu: tpu.matmul with `{flag}` (the dimension numbers say it)"
                ));
            }
        }
    }
    let dn_text = attr(op, "dimension_numbers")?.to_string();
    let dn = DotDims::parse(&dn_text)
        .ok_or_else(|| bad(op, format!("cannot read the dimension numbers `{dn_text}`")))?;
    let (ls, lelem) = mem(op, lhs, "lhs")?;
    let (rs, relem) = mem(op, rhs, "rhs")?;
    let (as_, aelem) = mem(op, acc, "acc")?;
    let shape = dn.result_shape(&ls, &rs).ok_or_else(|| {
        bad(
            op,
            format!("{dn_text} does not fit lhs {ls:?} and rhs {rs:?}"),
        )
    })?;
    if as_ != shape || is_float(&lelem) != is_float(&aelem) || is_float(&relem) != is_float(&aelem)
    {
        return Err(bad(
            op,
            format!("acc {as_:?} {aelem} does not fit the product {shape:?} of {lelem} × {relem}"),
        ));
    }
    let out = result_buffer(rw, op)?;
    if out.ty.shape() != Some(&shape[..]) || out.ty.elem() != aelem {
        return Err(bad(op, "the result type differs from the accumulator's"));
    }
    let sum_ty = accumulator(&aelem).to_string();
    let (mul, add) = if is_float(&aelem) {
        ("arith.mulf", "arith.addf")
    } else {
        ("arith.muli", "arith.addi")
    };
    let k_shape: Vec<usize> = dn.lhs_contracting.iter().map(|&d| ls[d]).collect();
    let (lstr, rstr) = (row_major(&ls), row_major(&rs));
    // Offset of an operand element: contracting dims from the k loop, free dims from the output.
    let place = |operand: usize,
                 contracting: &[usize],
                 rank: usize,
                 strides: &[usize],
                 oivs: &[String],
                 kivs: &[String]|
     -> Vec<(String, usize)> {
        (0..rank)
            .map(|d| {
                let iv = match contracting.iter().position(|c| *c == d) {
                    Some(p) => kivs[p].clone(),
                    None => {
                        let p = dn
                            .output
                            .iter()
                            .position(|o| *o == (operand, d))
                            .unwrap_or(0);
                        oivs[p].clone()
                    }
                };
                (iv, strides[d])
            })
            .collect()
    };
    rw.nest(&shape, |rw, oivs| {
        let at = offset(rw, oivs, &shape);
        let a0 = rw.load(acc, &at);
        let init = widen(rw, &a0, &aelem, &sum_ty);
        let r = rw.nest_acc(&k_shape, init, &sum_ty, &mut |rw, kivs, a| {
            let lt = place(0, &dn.lhs_contracting, ls.len(), &lstr, oivs, kivs);
            let rt = place(1, &dn.rhs_contracting, rs.len(), &rstr, oivs, kivs);
            let (lo, ro) = (rw.linear(&lt, None), rw.linear(&rt, None));
            let x = rw.load(lhs, &lo);
            let y = rw.load(rhs, &ro);
            let x = widen(rw, &x, &lelem, &sum_ty);
            let y = widen(rw, &y, &relem, &sum_ty);
            let p = scalar_op(
                rw,
                mul,
                &[scalar(x, &sum_ty), scalar(y, &sum_ty)],
                &sum_ty,
                "",
            )?;
            scalar_op(
                rw,
                add,
                &[scalar(a.to_string(), &sum_ty), scalar(p, &sum_ty)],
                &sum_ty,
                "",
            )
        })?;
        let r = narrow(rw, &r, &sum_ty, &aelem);
        rw.store(&r, &out, &at);
        Ok(())
    })
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
fn extract_strided_slice(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
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
    rw.nest(&shape, |rw, ivs| {
        let base = rw.constant(&format!("{base} : index"), "index");
        let terms: Vec<(String, usize)> = ivs
            .iter()
            .enumerate()
            .map(|(d, iv)| (iv.clone(), sstrides[d] * step(d)))
            .collect();
        let from = rw.linear(&terms, Some(base));
        let to = offset(rw, ivs, &shape);
        let x = rw.load(src, &from);
        rw.store(&x, &out, &to);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::DotDims;

    #[test]
    fn dimension_numbers_read_as_mosaic_prints_them() {
        let d =
            DotDims::parse("#tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>")
                .expect("parse");
        assert_eq!(d.lhs_contracting, vec![1]);
        assert_eq!(d.rhs_contracting, vec![0]);
        assert_eq!(d.output, vec![(0, 0), (1, 1)]);
        assert_eq!(d.result_shape(&[8, 16], &[16, 32]), Some(vec![8, 32]));
        // dot_nt: rhs contracted on its dim 1.
        let nt =
            DotDims::parse("#tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>")
                .expect("parse");
        assert_eq!(nt.result_shape(&[8, 16], &[32, 16]), Some(vec![8, 32]));
        assert_eq!(nt.result_shape(&[8, 16], &[16, 32]), None);
        assert!(DotDims::parse("#tpu.dot_dimension_numbers<[1], [0]>").is_none());
    }
}

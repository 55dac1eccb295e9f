//! One lowering rule per op family. Each appends Mosaic ops to `block` and binds the IR op's results.

use super::{vector_type_text, Lowerer};
use crate::dtype::{DType, Literal};
use crate::error::{kerr, Result};
use crate::ir::{
    ArgKind, BinaryOp, CmpOp, MemSpace, Op, OpKind, ReduceKind, Start, Type, UnaryOp, ValueId,
    Window,
};
use crate::mosaic::{MBlock, MOp, MType, MValue};

mod control;
mod dma;
pub(super) mod elementwise;
mod memory;

use control::{for_, if_, terminator, while_};
use elementwise::{binary, unary};
use memory::{load, store};

/// Dispatch an op to its rule.
pub(crate) fn lower_op(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op) -> Result<()> {
    match &op.kind {
        OpKind::Const(l) => constant(lw, block, op, *l),
        OpKind::Unary(u) => unary(lw, block, op, *u),
        OpKind::Composite(c) => Err(kerr!(
            Lowering,
            "composite `{}` reached lowering: `build()` expands composites for the target",
            c.name()
        )),
        OpKind::Binary(b) => binary(lw, block, op, *b),
        OpKind::Compare(c) => compare(lw, block, op, *c),
        OpKind::Select => simple(lw, block, op, "arith.select", &[]),
        OpKind::Cast(to) => cast(lw, block, op, *to),
        OpKind::Broadcast => simple(lw, block, op, "vector.broadcast", &[]),
        OpKind::Iota { dim } => simple(
            lw,
            block,
            op,
            "tpu.iota",
            &[("dimensions", format!("array<i32: {dim}>"))],
        ),
        OpKind::Reshape => simple(lw, block, op, "vector.shape_cast", &[]),
        OpKind::Transpose { perm } => {
            let p = join(perm);
            simple(
                lw,
                block,
                op,
                "tpu.transpose",
                &[("permutation", format!("array<i64: {p}>"))],
            )
        }
        OpKind::Reduce {
            kind,
            axes,
            keepdims,
        } => reduce(lw, block, op, *kind, axes, *keepdims),
        OpKind::Dot {
            transpose_lhs,
            transpose_rhs,
        } => dot(lw, block, op, *transpose_lhs, *transpose_rhs),
        OpKind::Load(w) => load(lw, block, op, w),
        OpKind::Store { window, masked } => store(lw, block, op, window, *masked),
        OpKind::RefView(w) => dma::ref_view(lw, block, op, w),
        // Pallas's `_bitcast_memref` / `_reshape_memref`: the view's type says it all.
        OpKind::RefBitcast => simple(lw, block, op, "tpu.memref_bitcast", &[]),
        OpKind::RefReshape => simple(lw, block, op, "tpu.memref_reshape", &[]),
        // `pltpu.bitcast` along the second-to-last dimension (its default).
        OpKind::Bitcast => simple(lw, block, op, "tpu.bitcast", &[]),
        OpKind::TraceStart(name) => simple(
            lw,
            block,
            op,
            "tpu.trace_start",
            &[
                ("level", "10 : i32".into()),
                ("message", format!("{name:?}")),
            ],
        ),
        OpKind::TraceStop => simple(lw, block, op, "tpu.trace_stop", &[]),
        OpKind::Scoped => dma::scoped(lw, block, op),
        OpKind::DmaStart => dma::dma(lw, block, op, false),
        OpKind::DmaWait => dma::dma(lw, block, op, true),
        OpKind::SemSignal => dma::semaphore(lw, block, op, "tpu.sem_signal"),
        OpKind::SemWait => dma::semaphore(lw, block, op, "tpu.sem_wait"),
        OpKind::SemRead => dma::semaphore(lw, block, op, "tpu.sem_read"),
        OpKind::SemSignalRemote => dma::semaphore(lw, block, op, "tpu.sem_signal"),
        OpKind::AxisIndex { stride, size } => dma::axis_index(lw, block, op, *stride, *size),
        OpKind::BarrierSemaphore => simple(lw, block, op, "tpu.sem_barrier", &[]),
        OpKind::RemoteDmaStart => dma::remote_dma(lw, block, op, None),
        OpKind::RemoteDmaWait { recv } => dma::remote_dma(lw, block, op, Some(*recv)),
        OpKind::MultipleOf(m) => simple(
            lw,
            block,
            op,
            "tpu.assume_multiple",
            &[("multiple", format!("{m} : i32"))],
        ),
        OpKind::If => if_(lw, block, op),
        OpKind::For => for_(lw, block, op),
        OpKind::While => while_(lw, block, op),
        OpKind::Yield => terminator(lw, block, op, "scf.yield"),
        OpKind::Condition => terminator(lw, block, op, "scf.condition"),
        OpKind::Return => terminator(lw, block, op, "func.return"),
        OpKind::Slice { offsets, sizes } => {
            let list = |v: &[usize]| {
                let items: Vec<String> = v.iter().map(|x| format!("{x} : i64")).collect();
                format!("[{}]", items.join(", "))
            };
            let attrs = [
                ("offsets", list(offsets)),
                ("sizes", list(sizes)),
                ("strides", list(&vec![1; sizes.len()])),
            ];
            simple(lw, block, op, "vector.extract_strided_slice", &attrs)
        }
        OpKind::Concatenate { dim } => {
            let attrs = [("dimension", format!("{dim} : i32"))];
            simple(lw, block, op, "tpu.concatenate", &attrs)
        }
        // Pallas lowers `pltpu.roll` to `tpu.dynamic_rotate` for a static shift too (a constant amount).
        OpKind::Roll { dim } => {
            let attrs = [("dimension", format!("{dim} : si32"))];
            simple(lw, block, op, "tpu.dynamic_rotate", &attrs)
        }
        OpKind::ArgReduce { kind, dim } => {
            let kind = match kind {
                ArgKind::Max => "#tpu.reduction_kind<arg_max>",
                ArgKind::Min => "#tpu.reduction_kind<arg_min>",
            };
            let attrs = [("axis", format!("{dim} : i32")), ("kind", kind.to_string())];
            simple(lw, block, op, "tpu.reduce_index", &attrs)
        }
    }
}

fn join(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Append `name(operands) {attrs} -> results` to `block`, returning its results.
fn emit(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    name: &'static str,
    operands: &[MValue],
    results: &[MType],
    attrs: &[(&'static str, String)],
) -> Result<Vec<MValue>> {
    let results: Vec<(MValue, MType)> = results.iter().map(|t| (lw.fresh(), t.clone())).collect();
    let out = results.iter().map(|(v, _)| *v).collect();
    block.push(MOp {
        name,
        loc: op.loc,
        operands: operands.to_vec(),
        results,
        attrs: attrs.to_vec(),
        regions: vec![],
    });
    Ok(out)
}

fn operands(lw: &Lowerer<'_>, ids: &[ValueId]) -> Result<Vec<MValue>> {
    ids.iter().map(|id| lw.v(*id)).collect()
}

fn result_type(lw: &Lowerer<'_>, op: &Op, i: usize) -> Result<MType> {
    let id = op
        .results
        .get(i)
        .ok_or_else(|| kerr!(Lowering, "op has no result {i}"))?;
    lw.ty(lw.func.ty(*id))
}

/// An op whose operands and results map one to one.
fn simple(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    name: &'static str,
    attrs: &[(&'static str, String)],
) -> Result<()> {
    let tys: Vec<MType> = (0..op.results.len())
        .map(|i| result_type(lw, op, i))
        .collect::<Result<_>>()?;
    let args = operands(lw, &op.operands)?;
    let res = emit(lw, block, op, name, &args, &tys, attrs)?;
    for (id, v) in op.results.iter().zip(res) {
        lw.bind(*id, v);
    }
    Ok(())
}

fn const_value(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    ty: &Type,
    l: Literal,
) -> Result<MValue> {
    let elem = l.dtype.mlir();
    let text = match ty {
        // An i1 scalar is MLIR's bool attribute, which carries its type (`true`, not `true : i1`).
        Type::Scalar(DType::Bool) => l.mlir(),
        Type::Scalar(_) => format!("{} : {elem}", l.mlir()),
        Type::Vector(s, _) => format!("dense<{}> : {}", l.mlir(), vector_type_text(s, elem)),
        Type::Ref(..) => return Err(kerr!(Lowering, "constant of ref type")),
    };
    let mty = lw.ty(ty)?;
    arith_constant(lw, block, op, mty, text)
}

fn index_const(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, v: usize) -> Result<MValue> {
    arith_constant(lw, block, op, MType::index(), format!("{v} : index"))
}

/// `arith.constant {value = <value>} : ty`.
fn arith_constant(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    ty: MType,
    value: String,
) -> Result<MValue> {
    Ok(emit(
        lw,
        block,
        op,
        "arith.constant",
        &[],
        &[ty],
        &[("value", value)],
    )?[0])
}

fn constant(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, l: Literal) -> Result<()> {
    let ty = lw.func.ty(op.results[0]).clone();
    let v = const_value(lw, block, op, &ty, l)?;
    lw.bind(op.results[0], v);
    Ok(())
}

fn compare(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, c: CmpOp) -> Result<()> {
    let d = lw.func.ty(op.operands[0]).dtype();
    if d.is_float() && c == CmpOp::Ne {
        let (x, y) = (lw.v(op.operands[0])?, lw.v(op.operands[1])?);
        let r = float_ne(lw, block, op, x, y)?;
        lw.bind(op.results[0], r);
        return Ok(());
    }
    // arith.cmpf / arith.cmpi predicate numbers (ordered float compares, like XLA).
    let (name, pred) = if d.is_float() {
        let p = match c {
            CmpOp::Eq => 1,
            CmpOp::Gt => 2,
            CmpOp::Ge => 3,
            CmpOp::Lt => 4,
            CmpOp::Le => 5,
            CmpOp::Ne => unreachable!("float != is lowered by float_ne"),
        };
        ("arith.cmpf", p)
    } else {
        let u = d.is_unsigned() || d == DType::Bool;
        let p = match c {
            CmpOp::Eq => 0,
            CmpOp::Ne => 1,
            CmpOp::Lt if u => 6,
            CmpOp::Le if u => 7,
            CmpOp::Gt if u => 8,
            CmpOp::Ge if u => 9,
            CmpOp::Lt => 2,
            CmpOp::Le => 3,
            CmpOp::Gt => 4,
            CmpOp::Ge => 5,
        };
        ("arith.cmpi", p)
    };
    simple(
        lw,
        block,
        op,
        name,
        &[("predicate", format!("{pred} : i64"))],
    )
}

/// Float `x != y`, true when either is NaN (IEEE, XLA): `!(x oeq y)`. libtpu's Mosaic accepts only
/// ordered predicates (`une` is rejected: "Unsupported comparison direction"), and Pallas's `one` would
/// make `x != NaN` false — so `jnp.isnan` (`x != x`) could never be true.
fn float_ne(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    x: MValue,
    y: MValue,
) -> Result<MValue> {
    let bool_ty = lw.func.ty(op.results[0]).with_dtype(DType::Bool);
    let mty = lw.ty(&bool_ty)?;
    let eq = emit(
        lw,
        block,
        op,
        "arith.cmpf",
        &[x, y],
        std::slice::from_ref(&mty),
        &[("predicate", "1 : i64".into())],
    )?[0];
    let all_true = const_value(lw, block, op, &bool_ty, Literal::from_i64(DType::Bool, 1))?;
    Ok(emit(lw, block, op, "arith.xori", &[eq, all_true], &[mty], &[])?[0])
}

fn cast(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, to: DType) -> Result<()> {
    let from_ty = lw.func.ty(op.operands[0]).clone();
    let from = from_ty.dtype();
    let name = match (from, to) {
        _ if from.mlir() == to.mlir() => {
            // Same bits, different signedness (i32 <-> u32): no op.
            return lw.alias(op.results[0], op.operands[0]);
        }
        (f, t) if f.is_float() && t.is_float() => {
            if f.bit_width() < t.bit_width() {
                "arith.extf"
            } else if f.bit_width() > t.bit_width() {
                "arith.truncf"
            } else {
                // bf16 <-> f16: through f32 (exact), rounded once by the `truncf`.
                let x = lw.v(op.operands[0])?;
                let shape = from_ty.shape().to_vec();
                let wide = MType::Plain(vector_type_text(&shape, DType::F32.mlir()).into());
                let w = emit(lw, block, op, "arith.extf", &[x], &[wide], &[])?[0];
                let rty = result_type(lw, op, 0)?;
                let r = emit(lw, block, op, "arith.truncf", &[w], &[rty], &[])?[0];
                lw.bind(op.results[0], r);
                return Ok(());
            }
        }
        (DType::Bool, t) if t.is_float() => "arith.uitofp",
        (f, t) if f.is_int() && t.is_float() => {
            if f.is_unsigned() {
                "arith.uitofp"
            } else {
                "arith.sitofp"
            }
        }
        (f, t) if f.is_float() && t.is_int() => {
            if t.is_unsigned() {
                "arith.fptoui"
            } else {
                "arith.fptosi"
            }
        }
        (f, DType::Bool) => {
            // x != 0
            let zero = const_value(lw, block, op, &from_ty, Literal::zero(f))?;
            let x = lw.v(op.operands[0])?;
            if f.is_float() {
                let r = float_ne(lw, block, op, x, zero)?;
                lw.bind(op.results[0], r);
                return Ok(());
            }
            let (name, pred) = ("arith.cmpi", 1);
            let rty = result_type(lw, op, 0)?;
            let r = emit(
                lw,
                block,
                op,
                name,
                &[x, zero],
                &[rty],
                &[("predicate", format!("{pred} : i64"))],
            )?[0];
            lw.bind(op.results[0], r);
            return Ok(());
        }
        (f, t) if f.bit_width() < t.bit_width() => {
            if f.is_unsigned() || f == DType::Bool {
                "arith.extui"
            } else {
                "arith.extsi"
            }
        }
        _ => "arith.trunci",
    };
    simple(lw, block, op, name, &[])
}

fn reduce(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
) -> Result<()> {
    let src_ty = lw.func.ty(op.operands[0]).clone();
    let d = src_ty.dtype();
    let reduced: Vec<usize> = src_ty
        .shape()
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, n)| *n)
        .collect();
    let acc_ty = if reduced.is_empty() {
        Type::Scalar(d)
    } else {
        Type::Vector(reduced.clone(), d)
    };
    let (kind_name, init) = match (kind, d.is_float(), d.is_unsigned()) {
        (ReduceKind::Sum, _, _) => ("add", Literal::zero(d)),
        (ReduceKind::Max, true, _) => ("maximumf", Literal::from_f64(d, f64::NEG_INFINITY)),
        (ReduceKind::Min, true, _) => ("minimumf", Literal::from_f64(d, f64::INFINITY)),
        (ReduceKind::Max, false, true) => ("maxui", Literal::zero(d)),
        (ReduceKind::Min, false, true) => ("minui", Literal::from_i64(d, -1)),
        (ReduceKind::Max, false, false) => ("maxsi", Literal::from_i64(d, min_signed(d))),
        (ReduceKind::Min, false, false) => ("minsi", Literal::from_i64(d, -min_signed(d) - 1)),
    };
    let acc = const_value(lw, block, op, &acc_ty, init)?;
    let src = lw.v(op.operands[0])?;
    let acc_mty = lw.ty(&acc_ty)?;
    let attrs = [
        ("kind", format!("#vector.kind<{kind_name}>")),
        ("reduction_dims", format!("array<i64: {}>", join(axes))),
    ];
    let r = emit(
        lw,
        block,
        op,
        "vector.multi_reduction",
        &[src, acc],
        &[acc_mty],
        &attrs,
    )?[0];
    let out_ty = lw.func.ty(op.results[0]).clone();
    if !keepdims || out_ty == acc_ty {
        lw.bind(op.results[0], r);
        return Ok(());
    }
    let name = if reduced.is_empty() {
        "vector.broadcast"
    } else {
        "vector.shape_cast"
    };
    let mty = lw.ty(&out_ty)?;
    let v = emit(lw, block, op, name, &[r], &[mty], &[])?[0];
    lw.bind(op.results[0], v);
    Ok(())
}

fn min_signed(d: DType) -> i64 {
    -(1i64 << (d.bit_width() - 1))
}

fn dot(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, tl: bool, tr: bool) -> Result<()> {
    let out_ty = lw.func.ty(op.results[0]).clone();
    let acc = match op.operands.get(2) {
        Some(a) => lw.v(*a)?,
        None => const_value(lw, block, op, &out_ty, Literal::zero(out_ty.dtype()))?,
    };
    let (lc, lnc) = if tl { (0, 1) } else { (1, 0) };
    let (rc, rnc) = if tr { (1, 0) } else { (0, 1) };
    let dn = format!("#tpu.dot_dimension_numbers<[{lc}], [{rc}], [{lnc}], [{rnc}], [0, {lnc}, 1, {rnc}], [], []>");
    let (x, y) = (lw.v(op.operands[0])?, lw.v(op.operands[1])?);
    let mty = lw.ty(&out_ty)?;
    let attrs = [
        ("dimension_numbers", dn),
        ("transpose_lhs_hint", "false".to_string()),
    ];
    let r = emit(lw, block, op, "tpu.matmul", &[x, y, acc], &[mty], &attrs)?[0];
    lw.bind(op.results[0], r);
    Ok(())
}

//! Ref windows, DMA and semaphores: `tpu.memref_slice` / `tpu.memref_squeeze` (a [`RefView`] into a
//! kernel ref's buffer, bounds-checked), `tpu.enqueue_dma` / `tpu.wait_dma`, `tpu.sem_signal` /
//! `sem_wait` / `sem_read`.
//!
//! A synchronous model: `tpu.enqueue_dma` copies its source window into its target window at once and
//! adds the copy's bytes to its DMA semaphore; `tpu.wait_dma` takes its descriptor's bytes from the
//! semaphore (semaphores count bytes, as on TPU and in `crate::semantics::dma`). For a kernel without
//! races (the interpreter checks them: a destination read or a source written while its copy is in
//! flight) the point of the copy between its start and its wait cannot change a result. A semaphore
//! is an `i32` counter in its scratch buffer, persisting across grid steps like any scratch; a wait
//! that cannot be satisfied now never will be (nothing runs concurrently on one core), so it is a
//! `Deadlock` at the op, as in the interpreter.

use super::rewrite::{i32_array, op_name, RefView, Rewriter, SiteKind, Space, Ty, Val};
use super::rules::window_in_bounds;
use crate::dtype::DType;
use crate::error::{kerr, Result};
use crate::semantics::dma::copy_bytes;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::{Value, ValueLike};

fn bad(op: OperationRef<'_, '_>, what: impl std::fmt::Display) -> crate::error::KernelError {
    kerr!(Lowering, "mosaic_cpu: `{}`: {what}", op_name(op))
}

fn index(name: String) -> Val {
    Val {
        name,
        ty: Ty::Scalar("index".into()),
    }
}

fn operand<'c, 'a>(op: OperationRef<'c, 'a>, i: usize) -> Result<Value<'c, 'a>> {
    op.operand(i)
        .map_err(|_| bad(op, format!("expected an operand {i}")))
}

/// The operands of `op`, whose `operandSegmentSizes` must be `want` (the optional segments — remote
/// devices, other cores — are not supported).
fn segments<'c, 'a>(
    op: OperationRef<'c, 'a>,
    want: &[i64],
    what: &str,
) -> Result<Vec<Value<'c, 'a>>> {
    let seg = i32_array(op, "operandSegmentSizes")?;
    if seg != want {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: `{}` with operand segments {seg:?} (only {want:?}: {what})",
            op_name(op)
        ));
    }
    (0..op.operand_count()).map(|i| operand(op, i)).collect()
}

/// `tpu.memref_slice %base[%starts...]` (i32 starts, one per base dim, static sizes from the result
/// type): a window of the base. Out of bounds, the check is recorded and the window placed at the
/// base's origin (it fits there: its sizes are at most the base's), so nothing past a buffer is
/// touched while the failing step runs to its end.
pub(super) fn memref_slice(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let seg = i32_array(op, "operandSegmentSizes")?;
    let [1, n_starts, 0] = seg[..] else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: `tpu.memref_slice` with operand segments {seg:?} (dynamic sizes are not supported)"
        ));
    };
    let base = rw.view(operand(op, 0)?)?;
    let starts: Vec<Val> = (1..1 + n_starts as usize)
        .map(|i| rw.val(operand(op, i)?))
        .collect::<Result<_>>()?;
    let sizes = rw
        .result_ty(op, 0)?
        .shape()
        .ok_or_else(|| bad(op, "the result is not a ref"))?
        .to_vec();
    if starts.len() != base.shape.len()
        || sizes.len() != base.shape.len()
        || sizes.iter().zip(&base.shape).any(|(s, n)| s > n)
    {
        return Err(bad(
            op,
            format!(
                "{} starts and a window of {sizes:?} for a base of shape {:?}",
                starts.len(),
                base.shape
            ),
        ));
    }
    let mut at = Vec::with_capacity(starts.len());
    for s in &starts {
        let t = s.ty.text();
        if t == "index" {
            at.push(s.clone());
        } else {
            let i = rw.fresh();
            rw.line(format!("{i} = arith.index_cast {} : {t} to index", s.name));
            at.push(index(i));
        }
    }
    let site = rw.site(
        op,
        SiteKind::Slice {
            sizes: sizes.clone(),
            shape: base.shape.clone(),
        },
        base.ref_id,
    );
    let ok = window_in_bounds(rw, &at, &base.shape, &sizes, &vec![1; sizes.len()]);
    rw.if_else(&ok, |_| Ok(()), |rw| rw.record(site, &at))?;
    let terms: Vec<(String, usize)> = at
        .iter()
        .map(|s| s.name.clone())
        .zip(base.strides.iter().copied())
        .collect();
    let offset = rw.linear(&terms, Some(base.offset.clone()));
    let safe = rw.fresh();
    rw.line(format!(
        "{safe} = arith.select {ok}, {offset}, {} : index",
        base.offset
    ));
    let view = RefView {
        offset: safe,
        shape: sizes,
        ..base
    };
    rw.bind_view(
        op.result(0).map_err(|_| bad(op, "expected a result"))?,
        view,
    );
    Ok(())
}

/// `tpu.memref_squeeze`: the same window without (some of) its size-1 dims. A size-1 dim has only
/// index 0, so its stride never matters: which of several size-1 dims go does not change the view.
pub(super) fn memref_squeeze(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let base = rw.view(operand(op, 0)?)?;
    let want = rw
        .result_ty(op, 0)?
        .shape()
        .ok_or_else(|| bad(op, "the result is not a ref"))?
        .to_vec();
    let (mut shape, mut strides) = (Vec::new(), Vec::new());
    for (&n, &s) in base.shape.iter().zip(&base.strides) {
        if want.get(shape.len()) == Some(&n) {
            shape.push(n);
            strides.push(s);
        } else if n != 1 {
            break;
        }
    }
    if shape != want {
        return Err(bad(
            op,
            format!("{want:?} is not {:?} without size-1 dims", base.shape),
        ));
    }
    let view = RefView {
        shape,
        strides,
        ..base
    };
    rw.bind_view(
        op.result(0).map_err(|_| bad(op, "expected a result"))?,
        view,
    );
    Ok(())
}

/// The element offset of an element of `v` (`ivs`: one `index` per dim).
fn element(rw: &mut Rewriter<'_>, v: &RefView, ivs: &[String]) -> String {
    let terms: Vec<(String, usize)> = ivs.iter().cloned().zip(v.strides.iter().copied()).collect();
    rw.linear(&terms, Some(v.offset.clone()))
}

/// A single semaphore (of kind `kind`): the view of operand `value`, checked.
fn semaphore(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    value: Value<'_, '_>,
    kind: Option<Space>,
) -> Result<RefView> {
    let space = super::rewrite::ref_space(value.r#type())?;
    let ok = match kind {
        Some(k) => space == Some(k),
        None => space.is_some_and(Space::is_semaphore),
    };
    let v = rw.view(value)?;
    if !ok || !v.shape.is_empty() || v.root.ty.elem() != "i32" {
        return Err(bad(
            op,
            format!("expected one semaphore, got {}", value.r#type()),
        ));
    }
    Ok(v)
}

/// `tpu.enqueue_dma source → target, signalling target_semaphore`: the copy, element by element
/// (through a temporary when both windows are in one buffer, so an overlapping copy reads the source
/// as it was), then one more on the semaphore.
pub(super) fn enqueue_dma(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let ops = segments(op, &[1, 0, 1, 1, 0, 0, 0], "a local copy")?;
    let (src, dst) = (rw.view(ops[0])?, rw.view(ops[1])?);
    let sem = semaphore(rw, op, ops[2], Some(Space::DmaSemaphore))?;
    if src.shape != dst.shape || src.elem() != dst.elem() {
        return Err(bad(
            op,
            format!(
                "a copy from {:?} {} into {:?} {}",
                src.shape,
                src.elem(),
                dst.shape,
                dst.elem()
            ),
        ));
    }
    let shape = src.shape.clone();
    let temp = (src.root.name == dst.root.name).then(|| {
        let ty = Ty::Mem {
            shape: shape.clone(),
            elem: src.elem().to_string(),
        };
        let name = rw.alloc(&ty);
        Val { name, ty }
    });
    let flat = |rw: &mut Rewriter<'_>, ivs: &[String]| {
        let terms: Vec<(String, usize)> = ivs
            .iter()
            .cloned()
            .zip(super::rewrite::row_major(&shape))
            .collect();
        rw.linear(&terms, None)
    };
    match &temp {
        None => rw.nest(&shape, |rw, ivs| {
            let (from, to) = (element(rw, &src, ivs), element(rw, &dst, ivs));
            let x = super::views::read(rw, &src, &from);
            super::views::write(rw, &dst, &to, &x);
            Ok(())
        })?,
        Some(t) => {
            rw.nest(&shape, |rw, ivs| {
                let (from, to) = (element(rw, &src, ivs), flat(rw, ivs));
                let x = super::views::read(rw, &src, &from);
                rw.store(&x, t, &to);
                Ok(())
            })?;
            rw.nest(&shape, |rw, ivs| {
                let (from, to) = (flat(rw, ivs), element(rw, &dst, ivs));
                let x = rw.load(t, &from);
                super::views::write(rw, &dst, &to, &x);
                Ok(())
            })?;
        }
    }
    let bytes = rw.int(window_bytes(op, &shape, src.elem())?, "i32");
    add(rw, &sem, &bytes)
}

/// The bytes of a window of `shape` with elements `elem` (an MLIR element type): the count both
/// engines use (`semantics::dma::copy_bytes`, bits from the dtype table).
fn window_bytes(op: OperationRef<'_, '_>, shape: &[usize], elem: &str) -> Result<i64> {
    let bits = DType::ALL
        .iter()
        .find(|d| d.mlir() == elem)
        .map(|d| d.bit_width())
        .ok_or_else(|| bad(op, format!("a copy of {elem} elements")))?;
    let bytes = copy_bytes(shape.iter().product(), bits);
    if bytes > i32::MAX as i64 {
        return Err(bad(
            op,
            format!("a copy of {bytes} bytes (past an i32 semaphore)"),
        ));
    }
    Ok(bytes)
}

/// `sem += amount` (an `i32` value).
fn add(rw: &mut Rewriter<'_>, sem: &RefView, amount: &str) -> Result<()> {
    let v = rw.load(&sem.root, &sem.offset);
    let n = rw.fresh();
    rw.line(format!("{n} = arith.addi {v}, {amount} : i32"));
    rw.store(&n, &sem.root, &sem.offset);
    Ok(())
}

/// `tpu.wait_dma` (`wait_target`): the descriptor's bytes taken from the DMA semaphore; fewer there is
/// a deadlock (every copy landed at its start, so nothing more will come). Its source and target only
/// say how much to wait for; they must still be valid windows (their slices are checked).
pub(super) fn wait_dma(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let ops = segments(op, &[1, 0, 1, 1, 0, 0, 0], "a local copy")?;
    let (src, dst) = (rw.view(ops[0])?, rw.view(ops[1])?);
    if src.shape != dst.shape {
        return Err(bad(
            op,
            format!(
                "a wait for a copy from {:?} into {:?}",
                src.shape, dst.shape
            ),
        ));
    }
    let sem = semaphore(rw, op, ops[2], Some(Space::DmaSemaphore))?;
    let bytes = rw.int(window_bytes(op, &dst.shape, dst.elem())?, "i32");
    let root_shape = sem.root.ty.shape().unwrap_or_default().to_vec();
    let site = rw.site(op, SiteKind::DmaWait { shape: root_shape }, sem.ref_id);
    let v = rw.load(&sem.root, &sem.offset);
    let short = rw.fresh();
    rw.line(format!("{short} = arith.cmpi slt, {v}, {bytes} : i32"));
    let details = [
        index(sem.offset.clone()),
        Val {
            name: bytes.clone(),
            ty: Ty::Scalar("i32".into()),
        },
        Val {
            name: v.clone(),
            ty: Ty::Scalar("i32".into()),
        },
    ];
    rw.if_else(
        &short,
        |rw| rw.record(site, &details),
        |rw| {
            let n = rw.fresh();
            rw.line(format!("{n} = arith.subi {v}, {bytes} : i32"));
            rw.store(&n, &sem.root, &sem.offset);
            Ok(())
        },
    )
}

/// `tpu.sem_signal %sem, %amount` (no device or core: a local signal).
pub(super) fn sem_signal(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let ops = segments(op, &[1, 1, 0, 0, 0], "a local signal")?;
    let sem = semaphore(rw, op, ops[0], None)?;
    let amount = i32_operand(rw, op, ops[1])?;
    add(rw, &sem, &amount)
}

fn i32_operand(rw: &Rewriter<'_>, op: OperationRef<'_, '_>, v: Value<'_, '_>) -> Result<String> {
    let a = rw.val(v)?;
    if a.ty != Ty::Scalar("i32".into()) {
        return Err(bad(op, format!("an amount of type {}", a.ty.text())));
    }
    Ok(a.name)
}

/// `tpu.sem_wait %sem, %amount`: taken from the semaphore if it holds that much; otherwise nothing
/// else will ever signal it (one core, in order): a deadlock.
pub(super) fn sem_wait(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    if op.operand_count() != 2 {
        return Err(bad(op, "expected a semaphore and an amount"));
    }
    let sem = semaphore(rw, op, operand(op, 0)?, None)?;
    let amount = i32_operand(rw, op, operand(op, 1)?)?;
    let root_shape = sem.root.ty.shape().unwrap_or_default().to_vec();
    let site = rw.site(op, SiteKind::SemWait { shape: root_shape }, sem.ref_id);
    let v = rw.load(&sem.root, &sem.offset);
    let short = rw.fresh();
    rw.line(format!("{short} = arith.cmpi slt, {v}, {amount} : i32"));
    let details = [
        index(sem.offset.clone()),
        Val {
            name: amount.clone(),
            ty: Ty::Scalar("i32".into()),
        },
        Val {
            name: v.clone(),
            ty: Ty::Scalar("i32".into()),
        },
    ];
    rw.if_else(
        &short,
        |rw| rw.record(site, &details),
        |rw| {
            let n = rw.fresh();
            rw.line(format!("{n} = arith.subi {v}, {amount} : i32"));
            rw.store(&n, &sem.root, &sem.offset);
            Ok(())
        },
    )
}

/// `tpu.sem_read %sem`: the semaphore's value.
pub(super) fn sem_read(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    if op.operand_count() != 1 || rw.result_ty(op, 0)? != Ty::Scalar("i32".into()) {
        return Err(bad(op, "expected one semaphore and an i32 result"));
    }
    let sem = semaphore(rw, op, operand(op, 0)?, None)?;
    let v = rw.load(&sem.root, &sem.offset);
    rw.bind_result(
        op,
        0,
        Val {
            name: v,
            ty: Ty::Scalar("i32".into()),
        },
    )
}

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

use super::rewrite::{
    bad, i32_array, op_name, operand, RefView, Rewriter, SiteKind, Space, Ty, Val, ERR_SLOTS,
};
use super::window;
use crate::error::{kerr, Result};
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::{Value, ValueLike};

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
    let dynamic = window::is_dynamic(&src) || window::is_dynamic(&dst);
    let run_time = |v: &RefView, d: usize| v.dynamic.get(d).is_some_and(Option::is_some);
    let same_static = src.shape.len() == dst.shape.len()
        && (0..src.shape.len())
            .all(|d| run_time(&src, d) || run_time(&dst, d) || src.shape[d] == dst.shape[d]);
    if !same_static || src.elem() != dst.elem() {
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
    let (ext, ok) = if dynamic {
        shapes_agree(rw, op, &src, &dst)?
    } else {
        (window::extents(rw, &src), rw.constant("true", "i1"))
    };
    // The bound of every extent: the larger static size of the two ends.
    let shape: Vec<usize> = src
        .shape
        .iter()
        .zip(&dst.shape)
        .map(|(a, b)| *a.max(b))
        .collect();
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
    rw.if_else(
        &ok,
        |rw| match &temp {
            None => rw.nest_dyn(&ext, |rw, ivs| {
                let (from, to) = (element(rw, &src, ivs), element(rw, &dst, ivs));
                let x = super::views::read(rw, &src, &from);
                super::views::write(rw, &dst, &to, &x);
                Ok(())
            }),
            Some(t) => {
                rw.nest_dyn(&ext, |rw, ivs| {
                    let (from, to) = (element(rw, &src, ivs), flat(rw, ivs));
                    let x = super::views::read(rw, &src, &from);
                    rw.store(&x, t, &to);
                    Ok(())
                })?;
                rw.nest_dyn(&ext, |rw, ivs| {
                    let (from, to) = (flat(rw, ivs), element(rw, &dst, ivs));
                    let x = rw.load(t, &from);
                    super::views::write(rw, &dst, &to, &x);
                    Ok(())
                })
            }
        },
        |_| Ok(()),
    )?;
    let bytes = window::bytes(rw, op, &src)?;
    add(rw, &sem, &bytes)
}

/// The run-time extents of a copy whose ends have run-time sizes, and whether the two ends agree (a
/// recorded fault, in the interpreter's words, where they do not).
fn shapes_agree(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    src: &RefView,
    dst: &RefView,
) -> Result<(Vec<String>, String)> {
    let rank = src.shape.len();
    if 2 * rank > ERR_SLOTS - 1 {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: a copy of rank {rank} with run-time sizes (at most rank {})",
            (ERR_SLOTS - 1) / 2
        ));
    }
    let (a, b) = (window::extents(rw, src), window::extents(rw, dst));
    let mut ok = rw.constant("true", "i1");
    for (x, y) in a.iter().zip(&b) {
        let eq = rw.fresh();
        rw.line(format!("{eq} = arith.cmpi eq, {x}, {y} : index"));
        let o = rw.fresh();
        rw.line(format!("{o} = arith.andi {ok}, {eq} : i1"));
        ok = o;
    }
    let site = rw.site(op, SiteKind::DmaShape { rank }, src.ref_id);
    let details: Vec<Val> = a.iter().chain(&b).map(|n| Val::index(n.clone())).collect();
    rw.if_else(&ok, |_| Ok(()), |rw| rw.record(site, &details))?;
    Ok((a, ok))
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
    let dynamic = window::is_dynamic(&src) || window::is_dynamic(&dst);
    if !dynamic && src.shape != dst.shape {
        return Err(bad(
            op,
            format!(
                "a wait for a copy from {:?} into {:?}",
                src.shape, dst.shape
            ),
        ));
    }
    let sem = semaphore(rw, op, ops[2], Some(Space::DmaSemaphore))?;
    let bytes = window::bytes(rw, op, &dst)?;
    let root_shape = sem.root.ty.shape().unwrap_or_default().to_vec();
    let site = rw.site(op, SiteKind::DmaWait { shape: root_shape }, sem.ref_id);
    let v = rw.load(&sem.root, &sem.offset);
    let short = rw.fresh();
    rw.line(format!("{short} = arith.cmpi slt, {v}, {bytes} : i32"));
    let details = [
        Val::index(sem.offset.clone()),
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
        Val::index(sem.offset.clone()),
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

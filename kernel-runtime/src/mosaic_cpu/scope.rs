//! `run_scoped` scopes: `tpu.region { memref.alloca ... / tpu.sem_alloc ... ; body; tpu.yield }`, as
//! the lowering emits them (Pallas's `pl.run_scoped`).
//!
//! The region is written in place (it has no operands, results or block arguments; the refs its body
//! uses from outside are the outer values themselves). Each allocation is one buffer allocated at the
//! function's entry ([`Rewriter::hoist_alloc`]: a scope entered in a loop reuses it instead of growing
//! the arena) and zero-filled where the allocation stands, so every entry of the scope starts from
//! fresh memory — the interpreter's unpoisoned fill — and semaphores from zero. At the scope's end
//! every semaphore it allocated must be back at zero, as the interpreter requires: one that is not is
//! a `Race` error at the `run_scoped` line.

use super::rewrite::{bad, is_float, op_name, RefId, Rewriter, SiteKind, Space, Ty, Val};
use crate::error::{kerr, Result};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::RegionLike;

/// A scope being written: how many allocations it has made, and its semaphores (checked at its end).
#[derive(Default)]
pub(super) struct Scope {
    allocations: usize,
    semaphores: Vec<ScopedSemaphore>,
}

struct ScopedSemaphore {
    buffer: Val,
    /// Its allocation number in the scope.
    k: usize,
    dma: bool,
}

/// `tpu.region`: the body in place between a fresh [`Scope`] and its end check.
pub(super) fn region(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    if op.operand_count() != 0 || op.result_count() != 0 {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: a `tpu.region` with operands or results (only run_scoped scopes without results are supported)"
        ));
    }
    let region = op.region(0).map_err(|_| bad(op, "expected one region"))?;
    let block = region
        .first_block()
        .ok_or_else(|| bad(op, "expected a body"))?;
    if op.region_count() != 1 || block.next_in_region().is_some() || block.argument_count() != 0 {
        return Err(bad(
            op,
            "expected one region of one block without arguments",
        ));
    }
    rw.scopes.push(Scope::default());
    let body = rw.block(block);
    let scope = rw
        .scopes
        .pop()
        .ok_or_else(|| bad(op, "unbalanced scopes (internal error)"))?;
    body?;
    for sem in &scope.semaphores {
        check_zero(rw, op, sem)?;
    }
    Ok(())
}

/// At the scope's end: each element of `sem` that is not zero is recorded as a failure (the first
/// one wins, as the interpreter reports the first left semaphore).
fn check_zero(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    sem: &ScopedSemaphore,
) -> Result<()> {
    let shape = sem.buffer.ty.shape().unwrap_or_default().to_vec();
    let site = rw.site(
        op,
        SiteKind::ScopeEnd {
            dma: sem.dma,
            shape: shape.clone(),
        },
        Some(RefId::Scoped(sem.k)),
    );
    let n: usize = shape.iter().product();
    rw.nest(&[n], |rw, ivs| {
        let v = rw.load(&sem.buffer, &ivs[0]);
        let zero = rw.int(0, "i32");
        let left = rw.fresh();
        rw.line(format!("{left} = arith.cmpi ne, {v}, {zero} : i32"));
        let details = [
            Val {
                name: ivs[0].clone(),
                ty: Ty::Scalar("index".into()),
            },
            Val {
                name: v,
                ty: Ty::Scalar("i32".into()),
            },
        ];
        rw.if_else(&left, |rw| rw.record(site, &details), |_| Ok(()))
    })
}

/// A scoped allocation (`memref.alloca` or `tpu.sem_alloc`): its buffer, zeroed here, bound to the
/// result and named after its place in the scope.
fn allocate(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>, semaphore: bool) -> Result<()> {
    if rw.scopes.is_empty() {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: `{}` outside a run_scoped scope (`tpu.region`)",
            op_name(op)
        ));
    }
    if op.operand_count() != 0 || op.result_count() != 1 {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: `{}` with dynamic sizes (only static shapes are supported)",
            op_name(op)
        ));
    }
    let result = op.result(0).map_err(|_| bad(op, "expected a result"))?;
    let space = super::rewrite::ref_space(melior::ir::ValueLike::r#type(&result))?;
    if space.is_some_and(Space::is_semaphore) != semaphore {
        return Err(bad(op, format!("a buffer in {space:?}")));
    }
    let ty = rw.result_ty(op, 0)?;
    let Ty::Mem { shape, elem } = &ty else {
        return Err(bad(op, "the result is not a ref"));
    };
    let zero = if is_float(elem) {
        rw.constant(&format!("0.0 : {elem}"), elem)
    } else if elem == "i1" {
        rw.constant("false", elem)
    } else {
        rw.int(0, elem)
    };
    let n: usize = shape.iter().product();
    let buffer = Val {
        name: rw.hoist_alloc(&ty),
        ty: ty.clone(),
    };
    rw.nest(&[n], |rw, ivs| {
        rw.store(&zero, &buffer, &ivs[0]);
        Ok(())
    })?;
    let scope = rw
        .scopes
        .last_mut()
        .ok_or_else(|| bad(op, "no scope (internal error)"))?;
    let k = scope.allocations;
    scope.allocations += 1;
    if semaphore {
        scope.semaphores.push(ScopedSemaphore {
            buffer: buffer.clone(),
            k,
            dma: space == Some(Space::DmaSemaphore),
        });
    }
    rw.refs
        .insert(super::rewrite::key(result), RefId::Scoped(k));
    rw.bind(result, buffer);
    Ok(())
}

/// `memref.alloca` (in a scope): a fresh VMEM or SMEM buffer.
pub(super) fn alloca(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    allocate(rw, op, false)
}

/// `tpu.sem_alloc` (in a scope): fresh semaphores, at zero.
pub(super) fn sem_alloc(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    allocate(rw, op, true)
}

/// `tpu.yield`, the end of a scope's body: nothing to write (the scope's end check follows its
/// region). A scope yielding values is not supported.
pub(super) fn yield_op(_rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    if op.operand_count() != 0 {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: a run_scoped scope yielding values"
        ));
    }
    Ok(())
}

//! The error a failed run-time check reports: the check site's kind, ref and Rust line, and the details
//! the JIT'd code wrote into the error buffer, as a `KernelError` with the interpreter's message and
//! kind (`OutOfBounds`, `Deadlock`, `Race`, ...); DMA and semaphore faults in
//! `crate::semantics::dma`'s words.
//!
//! May depend on: `Compiled` (its kernel and check sites), the check sites of `rewrite`,
//! `crate::error`, `crate::semantics::dma`'s messages; nothing else.

use super::Compiled;
use crate::error::{kerr, KernelError};
use crate::mosaic_cpu::rewrite::{RefId, SiteKind, ERR_SLOTS};
pub(super) use crate::semantics::dma::sem_label;
use crate::semantics::dma::{
    copy_shapes_differ, deadlock_dma_wait, deadlock_sem_wait, dma_copies_left, semaphore_left,
    Release,
};
use crate::semantics::refs::{
    access_out_of_bounds, first_outside, window_out_of_bounds, window_size_below_one, Access,
};

impl Compiled {
    /// The error a failed check reports (`err` as the JIT'd code filled it).
    pub(super) fn site_error(&self, err: &[i64; ERR_SLOTS]) -> KernelError {
        let Some(site) = usize::try_from(err[0] - 1)
            .ok()
            .and_then(|i| self.program.sites.get(i))
        else {
            return kerr!(Lowering, "mosaic_cpu: unknown failed check {}", err[0]);
        };
        let label = match site.ref_id {
            Some(RefId::Operand(i)) => self.kernel.operands.get(i).map(|o| o.label()),
            Some(RefId::Scoped(k)) => Some(format!("scoped buffer {k}")),
            None => None,
        };
        let detail = &err[1..];
        let e = match &site.kind {
            SiteKind::Load { sizes, shape } | SiteKind::Store { sizes, shape } => {
                let access = if matches!(site.kind, SiteKind::Load { .. }) {
                    Access::Load
                } else {
                    Access::Store
                };
                let starts = &detail[..shape.len().min(detail.len())];
                ref_error(label.as_deref(), |l| {
                    access_out_of_bounds(access, l, first_outside(starts, sizes, shape), shape)
                })
            }
            SiteKind::Element {
                store,
                shape,
                index_map,
            } => {
                // An element is a window of size 1 in every dimension.
                let idx = &detail[..shape.len().min(detail.len())];
                let ones = vec![1; shape.len()];
                let (d, i, _) = first_outside(idx, &ones, shape);
                if *index_map {
                    // The schedule names the operand whose index map this is.
                    kerr!(
                        OutOfBounds,
                        "the index map reads element {idx:?} of scalar-prefetch operand {} (shape {shape:?}): index {i} is out of bounds along dimension {d}",
                        match site.ref_id {
                            Some(RefId::Operand(i)) => i,
                            _ => 0,
                        }
                    )
                } else {
                    let access = if *store { Access::Store } else { Access::Load };
                    ref_error(label.as_deref(), |l| {
                        access_out_of_bounds(access, l, (d, i, 1), shape)
                    })
                }
            }
            SiteKind::Slice { sizes, shape } => {
                let starts = &detail[..shape.len().min(detail.len())];
                window_out_of_bounds(
                    label.as_deref().unwrap_or("a ref"),
                    first_outside(starts, sizes, shape),
                    shape,
                )
            }
            SiteKind::SliceSize { dim } => {
                window_size_below_one(label.as_deref().unwrap_or("a ref"), *dim, detail[0])
            }
            SiteKind::SliceDim { dim, shape } => window_out_of_bounds(
                label.as_deref().unwrap_or("a ref"),
                (*dim, detail[0], detail[1].max(0) as usize),
                shape,
            ),
            SiteKind::DmaShape { rank } => {
                let dims = |k: usize| -> Vec<usize> {
                    detail[k * rank..(k + 1) * rank]
                        .iter()
                        .map(|n| (*n).max(0) as usize)
                        .collect()
                };
                copy_shapes_differ(&dims(0), &dims(1))
            }
            SiteKind::DmaWait { shape } => deadlock_dma_wait(
                &sem_label(
                    label.as_deref().unwrap_or("a ref"),
                    shape,
                    detail[0] as usize,
                ),
                detail[1],
                detail[2],
            ),
            SiteKind::SemWait { shape } => deadlock_sem_wait(
                detail[1],
                &sem_label(
                    label.as_deref().unwrap_or("a ref"),
                    shape,
                    detail[0] as usize,
                ),
                detail[2],
            ),
            SiteKind::ScopeEnd { dma, shape } => {
                let sem = sem_label(
                    label.as_deref().unwrap_or("a ref"),
                    shape,
                    detail[0] as usize,
                );
                if *dma {
                    dma_copies_left(&sem, detail[1], Release::Scope)
                } else {
                    semaphore_left(&sem, detail[1], Release::Scope)
                }
            }
            SiteKind::AssumeMultiple(m) => kerr!(
                Trace,
                "multiple_of({m}) was promised for a value that is {}",
                detail[0]
            ),
            SiteKind::ForStep => kerr!(
                OutOfBounds,
                "a `for` loop step must be positive, got {}",
                detail[0]
            ),
        };
        e.at(site.loc)
    }
}

/// The error about a ref named `label` (the argument it names), or about "a ref" when the check site
/// knows none (then no argument is named).
fn ref_error(label: Option<&str>, e: impl FnOnce(&str) -> KernelError) -> KernelError {
    match label {
        Some(l) => e(l),
        None => {
            let mut e = e("a ref");
            e.argument = None;
            e
        }
    }
}

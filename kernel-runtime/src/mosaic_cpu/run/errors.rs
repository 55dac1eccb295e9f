//! The error a failed run-time check reports: the check site's kind, ref and Rust line, and the details
//! the JIT'd code wrote into the error buffer, as a `KernelError` with the interpreter's message and
//! kind (`OutOfBounds`, `Deadlock`, `Race`, ...); and how a semaphore is named in errors.
//!
//! May depend on: `Compiled` (its kernel and check sites), the check sites of `rewrite`,
//! `crate::error`; nothing else.

use super::Compiled;
use crate::error::{kerr, KernelError};
use crate::mosaic_cpu::rewrite::{RefId, SiteKind, ERR_SLOTS};

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
                let what = if matches!(site.kind, SiteKind::Load { .. }) {
                    "load from"
                } else {
                    "store into"
                };
                let starts = &detail[..shape.len().min(detail.len())];
                let e = kerr!(
                    OutOfBounds,
                    "out-of-bounds {what} {}: a window of {sizes:?} at {starts:?} in the ref shape {shape:?}",
                    label.as_deref().unwrap_or("a ref")
                );
                match label {
                    Some(l) => e.for_argument(l),
                    None => e,
                }
            }
            SiteKind::Element {
                store,
                shape,
                index_map,
            } => {
                // The interpreter's messages (an element is a window of size 1 in every dimension).
                let idx = &detail[..shape.len().min(detail.len())];
                let (d, i) = idx
                    .iter()
                    .zip(shape)
                    .enumerate()
                    .find(|(_, (i, n))| **i < 0 || **i as usize >= **n)
                    .map(|(d, (i, _))| (d, *i))
                    .unwrap_or((0, idx.first().copied().unwrap_or(0)));
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
                    let what = if *store { "store into" } else { "load from" };
                    let e = kerr!(
                        OutOfBounds,
                        "out-of-bounds {what} {}: window {i}..{} along dimension {d} of the ref shape {shape:?}",
                        label.as_deref().unwrap_or("a ref"),
                        i + 1
                    );
                    match label {
                        Some(l) => e.for_argument(l),
                        None => e,
                    }
                }
            }
            SiteKind::Slice { sizes, shape } => {
                // The interpreter's message: the first dimension out of bounds.
                let starts = &detail[..shape.len().min(detail.len())];
                let (d, s, n) = starts
                    .iter()
                    .zip(sizes.iter().zip(shape))
                    .enumerate()
                    .find(|(_, (s, (z, n)))| **s < 0 || **s + **z as i64 > **n as i64)
                    .map(|(d, (s, (z, _)))| (d, *s, *z))
                    .unwrap_or((0, 0, 0));
                kerr!(
                    OutOfBounds,
                    "out-of-bounds window of {}: {s}..{} along dimension {d} of a window of shape {shape:?}",
                    label.as_deref().unwrap_or("a ref"),
                    s + n as i64
                )
            }
            SiteKind::DmaWait { shape } => kerr!(
                Deadlock,
                "waits on DMA semaphore {} but no copy signalling it is in flight: this wait would never return",
                sem_label(label.as_deref().unwrap_or("a ref"), shape, detail[0] as usize)
            ),
            SiteKind::SemWait { shape } => kerr!(
                Deadlock,
                "waits for {} on semaphore {} which holds {}, and nothing else runs to signal it: this wait would never return",
                detail[1],
                sem_label(label.as_deref().unwrap_or("a ref"), shape, detail[0] as usize),
                detail[2]
            ),
            SiteKind::ScopeEnd { dma, shape } => {
                let sem = sem_label(label.as_deref().unwrap_or("a ref"), shape, detail[0] as usize);
                if *dma {
                    kerr!(
                        Race,
                        "DMA semaphore {sem} counts {} copies never waited for when its run_scoped scope ends: wait for every copy inside the scope",
                        detail[1]
                    )
                } else {
                    // The interpreter's message.
                    kerr!(
                        Race,
                        "semaphore {sem} holds {} when its run_scoped scope ends: every signal must be waited for",
                        detail[1]
                    )
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

/// A semaphore's name in errors, as the interpreter gives it: the ref, and the element of an array.
pub(super) fn sem_label(label: &str, shape: &[usize], i: usize) -> String {
    if shape.is_empty() {
        label.to_string()
    } else {
        format!("{label}[{i}]")
    }
}

//! Ref accesses out of bounds: one message per fault, whichever engine finds it (the interpreter when
//! it indexes a ref, Mosaic-on-CPU from a check site its compiled code filled).

use crate::error::{kerr, KernelError};

/// A vector or scalar access of a ref.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Load,
    Store,
}

impl Access {
    fn what(self) -> &'static str {
        match self {
            Access::Load => "load from",
            Access::Store => "store into",
        }
    }
}

/// The first dimension where the window of `sizes` at `starts` leaves `shape`: (dimension, start,
/// size); (0, first start, first size) when none does.
#[cfg_attr(not(feature = "mosaic-cpu"), allow(dead_code))]
pub(crate) fn first_outside(
    starts: &[i64],
    sizes: &[usize],
    shape: &[usize],
) -> (usize, i64, usize) {
    starts
        .iter()
        .zip(sizes.iter().zip(shape))
        .enumerate()
        .find(|(_, (s, (z, n)))| **s < 0 || **s + **z as i64 > **n as i64)
        .map(|(d, (s, (z, _)))| (d, *s, *z))
        .unwrap_or((
            0,
            starts.first().copied().unwrap_or(0),
            sizes.first().copied().unwrap_or(0),
        ))
}

/// A load or store of `label` (of shape `shape`) whose window along dimension `dim` is
/// `start..start + size`, outside the ref.
pub(crate) fn access_out_of_bounds(
    access: Access,
    label: &str,
    (dim, start, size): (usize, i64, usize),
    shape: &[usize],
) -> KernelError {
    kerr!(
        OutOfBounds,
        "out-of-bounds {} {label}: window {start}..{} along dimension {dim} of the ref shape {shape:?}",
        access.what(),
        start + size as i64
    )
    .for_argument(label.to_string())
}

/// A window (`x.at(..)`) of `label` whose extent along dimension `dim` is `start..start + size`,
/// outside the window of shape `shape` it was taken from.
pub(crate) fn window_out_of_bounds(
    label: &str,
    (dim, start, size): (usize, i64, usize),
    shape: &[usize],
) -> KernelError {
    kerr!(
        OutOfBounds,
        "out-of-bounds window of {label}: {start}..{} along dimension {dim} of a window of shape {shape:?}",
        start + size as i64
    )
}

/// A window of `label` whose run-time size (`ds(start, n)`, `n` traced) is below one element.
pub(crate) fn window_size_below_one(label: &str, dim: usize, size: i64) -> KernelError {
    kerr!(
        OutOfBounds,
        "out-of-bounds window of {label}: a run-time size of {size} along dimension {dim}; a window holds at least one element"
    )
}

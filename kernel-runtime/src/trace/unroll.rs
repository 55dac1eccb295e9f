//! Static unrolling: `for p in unroll(0..n) { .. }` runs the body `n` times *at trace time* (Pallas's
//! Python `for p in range(n)` inside a kernel, or `lax.fori_loop(.., unroll=True)`): the kernel holds
//! `n` copies of the body and no `scf.for`, and `p` is a Rust `usize`, usable wherever a constant is
//! (static slices `x.slice((p..p + 1, ..))`, windows `r.at((p, ..))`, Rust arithmetic).
//!
//! The macro keeps such a loop a plain Rust `for` (so variables assigned in the body are ordinary
//! `mut` Rust variables, nothing is carried) over [`unroll_range`] / [`unroll_range_step`], with the
//! range split so that each bound is checked on its own: a traced bound (`Scalar<i32>`) is a compile
//! error saying to use a traced loop instead.

use super::with;
use crate::error::{kerr, SourceLoc};

/// A bound of an unrolled loop: a Rust integer known when the kernel is traced.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot bound an unrolled loop",
    label = "not known when the kernel is traced",
    note = "`unroll(lo..hi)` repeats the body at trace time, so its bounds are Rust integers (constants, shapes, launch parameters); for a bound computed in the kernel use a traced loop, `for i in lo..hi` (→ scf.for)"
)]
pub trait UnrollBound {
    #[doc(hidden)]
    fn unroll_bound(self) -> i64;
}
impl UnrollBound for usize {
    fn unroll_bound(self) -> i64 {
        self as i64
    }
}
impl UnrollBound for i32 {
    fn unroll_bound(self) -> i64 {
        self as i64
    }
}
impl UnrollBound for u32 {
    fn unroll_bound(self) -> i64 {
        self as i64
    }
}
impl UnrollBound for i64 {
    fn unroll_bound(self) -> i64 {
        self
    }
}

/// `for p in unroll(lo..hi)` or `unroll((lo..hi).step_by(step))` in a kernel body: the body is traced
/// once per value of `p` (a `usize`), with no `scf.for`. `unroll` of any other iterable known when the
/// kernel is traced — `unroll(&copies)`, `unroll(pages.iter().enumerate())` over a `Vec` of copy
/// descriptors built in an earlier unrolled loop, say — is the same Rust loop over its items (Pallas's
/// Python `for c in copies:`). Outside a kernel body this is the iterable itself.
pub fn unroll<I: IntoIterator>(iterable: I) -> I::IntoIter {
    iterable.into_iter()
}

/// What `for p in unroll(lo..hi)` becomes.
#[doc(hidden)]
#[track_caller]
pub fn unroll_range(
    lo: impl UnrollBound,
    hi: impl UnrollBound,
) -> std::iter::StepBy<std::ops::Range<usize>> {
    unrolled(lo.unroll_bound(), hi.unroll_bound(), 1, SourceLoc::caller())
}

/// What `for p in unroll((lo..hi).step_by(step))` becomes.
#[doc(hidden)]
#[track_caller]
pub fn unroll_range_step(
    lo: impl UnrollBound,
    hi: impl UnrollBound,
    step: impl UnrollBound,
) -> std::iter::StepBy<std::ops::Range<usize>> {
    let (lo, hi, step) = (lo.unroll_bound(), hi.unroll_bound(), step.unroll_bound());
    unrolled(lo, hi, step, SourceLoc::caller())
}

/// The values of `p`; an error recorded at the loop (and no iteration) for a negative bound or a step
/// that is not positive.
fn unrolled(
    lo: i64,
    hi: i64,
    step: i64,
    loc: SourceLoc,
) -> std::iter::StepBy<std::ops::Range<usize>> {
    let checked = with(loc, |_| {
        if step <= 0 {
            return Err(kerr!(
                Grid,
                "an unrolled loop's step must be positive, got {step}"
            ));
        }
        if lo < 0 || hi < 0 {
            return Err(kerr!(
                Grid,
                "an unrolled loop counts in `usize`: its bounds must not be negative, got {lo}..{hi}"
            ));
        }
        Ok((lo as usize, hi as usize, step as usize))
    });
    let (lo, hi, step) = checked.unwrap_or((0, 0, 1));
    (lo..hi).step_by(step)
}

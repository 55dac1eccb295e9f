//! Row operands of the elementwise loops: a contiguous slice or one broadcast value, and the
//! three-operand loop over every combination of them (monomorphized, so each vectorizes).

use std::mem::MaybeUninit;

/// An operand of a binary row function.
#[derive(Clone, Copy)]
pub(crate) enum RowArg<'a, T> {
    Slice(&'a [T]),
    Scalar(T),
}

impl<'a, T: Copy> RowArg<'a, T> {
    /// The `len` elements at `o` with stride `s`, if contiguous (1) or broadcast (0).
    #[inline(always)]
    pub(super) fn of(d: &'a [T], o: usize, s: usize, len: usize) -> Option<Self> {
        match s {
            1 => Some(RowArg::Slice(&d[o..o + len])),
            0 => Some(RowArg::Scalar(d[o])),
            _ => None,
        }
    }
}

/// `dst[i] = f(x[i], y[i], z[i])`, each operand a row or one value, monomorphized per combination so
/// every loop vectorizes.
#[inline(always)]
pub(super) fn zip3<A: Copy, B: Copy, C: Copy, R>(
    dst: &mut [MaybeUninit<R>],
    x: RowArg<'_, A>,
    y: RowArg<'_, B>,
    z: RowArg<'_, C>,
    f: &impl Fn(A, B, C) -> R,
) {
    #[inline(always)]
    fn run<R, A, B, C>(
        dst: &mut [MaybeUninit<R>],
        x: impl Iterator<Item = A>,
        y: impl Iterator<Item = B>,
        z: impl Iterator<Item = C>,
        f: &impl Fn(A, B, C) -> R,
    ) {
        for (d, ((x, y), z)) in dst.iter_mut().zip(x.zip(y).zip(z)) {
            d.write(f(x, y, z));
        }
    }
    use std::iter::repeat;
    use RowArg::{Scalar as V, Slice as S};
    match (x, y, z) {
        (S(x), S(y), S(z)) => run(
            dst,
            x.iter().copied(),
            y.iter().copied(),
            z.iter().copied(),
            f,
        ),
        (S(x), S(y), V(z)) => run(dst, x.iter().copied(), y.iter().copied(), repeat(z), f),
        (S(x), V(y), S(z)) => run(dst, x.iter().copied(), repeat(y), z.iter().copied(), f),
        (S(x), V(y), V(z)) => run(dst, x.iter().copied(), repeat(y), repeat(z), f),
        (V(x), S(y), S(z)) => run(dst, repeat(x), y.iter().copied(), z.iter().copied(), f),
        (V(x), S(y), V(z)) => run(dst, repeat(x), y.iter().copied(), repeat(z), f),
        (V(x), V(y), S(z)) => run(dst, repeat(x), repeat(y), z.iter().copied(), f),
        (V(x), V(y), V(z)) => run(dst, repeat(x), repeat(y), repeat(z), f),
    }
}

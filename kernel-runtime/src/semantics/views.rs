//! Ref views (`r.bitcast::<U>()`, `r.reshape([..])`, windows of them) as the DMA model and the
//! engines see them: the steps from a ref's contents to what the program reads ([`ViewPath`]), and the
//! box of the ref a view reaches ([`ViewPath::reach`]), which the race rules compare.
//!
//! A bitcast that changes the bit width packs consecutive rows of the second-to-last dimension into
//! one element, the lowest bits first (`pltpu.bitcast`'s rule), so view row `i` holds bits of ref rows
//! `i * vb / rb ..= ((i + 1) * vb - 1) / rb` (`vb`, `rb` the view's and the ref's bit widths). A reshape
//! keeps the row-major order. The reach of a window is exact through bitcasts and through reshapes that
//! regroup leading dimensions; where a window of a reshape covers parts of several rows of the ref,
//! the reach is the box around them (a conservative race check, never a missed one).

use super::dma::{Dims, Flags};
use crate::dtype::DType;

/// One step from a ref's contents toward a view.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ViewStep {
    /// A window over the current shape (squeezed dimensions dropped from the result).
    Window {
        starts: Dims,
        sizes: Dims,
        squeezed: Flags,
    },
    /// The bits as another element type (the second-to-last dimension scaled).
    Bitcast(DType),
    /// The same elements, row-major, in another shape.
    Reshape(Dims),
}

/// The steps from the whole contents of a ref (of `base_shape`, `base_dtype`) to a view.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ViewPath {
    pub base_shape: Dims,
    pub base_dtype: DType,
    pub steps: Vec<ViewStep>,
}

impl ViewPath {
    pub fn new(base_shape: &[usize], base_dtype: DType) -> ViewPath {
        ViewPath {
            base_shape: Dims::from_slice(base_shape),
            base_dtype,
            steps: Vec::new(),
        }
    }

    /// The shape and element type after every step.
    pub fn result(&self) -> (Dims, DType) {
        let (mut shape, mut dtype) = (self.base_shape.clone(), self.base_dtype);
        for s in &self.steps {
            (shape, dtype) = step_result(s, &shape, dtype);
        }
        (shape, dtype)
    }

    /// The shapes and element types before each step (the last entry is the result).
    pub fn stages(&self) -> Vec<(Dims, DType)> {
        let mut out = vec![(self.base_shape.clone(), self.base_dtype)];
        let (mut shape, mut dtype) = (self.base_shape.clone(), self.base_dtype);
        for s in &self.steps {
            (shape, dtype) = step_result(s, &shape, dtype);
            out.push((shape.clone(), dtype));
        }
        out
    }

    /// The box of the ref the whole view reaches: starts and sizes per ref dimension.
    pub fn reach(&self) -> (Dims, Dims) {
        let stages = self.stages();
        let (shape, _) = self.result();
        let (mut starts, mut sizes): (Dims, Dims) = (smallvec::smallvec![0; shape.len()], shape);
        for (k, s) in self.steps.iter().enumerate().rev() {
            let (before, bdtype) = &stages[k];
            (starts, sizes) = match s {
                ViewStep::Window {
                    starts: ws,
                    squeezed,
                    ..
                } => {
                    let mut kept = starts.iter().zip(&sizes);
                    let mut out = (Dims::new(), Dims::new());
                    for d in 0..before.len() {
                        if squeezed[d] {
                            out.0.push(ws[d]);
                            out.1.push(1);
                        } else if let Some((s0, n)) = kept.next() {
                            out.0.push(ws[d] + s0);
                            out.1.push(*n);
                        }
                    }
                    out
                }
                ViewStep::Bitcast(to) => {
                    let (rb, vb) = (bdtype.bit_width() as usize, to.bit_width() as usize);
                    let rank = before.len();
                    if rb != vb && rank >= 2 {
                        let (s0, n) = (starts[rank - 2], sizes[rank - 2]);
                        let first = s0 * vb / rb;
                        let last = ((s0 + n) * vb - 1) / rb;
                        starts[rank - 2] = first;
                        sizes[rank - 2] = last + 1 - first;
                    }
                    (starts, sizes)
                }
                ViewStep::Reshape(to) => reshape_reach(before, to, &starts, &sizes),
            };
        }
        (starts, sizes)
    }

    /// A window (`starts`, `sizes`, `squeezed` over this view's shape) that is a plain window of the
    /// ref itself, in the ref's coordinates: when the view is one reshape merging the ref's leading
    /// dimensions into its first (`[pages, page_size, ..]` as token rows `[pages · page_size, ..]`)
    /// and the window's first dimension stays within one row of the last merged dimension (the
    /// tokens of one page). The same elements, in the same order, of the same value shape; `None`
    /// for any other view or window.
    pub fn as_ref_window(
        &self,
        starts: &[usize],
        sizes: &[usize],
        squeezed: &[bool],
    ) -> Option<(Dims, Dims, Flags)> {
        let [ViewStep::Reshape(to)] = &self.steps[..] else {
            return None;
        };
        let from = &self.base_shape;
        if to.is_empty() || to.len() > from.len() || starts.len() != to.len() {
            return None;
        }
        // `to` = [from[0] · .. · from[k], from[k + 1], ..].
        let k = from.len() - to.len();
        if to[1..] != from[k + 1..] || from[..=k].iter().product::<usize>() != to[0] {
            return None;
        }
        let (a, n) = (starts[0], sizes[0]);
        if n == 0 || from[k] == 0 || a % from[k] + n > from[k] {
            return None;
        }
        let mut lead: Dims = smallvec::smallvec![0; k + 1];
        let mut f = a;
        for d in (0..=k).rev() {
            lead[d] = f % from[d];
            f /= from[d];
        }
        let mut out: (Dims, Dims, Flags) = (
            lead,
            smallvec::smallvec![1; k],
            smallvec::smallvec![true; k],
        );
        out.1.push(n);
        out.2.push(squeezed[0]);
        out.0.extend_from_slice(&starts[1..]);
        out.1.extend_from_slice(&sizes[1..]);
        out.2.extend_from_slice(&squeezed[1..]);
        Some(out)
    }
}

fn step_result(s: &ViewStep, shape: &[usize], dtype: DType) -> (Dims, DType) {
    match s {
        ViewStep::Window {
            sizes, squeezed, ..
        } => (
            sizes
                .iter()
                .zip(squeezed)
                .filter(|(_, q)| !**q)
                .map(|(n, _)| *n)
                .collect(),
            dtype,
        ),
        ViewStep::Bitcast(to) => {
            let mut out = Dims::from_slice(shape);
            let rank = out.len();
            if rank >= 2 {
                out[rank - 2] =
                    out[rank - 2] * dtype.bit_width() as usize / to.bit_width() as usize;
            }
            (out, *to)
        }
        ViewStep::Reshape(to) => (to.clone(), dtype),
    }
}

/// The box of a `from`-shaped array around the elements a box of its `to`-shaped reshape covers.
fn reshape_reach(from: &[usize], to: &[usize], starts: &[usize], sizes: &[usize]) -> (Dims, Dims) {
    if sizes.contains(&0) {
        return (
            smallvec::smallvec![0; from.len()],
            smallvec::smallvec![0; from.len()],
        );
    }
    let flat = |idx: &[usize], shape: &[usize]| {
        idx.iter()
            .zip(shape)
            .fold(0usize, |acc, (i, n)| acc * n + i)
    };
    let unflat = |mut f: usize, shape: &[usize]| {
        let mut idx: Dims = smallvec::smallvec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = f % shape[d];
            f /= shape[d];
        }
        idx
    };
    let last: Dims = starts.iter().zip(sizes).map(|(s, n)| s + n - 1).collect();
    let (a, b) = (
        unflat(flat(starts, to), from),
        unflat(flat(&last, to), from),
    );
    // Equal leading coordinates are exact; from the first that differs, that dimension spans the
    // two and every later one is whole.
    let mut out = (
        Dims::with_capacity(from.len()),
        Dims::with_capacity(from.len()),
    );
    let mut spread = false;
    for d in 0..from.len() {
        if spread {
            out.0.push(0);
            out.1.push(from[d]);
        } else if a[d] == b[d] {
            out.0.push(a[d]);
            out.1.push(1);
        } else {
            out.0.push(a[d]);
            out.1.push(b[d] + 1 - a[d]);
            spread = true;
        }
    }
    (out.0, out.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_of_a_bitcast_reaches_the_rows_it_packs() {
        // bf16 [2, 16, 128] seen as u32 [2, 8, 128]; window [1, 2..4, ..] → bf16 rows 4..8 of slot 1.
        let mut p = ViewPath::new(&[2, 16, 128], DType::BF16);
        p.steps.push(ViewStep::Bitcast(DType::U32));
        p.steps.push(ViewStep::Window {
            starts: smallvec::smallvec![1, 2, 0],
            sizes: smallvec::smallvec![1, 2, 128],
            squeezed: smallvec::smallvec![true, false, false],
        });
        assert_eq!(p.result(), (smallvec::smallvec![2, 128], DType::U32));
        assert_eq!(
            p.reach(),
            (smallvec::smallvec![1, 4, 0], smallvec::smallvec![1, 4, 128])
        );
    }

    #[test]
    fn a_window_of_a_reshape_reaches_the_pages_it_crosses() {
        // [4 pages, 16 rows, 128] seen as [64, 128]; rows 20..28 are page 1, rows 4..12: exact.
        let mut p = ViewPath::new(&[4, 16, 128], DType::F32);
        p.steps
            .push(ViewStep::Reshape(smallvec::smallvec![64, 128]));
        p.steps.push(ViewStep::Window {
            starts: smallvec::smallvec![20, 0],
            sizes: smallvec::smallvec![8, 128],
            squeezed: smallvec::smallvec![false, false],
        });
        assert_eq!(
            p.reach(),
            (smallvec::smallvec![1, 4, 0], smallvec::smallvec![1, 8, 128])
        );
        // Rows 12..20 cross from page 0 into page 1: both pages, every row (the box around them).
        if let Some(ViewStep::Window { starts, .. }) = p.steps.last_mut() {
            starts[0] = 12;
        }
        assert_eq!(
            p.reach(),
            (
                smallvec::smallvec![0, 0, 0],
                smallvec::smallvec![2, 16, 128]
            )
        );
    }

    /// Every window of token rows `[6, 3, 2]` of a `[2, 3, 3, 2]` ref (leading dimensions merged):
    /// `as_ref_window` answers exactly when the window stays within one page, and its plain window
    /// holds the view window's elements in the same order, of the same value shape.
    #[test]
    fn a_window_within_one_page_of_token_rows_is_a_plain_window() {
        let from = [2usize, 3, 3, 2];
        let mut p = ViewPath::new(&from, DType::F32);
        p.steps
            .push(ViewStep::Reshape(smallvec::smallvec![6, 3, 2]));
        let flat = |idx: &[usize], shape: &[usize]| {
            idx.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
        };
        // The flat offsets a window covers, row-major, and its value shape.
        let cover = |shape: &[usize], starts: &[usize], sizes: &[usize], sq: &[bool]| {
            let mut out = Vec::new();
            let n: usize = sizes.iter().product();
            for k in 0..n {
                let (mut idx, mut f) = (vec![0; sizes.len()], k);
                for d in (0..sizes.len()).rev() {
                    idx[d] = starts[d] + f % sizes[d];
                    f /= sizes[d];
                }
                out.push(flat(&idx, shape));
            }
            let kept: Vec<usize> = sizes
                .iter()
                .zip(sq)
                .filter(|(_, q)| !**q)
                .map(|(n, _)| *n)
                .collect();
            (out, kept)
        };
        let mut plain = 0;
        for a in 0..6 {
            for n in 1..=6 - a {
                for (b, m) in [(0, 3), (1, 1), (2, 1)] {
                    for sq0 in [false, true] {
                        if sq0 && n != 1 {
                            continue;
                        }
                        let (starts, sizes, sq) =
                            ([a, b, 0], [n, m, 2], [sq0, m == 1 && b == 2, false]);
                        let got = p.as_ref_window(&starts, &sizes, &sq);
                        assert_eq!(got.is_some(), a % 3 + n <= 3, "{starts:?} {sizes:?}");
                        let Some((s2, z2, q2)) = got else { continue };
                        assert_eq!(
                            cover(&[6, 3, 2], &starts, &sizes, &sq),
                            cover(&from, &s2, &z2, &q2)
                        );
                        plain += 1;
                    }
                }
            }
        }
        assert!(plain > 20);
        // Anything but one leading merge is not a plain window.
        let mut q = ViewPath::new(&from, DType::F32);
        q.steps
            .push(ViewStep::Reshape(smallvec::smallvec![2, 9, 2]));
        assert_eq!(q.as_ref_window(&[0, 0, 0], &[1, 1, 2], &[false; 3]), None);
        let mut b = ViewPath::new(&from, DType::F32);
        b.steps.push(ViewStep::Bitcast(DType::U32));
        assert_eq!(
            b.as_ref_window(&[0, 0, 0, 0], &[1, 1, 1, 2], &[false; 4]),
            None
        );
    }
}

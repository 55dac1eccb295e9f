//! Static slices of traced values: `x.slice((.., 0..1))` (Pallas's `x[:, :1]` on a value) →
//! `vector.extract_strided_slice`, with integer indices squeezing their dimension (`x.slice((0, ..))`,
//! Pallas's `x[0]`) through a reshape.
//!
//! Which slices Mosaic compiles was measured with libtpu (v5e and v6e, `tests/toolchain_cases.rs` and
//! `python/tests/test_agreement.py` hold the evidence): every static stride-1 slice of an f32, bf16 or
//! i32 value, tile-aligned or not (`x[:, 1:2]`, `x[3:11, :]`, `x[:, 1:129]`), and unaligned slices of
//! 8-bit values that are only moved (slicing is not where 8-bit vectors fail: arithmetic on them is). So
//! the only rules checked here are the ones of the op itself: static bounds inside the value, non-empty
//! windows, and an index per dimension at most.

use super::array::Array;
use super::refs::{IntoSliceSpec, SliceDim, SliceSpec};
use super::{emit, Arg};
use crate::dtype::Element;
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{OpKind, Type};

/// A slice resolved against a value's shape: the window, and which dimensions an index drops.
struct Resolved {
    offsets: Vec<usize>,
    sizes: Vec<usize>,
    squeezed: Vec<bool>,
}

fn resolve(shape: &[usize], spec: &SliceSpec) -> Result<Resolved> {
    if spec.0.len() > shape.len() {
        return Err(kerr!(
            Shape,
            "{} indices given for a value of rank {} (shape {shape:?})",
            spec.0.len(),
            shape.len()
        ));
    }
    let mut r = Resolved {
        offsets: vec![0; shape.len()],
        sizes: shape.to_vec(),
        squeezed: vec![false; shape.len()],
    };
    for (d, dim) in spec.0.iter().enumerate() {
        let constant = |a: Arg| {
            match a {
            Arg::Lit(l) => Ok(l.as_i64()),
            Arg::Val(_) => Err(kerr!(
                Shape,
                "a value can only be sliced at constant positions (dimension {d} has a traced start); \
                 slice the ref it was loaded from instead: `r.at((ds(i, n), ..)).load()`"
            )),
        }
        };
        let (start, size, squeeze) = match *dim {
            SliceDim::Full => continue,
            SliceDim::From(s) => (s as i64, (shape[d] as i64 - s as i64).max(1), false),
            SliceDim::Sized { .. } => {
                return Err(kerr!(
                    Shape,
                    "a value slice takes constant sizes (dimension {d} has a traced size); a run-time size is for DMA windows"
                ))
            }
            SliceDim::Range { stride, .. } if stride != 1 => {
                return Err(kerr!(
                    Unsupported,
                    "a value slice takes stride 1 (dimension {d} has `.stride({stride})`); strided windows are for refs: `r.at((ds(i, n).stride({stride}), ..)).load()`"
                ))
            }
            SliceDim::Range { start, size, .. } => (constant(start)?, size as i64, false),
            SliceDim::Index(i) => (constant(i)?, 1, true),
        };
        if size <= 0 {
            return Err(kerr!(
                Shape,
                "an empty slice along dimension {d} of a value of shape {shape:?}; every dimension of a kernel value needs at least one element"
            ));
        }
        if start < 0 || start + size > shape[d] as i64 {
            let what = if squeeze {
                format!("index {start}")
            } else {
                format!("slice {start}..{}", start + size)
            };
            return Err(kerr!(
                OutOfBounds,
                "{what} along dimension {d} is out of bounds for a value of shape {shape:?}"
            ));
        }
        r.offsets[d] = start as usize;
        r.sizes[d] = size as usize;
        r.squeezed[d] = squeeze;
    }
    Ok(r)
}

impl<T: Element> Array<T> {
    /// A static window of this value (`x[:, :1]` in Pallas): one entry per leading dimension, each a
    /// constant range `a..b`, `a..`, `..b`, `..` (whole dimension) or an integer index, which drops the
    /// dimension (`x.slice((0, ..))` is `x[0]`). Lowers to `vector.extract_strided_slice` (+
    /// `vector.shape_cast` when an index drops a dimension). A traced start is refused: slice the ref
    /// instead (`r.at((ds(i, 8), ..)).load()`).
    #[track_caller]
    pub fn slice(self, idx: impl IntoSliceSpec) -> Array<T> {
        let loc = SourceLoc::caller();
        let spec = idx.into_spec();
        Array::from_val(emit(loc, |t| {
            let (shape, d) = match t.ty(self.v)? {
                Type::Vector(s, d) => (s.clone(), *d),
                other => return Err(kerr!(Shape, "`slice` needs an array, got {other}")),
            };
            let r = resolve(&shape, &spec)?;
            let kept: Vec<usize> = r
                .sizes
                .iter()
                .zip(&r.squeezed)
                .filter(|(_, s)| !**s)
                .map(|(n, _)| *n)
                .collect();
            if kept.is_empty() {
                return Err(kerr!(
                    Shape,
                    "indexing every dimension of a value of shape {shape:?} would give a single element, which kernels do not hold as a value; keep one dimension with a range, e.g. `i..i + 1`"
                ));
            }
            let id = t.check(self.v)?;
            let whole = r.offsets.iter().all(|o| *o == 0) && r.sizes == shape;
            let sliced = if whole {
                id
            } else {
                let v = t.push1(
                    OpKind::Slice {
                        offsets: r.offsets,
                        sizes: r.sizes.clone(),
                    },
                    vec![id],
                    Type::Vector(r.sizes.clone(), d),
                    loc,
                );
                t.check(v)?
            };
            if kept == r.sizes {
                return Ok(t.val(sliced));
            }
            Ok(t.push1(OpKind::Reshape, vec![sliced], Type::Vector(kept, d), loc))
        }))
    }
}

//! Ref views and value bitcasts: `r.bitcast::<U>()` (Pallas's `ref.bitcast` → `tpu.memref_bitcast`),
//! `r.reshape([..])` (`ref.reshape` → `tpu.memref_reshape`), the same on windows
//! (`r.at(i).reshape([..])`), and `x.bitcast::<U>()` on values (`pltpu.bitcast` → `tpu.bitcast`).
//!
//! A view is a ref: windows, loads, stores and DMA take it like any other. What the views accept is
//! what libtpu compiles (probed with Pallas twins for v5e, v6e and tpu7x; `python/tests/test_ref_views.py`
//! holds the cases):
//! - a bitcast that changes the bit width packs consecutive rows of the second-to-last dimension into
//!   one element (or unpacks them), the lowest bits first, so that dimension scales by the ratio;
//! - a reshape keeps the last (lane) dimension — Mosaic refuses folding lanes into rows ("Supported only
//!   when (a) tiled dimensions remain unchanged, except maybe for tile-aligned folding/unfolding of the
//!   first tiled dimension") — and regroups leading dimensions, or folds them into (unfolds them from)
//!   the rows when the rows are tile-aligned. Measured with libtpu 0.0.51 (`python/tests/test_ref_views.py`
//!   sweeps 1 to 24 rows of f32, bf16 and i8 and holds our verdicts to libtpu's): folding takes rows
//!   that are a multiple of 8, or 1, 2 or 4 rows filling a 32-bit word (2 or 4 of a 16-bit type, 4 of
//!   an 8-bit one); unfolding gives any rows of a 32-bit type, a multiple of 8 of a 16-bit one, none of
//!   an 8-bit one; regrouping leading dimensions keeps any rows but 32-bit rows that are tile-padded
//!   (not a multiple of 8, nor 1, 2 or 4). Each refused case is libtpu's "Reshape on a non-contiguous
//!   memref" or the message above;
//! - the ref viewed is whole or a window that is one contiguous run of its ref (leading dimensions
//!   indexed, the rest whole), in VMEM or ANY (HBM); SMEM and semaphore refs have no views.

use super::array::Array;
use super::refs::{
    ref_type, window_ref, KernelParam, MemorySpace, Ref, RefMut, SliceSpec, View, ViewMut,
};
use super::{emit, Val};
use crate::dtype::{DType, Element};
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{MemSpace, OpKind, Type, DYNAMIC};

/// The shape of `shape` bitcast from `from` to `to`: the second-to-last dimension scaled by the ratio
/// of the bit widths (one shape rule for refs and values).
fn bitcast_shape(what: &str, shape: &[usize], from: DType, to: DType) -> Result<Vec<usize>> {
    for d in [from, to] {
        if d == DType::I4 {
            return Err(kerr!(
                DType,
                "cannot bitcast {what} of int4 (to or from): int4 packs 8 elements a word in its own layout, and libtpu's verdict on an int4 bitcast is unmeasured; cast instead (`.cast::<i8>()`)"
            ));
        }
        if d == DType::Bool {
            return Err(kerr!(
                DType,
                "cannot bitcast {what} of bool: a mask has no bit pattern Mosaic exposes; cast it (`.cast::<i32>()`) instead"
            ));
        }
    }
    let (a, b) = (from.bit_width() as usize, to.bit_width() as usize);
    let mut out = shape.to_vec();
    if a == b {
        return Ok(out);
    }
    let rank = shape.len();
    if rank < 2 {
        return Err(kerr!(
            Shape,
            "cannot bitcast {what} of shape {shape:?} from {from} to {to}: a bitcast that changes the bit width packs rows of the second-to-last dimension, so it needs rank 2 or more"
        ));
    }
    let rows = shape[rank - 2];
    if !(rows * a).is_multiple_of(b) {
        return Err(kerr!(
            Shape,
            "cannot bitcast {what} of shape {shape:?} from {from} to {to}: its {rows} rows (second-to-last dimension) of {a} bits do not pack into whole {b}-bit elements; use a multiple of {} rows",
            b / gcd(a, b)
        ));
    }
    out[rank - 2] = rows * a / b;
    Ok(out)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Whether `rows` rows of a `bits`-bit type fold with leading dimensions (libtpu's measured cases).
fn rows_fold(rows: usize, bits: u32) -> bool {
    rows.is_multiple_of(8) || (matches!(rows, 1 | 2 | 4) && rows * bits as usize >= 32)
}

/// Whether a result of `rows` rows of a `bits`-bit type unfolds from more rows.
fn rows_unfold(rows: usize, bits: u32) -> bool {
    match bits {
        32 => true,
        16 => rows.is_multiple_of(8),
        _ => false,
    }
}

/// The reshape of a ref of `shape` (element type `d`) into `to`, checked as libtpu checks it.
fn check_reshape(shape: &[usize], d: DType, to: &[usize]) -> Result<()> {
    let (n, m) = (
        shape.iter().product::<usize>(),
        to.iter().product::<usize>(),
    );
    if n != m {
        return Err(kerr!(
            Shape,
            "cannot reshape a ref of shape {shape:?} ({n} elements) into {to:?} ({m} elements)"
        ));
    }
    if shape.len() < 2 || to.len() < 2 {
        return Err(kerr!(
            Shape,
            "cannot reshape a ref of shape {shape:?} into {to:?}: ref reshapes keep rank 2 or more (Pallas refuses reshaping a 1-D ref)"
        ));
    }
    let (lanes, new_lanes) = (shape[shape.len() - 1], to[to.len() - 1]);
    if lanes != new_lanes {
        return Err(kerr!(
            Shape,
            "cannot reshape a ref of shape {shape:?} into {to:?}: the last (lane) dimension must stay {lanes} (Mosaic: \"Supported only when (a) tiled dimensions remain unchanged, except maybe for tile-aligned folding/unfolding of the first tiled dimension\"); reshape the leading dimensions and rows, or load the value and reshape it"
        ));
    }
    let (rows, new_rows) = (shape[shape.len() - 2], to[to.len() - 2]);
    let bits = d.bit_width();
    let ok = if new_rows == rows {
        // Leading dimensions regrouped: 32-bit rows must not be tile-padded.
        bits != 32 || rows % 8 == 0 || matches!(rows, 1 | 2 | 4)
    } else if new_rows > rows && new_rows % rows == 0 {
        rows_fold(rows, bits)
    } else if rows > new_rows && rows % new_rows == 0 {
        rows_unfold(new_rows, bits)
    } else {
        false
    };
    if !ok {
        return Err(kerr!(
            Shape,
            "cannot reshape a ref of shape {shape:?} ({d}) into {to:?}: its rows (second-to-last dimension) go from {rows} to {new_rows}, which libtpu refuses for {d} (\"Reshape on a non-contiguous memref\": the rows are not tile-aligned); keep the rows and regroup only the leading dimensions, or use rows that are a multiple of 8"
        ));
    }
    Ok(())
}

fn viewable(space: MemSpace, what: &str) -> Result<()> {
    match space {
        MemSpace::Vmem | MemSpace::Any => Ok(()),
        MemSpace::Smem => Err(kerr!(
            Unsupported,
            "cannot {what} an SMEM ref: views are of VMEM and ANY (HBM) refs; read the scalars you need with `r.at((i, j)).load()`"
        )),
        MemSpace::Sem(_) => Err(kerr!(
            Unsupported,
            "cannot {what} a semaphore array: pick one semaphore with `.at(i)`"
        )),
    }
}

/// `RefBitcast` of ref `r` to `to`.
fn ref_bitcast(r: Val, to: DType, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (shape, d, space) = ref_type(t, r)?;
        viewable(space, "bitcast")?;
        if shape.contains(&DYNAMIC) {
            return Err(kerr!(
                Unsupported,
                "cannot bitcast a window with a run-time size; view the ref first, then take the window"
            ));
        }
        let out = bitcast_shape("a ref", &shape, d, to)?;
        let operands = vec![t.check(r)?];
        Ok(t.push1(OpKind::RefBitcast, operands, Type::Ref(out, to, space), loc))
    })
}

/// `RefReshape` of ref `r` into `to`.
fn ref_reshape(r: Val, to: &[usize], loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (shape, d, space) = ref_type(t, r)?;
        viewable(space, "reshape")?;
        if shape.contains(&DYNAMIC) {
            return Err(kerr!(
                Unsupported,
                "cannot reshape a window with a run-time size; reshape the ref first, then take the window"
            ));
        }
        check_reshape(&shape, d, to)?;
        let operands = vec![t.check(r)?];
        Ok(t.push1(
            OpKind::RefReshape,
            operands,
            Type::Ref(to.to_vec(), d, space),
            loc,
        ))
    })
}

/// A window of `r` as a ref, refused unless it is one contiguous run of `r` (Mosaic reshapes and
/// bitcasts contiguous memrefs only).
fn contiguous_window(r: Val, spec: &SliceSpec, what: &str, loc: SourceLoc) -> Val {
    emit(loc, |t| {
        let (shape, _, _) = ref_type(t, r)?;
        let (v, w) = window_ref(t, r, spec, loc)?;
        // Leading dimensions may be indexed or partial, but after the first dimension of more than
        // one element every dimension must be whole.
        let first_run = (0..shape.len()).find(|&d| w.sizes[d] > 1);
        let whole_after = first_run.is_none_or(|k| {
            (k + 1..shape.len()).all(|d| w.sizes[d] == shape[d] && !w.dynamic_sizes[d])
        });
        if !whole_after || w.dynamic_sizes.contains(&true) || w.strides.iter().any(|s| *s != 1) {
            return Err(kerr!(
                Unsupported,
                "cannot {what} a window of a ref of shape {shape:?} that is not one contiguous run of it (Mosaic: \"Reshape on a non-contiguous memref\"): index or slice the leading dimensions and take the rest whole, e.g. `r.at(i).{what}(..)`"
            ));
        }
        Ok(v)
    })
}

macro_rules! view_api {
    ($H:ident, $W:ident) => {
        impl<T: Element, S: MemorySpace> $H<T, S> {
            /// This ref seen as element type `U` (Pallas's `ref.bitcast(U)`): the second-to-last
            /// dimension scales by the ratio of the bit widths, consecutive rows packed into one
            /// element (or unpacked from one), the lowest bits first. Windows, loads, stores and DMA
            /// take the view like any ref; writes through it write this ref.
            #[track_caller]
            pub fn bitcast<U: Element>(self) -> $H<U, S> {
                <$H<U, S>>::from_val(ref_bitcast(self.v, U::DTYPE, SourceLoc::caller()))
            }
            /// This ref seen with shape `shape` (Pallas's `ref.reshape(..)`), the same elements in
            /// row-major order. The last dimension stays; leading dimensions regroup, or fold into
            /// (unfold from) tile-aligned rows (see the module docs of `trace::views`).
            #[track_caller]
            pub fn reshape(self, shape: impl AsRef<[usize]>) -> $H<T, S> {
                <$H<T, S>>::from_val(ref_reshape(self.v, shape.as_ref(), SourceLoc::caller()))
            }
        }
        impl<T: Element, S: MemorySpace> $W<T, S> {
            /// This window seen as element type `U` (`r.at(i).bitcast::<U>()`, Pallas's
            /// `r.at[i].bitcast(U)`): a view of its ref, as [`Ref::bitcast`]. The window must be one
            /// contiguous run of the ref (leading dimensions indexed, the rest whole).
            #[track_caller]
            pub fn bitcast<U: Element>(&self) -> $H<U, S> {
                let loc = SourceLoc::caller();
                let w = contiguous_window(self.r, &self.spec, "bitcast", loc);
                <$H<U, S>>::from_val(ref_bitcast(w, U::DTYPE, loc))
            }
            /// This window seen with shape `shape` (`r.at(i).reshape([..])`, Pallas's
            /// `r.at[i].reshape(..)`): a view of its ref, as [`Ref::reshape`]. The window must be one
            /// contiguous run of the ref (leading dimensions indexed, the rest whole).
            #[track_caller]
            pub fn reshape(&self, shape: impl AsRef<[usize]>) -> $H<T, S> {
                let loc = SourceLoc::caller();
                let w = contiguous_window(self.r, &self.spec, "reshape", loc);
                <$H<T, S>>::from_val(ref_reshape(w, shape.as_ref(), loc))
            }
            /// This window as a ref of its own (`r.at(i)` as Pallas's `r.at[i]`): windows, loads,
            /// stores and DMA of it address the ref it was taken from.
            #[track_caller]
            pub fn as_ref(&self) -> $H<T, S> {
                let loc = SourceLoc::caller();
                let v = emit(loc, |t| Ok(window_ref(t, self.r, &self.spec, loc)?.0));
                <$H<T, S>>::from_val(v)
            }
        }
    };
}
view_api!(Ref, View);
view_api!(RefMut, ViewMut);

impl<T: Element> Array<T> {
    /// The bits of this value as element type `U` (`pltpu.bitcast(x, U)`): the second-to-last
    /// dimension scales by the ratio of the bit widths, consecutive rows packed into one element (or
    /// unpacked from one), the lowest bits first — the same rule as [`Ref::bitcast`].
    #[track_caller]
    pub fn bitcast<U: Element>(self) -> Array<U> {
        let loc = SourceLoc::caller();
        Array::from_val(emit(loc, |t| {
            let (shape, d) = match t.ty(self.v)? {
                Type::Vector(s, d) => (s.clone(), *d),
                other => return Err(kerr!(Shape, "`bitcast` needs an array, got {other}")),
            };
            if shape.len() < 2 {
                return Err(kerr!(
                    Shape,
                    "cannot bitcast a value of shape {shape:?}: Mosaic bitcasts values of rank 2 or more (`tpu.bitcast`)"
                ));
            }
            let out = bitcast_shape("a value", &shape, d, U::DTYPE)?;
            let operands = vec![t.check(self.v)?];
            Ok(t.push1(OpKind::Bitcast, operands, Type::Vector(out, U::DTYPE), loc))
        }))
    }
}

//! Reading and writing a window of a ref view in place: each run of the window is walked back
//! through the view's path to the stretches of the ref's buffer it is made of, and only those
//! elements are touched. (Running the path forward over the whole ref — `views.rs`'s
//! `view_for_free` — is free for windows and reshapes of contiguous stages; a bitcast that changes
//! the element width, a reshape of a strided stage, and every write would copy whole stages.)
//!
//! A *run* is `len` elements of one stage from index `idx` on, `step` apart along its last
//! dimension. Each step of the path maps a run of the stage after it to runs of the stage before it:
//! - a window shifts the index (reinserting squeezed dimensions);
//! - a reshape keeps linear positions, so a run stays one run while the last dimension is unchanged
//!   and is cut at the old last dimension's row ends otherwise (element by element when strided);
//! - a bitcast keeps lanes and maps rows as [`bitcast_rows`](super::views::bitcast_rows) packs them:
//!   a wide element is `q` narrow rows' elements, the lowest bits first; a narrow element is its
//!   share of one wide row's element.
//!
//! At the ref, a run is a [`Segment`]: a stretch of the buffer and which bits of its elements are
//! which bits of the view's elements. Values travel as raw bits (`u64`); a write carries, per
//! element, the mask of the bits it sets, so a narrow element written through a wide ref sets its
//! share of the wide element and leaves the rest.

use super::*;
use crate::dtype::Element;
use crate::semantics::views::{ViewPath, ViewStep};
use smallvec::SmallVec;

mod cache;
mod halves;
pub(in crate::interpret) use cache::SegmentCache;
pub(in crate::interpret::machine) use cache::Segments;
pub(super) use halves::read_halves;

type Idx = SmallVec<[usize; 6]>;

/// `len` elements of the ref's buffer from `off`, `stride` apart: `bits` says which bits of each are
/// which bits of the view's elements `at..at + len` of the window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Segment {
    at: usize,
    len: usize,
    off: usize,
    stride: usize,
    bits: Bits,
}

/// A view's path, with each stage's shape and element width: stage 0 is the ref, the last the view;
/// and the strides and offset of the ref's buffer.
pub(super) struct Walk<'p> {
    steps: &'p [ViewStep],
    stages: Vec<(crate::semantics::dma::Dims, DType)>,
    base_strides: Vec<usize>,
    base_offset: usize,
}

/// The mask of the lowest `bits` bits.
pub(super) fn ones(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The sizes of a window's value: `sizes` without the `squeezed` dimensions.
pub(super) fn kept_sizes(sizes: &[usize], squeezed: &[bool]) -> Vec<usize> {
    sizes
        .iter()
        .zip(squeezed)
        .filter(|(_, q)| !**q)
        .map(|(n, _)| *n)
        .collect()
}

fn linear(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
}

fn delinear(mut lin: usize, shape: &[usize]) -> Idx {
    let mut idx: Idx = smallvec::smallvec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = lin % n;
        lin /= n;
    }
    idx
}

/// The bit ranges a segment carries: bits `rshift..rshift + width` of a stage's element are bits
/// `lshift..lshift + width` of the view's.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Bits {
    rshift: u32,
    width: u32,
    lshift: u32,
}

impl<'p> Walk<'p> {
    /// The walk of path `p` over a ref whose contents sit in a buffer at `offset` with `strides`.
    pub(super) fn new(p: &'p ViewPath, strides: &[usize], offset: usize) -> Walk<'p> {
        Walk {
            steps: &p.steps,
            stages: p.stages(),
            base_strides: strides.to_vec(),
            base_offset: offset,
        }
    }

    /// The view's shape and element type.
    pub(super) fn result(&self) -> (&[usize], DType) {
        let (s, d) = self.stages.last().expect("a path has its base stage");
        (s, *d)
    }

    /// The segments of run (`idx`, `len` elements from window position `at`, `step`) of stage `k`,
    /// carrying bits `b`, appended to `out`.
    fn segments(
        &self,
        k: usize,
        idx: &[usize],
        (at, len, step): (usize, usize, usize),
        b: Bits,
        out: &mut Vec<Segment>,
    ) -> Result<()> {
        if k == 0 {
            let off = self.base_offset
                + idx
                    .iter()
                    .zip(&self.base_strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            let stride = self.base_strides.last().copied().unwrap_or(0) * step;
            out.push(Segment {
                at,
                len,
                off,
                stride,
                bits: b,
            });
            return Ok(());
        }
        let (shape, to) = &self.stages[k];
        let (prev, from) = &self.stages[k - 1];
        // Element by element, each mapped by `back`.
        let each = |back: &dyn Fn(&[usize]) -> Idx, out: &mut Vec<Segment>| -> Result<()> {
            let mut j: Idx = idx.into();
            let first = j.last().copied().unwrap_or(0);
            for i in 0..len {
                if let Some(l) = j.last_mut() {
                    *l = first + i * step;
                }
                self.segments(k - 1, &back(&j), (at + i, 1, 1), b, out)?;
            }
            Ok(())
        };
        match &self.steps[k - 1] {
            ViewStep::Window {
                starts, squeezed, ..
            } => {
                let back = |idx: &[usize]| -> Idx {
                    let mut it = idx.iter();
                    (0..prev.len())
                        .map(|d| {
                            starts[d]
                                + if squeezed[d] {
                                    0
                                } else {
                                    *it.next().unwrap_or(&0)
                                }
                        })
                        .collect()
                };
                if len > 1 && squeezed.last() == Some(&true) {
                    each(&back, out)
                } else {
                    self.segments(k - 1, &back(idx), (at, len, step), b, out)
                }
            }
            ViewStep::Reshape(_) => {
                let back = |idx: &[usize]| delinear(linear(idx, shape), prev);
                if len <= 1 || shape.last() == prev.last() {
                    self.segments(k - 1, &back(idx), (at, len, step), b, out)
                } else if step == 1 {
                    // Consecutive positions stay consecutive: cut at the old rows' ends.
                    let row = prev.last().copied().unwrap_or(1).max(1);
                    let (mut lin, mut done) = (linear(idx, shape), 0);
                    while done < len {
                        let n = (row - lin % row).min(len - done);
                        self.segments(k - 1, &delinear(lin, prev), (at + done, n, 1), b, out)?;
                        done += n;
                        lin += n;
                    }
                    Ok(())
                } else {
                    each(&back, out)
                }
            }
            ViewStep::Bitcast(_) => {
                let (wa, wb) = (from.bit_width(), to.bit_width());
                if wa == wb {
                    return self.segments(k - 1, idx, (at, len, step), b, out);
                }
                if shape.len() < 2 {
                    return Err(internal("a width-changing bitcast of rank < 2"));
                }
                let r = shape.len() - 2;
                let mut j: Idx = idx.into();
                if wa < wb {
                    // A wide element is `q` narrow rows' elements, the lowest bits first: part `kk`
                    // is its bits kk·a..(kk + 1)·a.
                    let q = (wb / wa) as usize;
                    for kk in 0..q {
                        let (lo, hi) = (kk as u32 * wa, (kk as u32 + 1) * wa);
                        let (s, e) = (b.rshift.max(lo), (b.rshift + b.width).min(hi));
                        if s >= e {
                            continue;
                        }
                        j[r] = q * idx[r] + kk;
                        let part = Bits {
                            rshift: s - lo,
                            width: e - s,
                            lshift: b.lshift + (s - b.rshift),
                        };
                        self.segments(k - 1, &j, (at, len, step), part, out)?;
                    }
                    Ok(())
                } else {
                    // A narrow element is bits sh..sh + b of one wide row's element.
                    let q = (wa / wb) as usize;
                    j[r] = idx[r] / q;
                    let sh = (idx[r] % q) as u32 * wb;
                    let share = Bits {
                        rshift: b.rshift + sh,
                        ..b
                    };
                    self.segments(k - 1, &j, (at, len, step), share, out)
                }
            }
        }
    }

    /// The segments of the window (`starts`, `sizes` `steps` apart, `squeezed` dropped) of the view,
    /// positions counted in the window's row-major order.
    pub(super) fn window(
        &self,
        (starts, sizes, squeezed): (&[usize], &[usize], &[bool]),
        steps: &[usize],
    ) -> Result<Vec<Segment>> {
        let (shape, dtype) = self.result();
        let all = Bits {
            rshift: 0,
            width: dtype.bit_width(),
            lshift: 0,
        };
        let k = self.steps.len();
        let mut out = Vec::new();
        let rank = shape.len();
        if rank == 0 {
            self.segments(k, &[], (0, 1, 1), all, &mut out)?;
            return Ok(out);
        }
        let last = rank - 1;
        let (len, step) = if squeezed[last] {
            (1, 1)
        } else {
            (sizes[last], steps[last])
        };
        let outer: Vec<usize> = (0..last)
            .map(|d| if squeezed[d] { 1 } else { sizes[d] })
            .collect();
        if len == 0 || outer.contains(&0) {
            return Ok(out);
        }
        let mut idx: Idx = starts.into();
        let mut pos = vec![0usize; last];
        for n in 0..outer.iter().product::<usize>() {
            for d in 0..last {
                idx[d] = starts[d] + pos[d] * steps[d];
            }
            self.segments(k, &idx, (n * len, len, step), all, &mut out)?;
            // The next outer position, the last dimension fastest.
            for d in (0..last).rev() {
                pos[d] += 1;
                if pos[d] < outer[d] {
                    break;
                }
                pos[d] = 0;
            }
        }
        Ok(out)
    }
}

/// Gather `segs` from `base` (the ref's contents) into the window's elements, of type `dtype`.
pub(super) fn read(base: &Tensor, segs: &[Segment], dtype: DType, n: usize) -> Result<HostData> {
    Ok(with_dtype!(base.dtype, T => {
        let data = base.data::<T>()?;
        with_dtype!(dtype, U => U::wrap(gather::<T, U>(data, segs, n)?))
    }))
}

/// The bit width of `T` when its elements are plain bits filling their bytes (8, 16 or 32: every
/// pattern a value, as [`raw_bits`] reads them), else None (bool, int4).
fn plain_width<T: Element>() -> Option<u32> {
    let w = T::DTYPE.bit_width();
    (T::DTYPE != DType::Bool
        && w == 8 * std::mem::size_of::<T>() as u32
        && matches!(w, 8 | 16 | 32))
    .then_some(w)
}

/// `src`'s elements as the unsigned integers `S` of their size (their bits).
pub(super) fn raw_bits<T: Element, S>(src: &[T]) -> &[S] {
    assert!(
        std::mem::size_of::<T>() == std::mem::size_of::<S>()
            && std::mem::align_of::<T>() >= std::mem::align_of::<S>()
            && T::DTYPE != DType::Bool
    );
    // SAFETY: checked above: `T` and `S` have one size and `T`'s alignment suffices for `S`; the
    // non-bool element types are integers, IEEE floats and `#[repr(transparent)]` newtypes of `u8`
    // (the 8-bit floats, int4), with no padding, so their bytes are initialized and every pattern is
    // an `S` (`u8`/`u16`/`u32`).
    unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<S>(), src.len()) }
}

crate::interpret::simd::multiversion! {
/// [`gather`] over raw bits into 32-bit words: each segment ORs its share into its words (the
/// segments of a window cover each bit of each element once), one loop per segment.
fn gather_bits[S: Copy + Into<u32>](src: &[S], segs: &[Segment], out: &mut [u32]) -> Result<()> {
    for s in segs {
        if s.len == 0 {
            continue;
        }
        if s.off + s.stride * (s.len - 1) >= src.len() || s.at + s.len > out.len() {
            return Err(internal("view read outside its ref"));
        }
        let (m, rs, ls) = (ones(s.bits.width) as u32, s.bits.rshift, s.bits.lshift);
        let dst = &mut out[s.at..s.at + s.len];
        let bits = |x: S| ((x.into() >> rs) & m) << ls;
        match s.stride {
            0 => {
                let x = bits(src[s.off]);
                dst.iter_mut().for_each(|o| *o |= x);
            }
            1 => dst
                .iter_mut()
                .zip(&src[s.off..s.off + s.len])
                .for_each(|(o, &x)| *o |= bits(x)),
            step => dst
                .iter_mut()
                .zip(src[s.off..].iter().step_by(step))
                .for_each(|(o, &x)| *o |= bits(x)),
        }
    }
    Ok(())
}
}

/// [`read`] for ref elements `T` and view elements `U`: over raw bits when both are plain (a 32-bit
/// view of narrow rows: keys and values packed in words), else element by element.
fn gather<T: HostElement, U: HostElement>(
    data: &[T],
    segs: &[Segment],
    n: usize,
) -> Result<Vec<U>> {
    if let (Some(w), Some(32)) = (plain_width::<T>(), plain_width::<U>()) {
        // From the buffer pool: a fresh block-sized buffer faults its pages in on every read.
        let mut out = crate::interpret::tensor::take_vec::<u32>(n);
        out.resize(n, 0);
        match w {
            8 => gather_bits(raw_bits::<T, u8>(data), segs, &mut out)?,
            16 => gather_bits(raw_bits::<T, u16>(data), segs, &mut out)?,
            _ => gather_bits(raw_bits::<T, u32>(data), segs, &mut out)?,
        }
        return Ok(super::views::reuse::<u32, U>(out));
    }
    gather_elements(data, segs, n)
}

crate::interpret::simd::multiversion! {
/// [`read`] for ref elements `T` and view elements `U` (every element type is at most 32 bits wide,
/// so the bits travel as `u32`).
fn gather_elements[T: HostElement, U: HostElement](
    data: &[T],
    segs: &[Segment],
    n: usize,
) -> Result<Vec<U>> {
    let mut out = crate::interpret::tensor::take_vec::<U>(n);
    out.resize(n, U::from_literal_bits(0));
    let full = ones(U::DTYPE.bit_width()) as u32;
    for s in segs {
        if s.len == 0 {
            continue;
        }
        if s.off + s.stride * (s.len - 1) >= data.len() || s.at + s.len > n {
            return Err(internal("view read outside its ref"));
        }
        let (m, rs, ls) = (ones(s.bits.width) as u32, s.bits.rshift, s.bits.lshift);
        let dst = &mut out[s.at..s.at + s.len];
        // The whole element from this stretch (same width, or a narrow share of a wide one), or
        // its bits `ls..` (a wide element from narrow rows). Each loop has no branch, so it vectorizes.
        let bits = |x: &T| ((x.literal().bits as u32) >> rs) & m;
        let put = |o: &U, x: u32| U::from_literal_bits(u64::from(((o.literal().bits as u32) & full) | (x << ls)));
        let whole = ls == 0 && m & full == full;
        let src = if s.stride == 0 {
            // A broadcast (an unwritten ref's fill value): one element throughout.
            let x = bits(&data[s.off]);
            if whole {
                dst.fill(U::from_literal_bits(u64::from(x)));
            } else {
                dst.iter_mut().for_each(|o| *o = put(o, x));
            }
            continue;
        } else if s.stride == 1 {
            // Contiguous (the usual lane run): no index arithmetic.
            &data[s.off..s.off + s.len]
        } else {
            &data[s.off..=s.off + s.stride * (s.len - 1)]
        };
        let step = s.stride.max(1);
        if whole && step == 1 {
            dst.iter_mut()
                .zip(src)
                .for_each(|(o, x)| *o = U::from_literal_bits(u64::from(bits(x))));
        } else if step == 1 {
            dst.iter_mut().zip(src).for_each(|(o, x)| *o = put(o, bits(x)));
        } else {
            dst.iter_mut().zip(src.iter().step_by(step)).for_each(|(o, x)| {
                *o = if whole {
                    U::from_literal_bits(u64::from(bits(x)))
                } else {
                    put(o, bits(x))
                }
            });
        }
    }
    Ok(out)
}
}

/// `words` written into 16-bit `base` through `segs` when each word's low and high halves go to two
/// runs of elements, in order (a store through a 32-bit view of bf16 rows: the output block of a
/// kernel that packs two heads in a word): each half written once, no masks. False, nothing
/// written, for any other window.
pub(super) fn write_halves(base: &mut Tensor, segs: &[Segment], words: &[u32]) -> Result<bool> {
    let piece = |lshift| Bits {
        rshift: 0,
        width: 16,
        lshift,
    };
    let mut next = 0;
    let pairs = segs.len().is_multiple_of(2)
        && segs.chunks_exact(2).all(|p| {
            let ok = (p[0].bits, p[1].bits) == (piece(0), piece(16))
                && (p[0].at, p[1].at, p[0].len) == (next, next, p[1].len);
            next += p[0].len;
            ok
        });
    if base.dtype.bit_width() != 16 || !pairs || next != words.len() {
        return Ok(false);
    }
    with_dtype!(base.dtype, T => {
        let dst = base.buf.elems_mut::<T>()?;
        for (s, shift) in segs.iter().zip([0u32, 16].into_iter().cycle()) {
            if s.len > 0 && s.off + s.stride * (s.len - 1) >= dst.len() {
                return Err(internal("view write outside its ref"));
            }
            let half = |w: &u32| T::from_literal_bits(u64::from((w >> shift) & 0xFFFF));
            let src = &words[s.at..s.at + s.len];
            match s.stride {
                1 => dst[s.off..s.off + s.len].iter_mut().zip(src).for_each(|(x, w)| *x = half(w)),
                k => src.iter().enumerate().for_each(|(i, w)| dst[s.off + i * k] = half(w)),
            }
        }
    });
    Ok(true)
}

/// Scatter the window's elements `bits` (as bits; with `keep`, only the bits set in it are written)
/// into `base` (the ref's contents: their own row-major buffer), as `segs` place them.
pub(super) fn write(
    base: &mut Tensor,
    segs: &[Segment],
    (bits, keep): (&[u64], Option<&[u64]>),
) -> Result<()> {
    if keep.is_some_and(|k| k.len() != bits.len()) {
        return Err(internal("store mask does not match the stored value"));
    }
    let dtype = base.dtype;
    let full = ones(dtype.bit_width());
    with_dtype!(dtype, T => {
        let dst = base.buf.elems_mut::<T>()?;
        for s in segs {
            if s.len == 0 {
                continue;
            }
            if s.off + s.stride * (s.len - 1) >= dst.len() || s.at + s.len > bits.len() {
                return Err(internal("view write outside its ref"));
            }
            let (m, rs, ls) = (ones(s.bits.width), s.bits.rshift, s.bits.lshift);
            // With no mask, every element keeps the segment's whole piece.
            let whole = ((u64::MAX >> ls) & m) << rs & full;
            if keep.is_none() && whole == full {
                let src = &bits[s.at..s.at + s.len];
                // Every element replaced: one branch-free loop (it vectorizes).
                let put = |b: u64| T::from_literal_bits(((b >> ls) & m) << rs);
                if s.stride == 1 {
                    let run = &mut dst[s.off..s.off + s.len];
                    run.iter_mut().zip(src).for_each(|(x, &b)| *x = put(b));
                } else {
                    for (i, &b) in src.iter().enumerate() {
                        dst[s.off + i * s.stride] = put(b);
                    }
                }
                continue;
            }
            for i in 0..s.len {
                let v = ((bits[s.at + i] >> ls) & m) << rs;
                let k = keep.map_or(whole, |k| ((k[s.at + i] >> ls) & m) << rs & full);
                let x = &mut dst[s.off + i * s.stride];
                if k == full {
                    *x = T::from_literal_bits(v);
                } else if k != 0 {
                    let old = x.literal().bits & full;
                    *x = T::from_literal_bits((old & !k) | (v & k));
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests;

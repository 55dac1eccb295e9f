//! Ref views in a grid step (`r.bitcast::<U>()`, `r.reshape([..])` and windows of them): a view is its
//! ref plus a [`ViewPath`]; reading one runs the path forward over the ref's contents where every step
//! re-indexes for free, else reads, and writing one always writes, only the elements its window
//! covers, in place ([`walk`](super::walk)). Value bitcasts (`pltpu.bitcast`) share [`bitcast_rows`].

use super::walk::{self, kept_sizes, ones, raw_bits};
use super::*;
use crate::dtype::Element;
use crate::semantics::views::{ViewPath, ViewStep};

/// `t`'s bits as element type `to`: the second-to-last dimension scaled by the ratio of the bit widths,
/// consecutive rows packed into one element (or unpacked from one), the lowest bits first.
pub(crate) fn bitcast_rows(t: &Tensor, to: DType) -> Result<Tensor> {
    let from = t.dtype;
    let (a, b) = (from.bit_width() as usize, to.bit_width() as usize);
    let rank = t.shape.len();
    if from == DType::Bool || to == DType::Bool || (a != b && rank < 2) {
        return Err(internal("bitcast operands"));
    }
    let mut out_shape = t.shape.to_vec();
    if a != b {
        out_shape[rank - 2] = t.shape[rank - 2] * a / b;
    }
    let data = with_dtype!(from, T => {
        if a == b && a >= 8 && t.is_contiguous() {
            // Same width: the elements' bytes, copied once from the operand.
            let src = &t.data::<T>()?[t.offset..t.offset + t.numel()];
            with_dtype!(to, U => U::wrap(same_bits::<T, U>(src)))
        } else if b == 32 && (a == 8 || a == 16) && t.is_contiguous() {
            // Narrow rows packed into words (bf16 pairs, 8-bit quads), straight from the operand.
            let src = &t.data::<T>()?[t.offset..t.offset + t.numel()];
            with_dtype!(to, U => U::wrap(reuse::<u32, U>(pack_words(src, &t.shape))))
        } else {
            let src = t.to_vec::<T>()?;
            with_dtype!(to, U => U::wrap(repack::<T, U>(&src, &t.shape)))
        }
    });
    Ok(Tensor::from_data(out_shape, data))
}

/// [`bitcast_rows`] of a value the bitcast consumes: a same-width bitcast of a whole, contiguous
/// buffer nothing else holds reuses the buffer (the same bytes are the result's elements, as
/// [`same_bits`] copies them); anything else is copied as `bitcast_rows` copies it.
pub(crate) fn bitcast_consumed(t: Tensor, to: DType) -> Result<Tensor> {
    let whole = t.offset == 0 && t.is_contiguous() && t.numel() == t.buf.len();
    if t.dtype.bit_width() != to.bit_width() || t.dtype.bit_width() < 8 || !whole {
        let out = bitcast_rows(&t, to);
        recycle(t);
        return out;
    }
    let Buf::Host(arc) = t.buf else {
        return bitcast_rows(&t, to);
    };
    let data = match std::sync::Arc::try_unwrap(arc) {
        Ok(data) => data,
        Err(shared) => {
            let t = Tensor {
                buf: Buf::Host(shared),
                ..t
            };
            return bitcast_rows(&t, to);
        }
    };
    let data = with_dtype!(t.dtype, T => {
        let v = T::into_vec(data).ok_or_else(|| internal("bitcast operand type"))?;
        with_dtype!(to, U => U::wrap(reuse::<T, U>(v)))
    });
    Ok(Tensor::from_data(t.shape, data))
}

/// `v`'s elements as `U`s of the same bits, in `v`'s allocation when `T` and `U` have one size and
/// alignment (else copied, as [`same_bits`]).
pub(super) fn reuse<T: Element, U: Element>(v: Vec<T>) -> Vec<U> {
    use std::mem::{align_of, size_of};
    if size_of::<T>() != size_of::<U>()
        || align_of::<T>() != align_of::<U>()
        || T::DTYPE == DType::Bool
        || U::DTYPE == DType::Bool
    {
        return same_bits(&v);
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: the allocation came from a `Vec<T>` and `U` has `T`'s size and alignment, so it is a
    // valid allocation of `capacity` `U`s; its `len` elements are initialized, and their bytes are
    // `U` values with the same bits (see `same_bits` for why every such pattern is a value). The
    // `ManuallyDrop` keeps the `Vec<T>` from freeing what the `Vec<U>` now owns.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<U>(), v.len(), v.capacity()) }
}

/// `src`'s elements as `U`s of the same bits (`repack`'s same-width case), as one copy of bytes.
fn same_bits<T: Element, U: Element>(src: &[T]) -> Vec<U> {
    let size = std::mem::size_of::<T>();
    if size != std::mem::size_of::<U>() || T::DTYPE == DType::Bool || U::DTYPE == DType::Bool {
        return src
            .iter()
            .map(|x| U::from_literal_bits(x.literal().bits))
            .collect();
    }
    let mut out: Vec<U> = Vec::with_capacity(src.len());
    // SAFETY: `out` has room for `src.len()` elements of U, whose size is T's; the element types of
    // the non-bool dtypes of at least 8 bits are integers, IEEE floats (`f32`, `bf16`, `f16`) and
    // `#[repr(transparent)]` newtypes of `u8` (the 8-bit floats), in which every bit pattern is a
    // value and whose `literal().bits` / `from_literal_bits` are exactly those bits — so the copied
    // bytes are the elements `repack` would make. Every element is written before `set_len`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr().cast::<u8>(),
            out.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(src),
        );
        out.set_len(src.len());
    }
    out
}

/// [`repack`] from 8- or 16-bit `T` to 32-bit words, over the raw bits: each output row ORs its
/// `32 / bits(T)` source rows in, row by row (loops the compiler vectorizes).
fn pack_words<T: Element>(src: &[T], shape: &[usize]) -> Vec<u32> {
    match std::mem::size_of::<T>() {
        1 => pack_words_of(raw_bits::<T, u8>(src), shape),
        _ => pack_words_of(raw_bits::<T, u16>(src), shape),
    }
}

fn pack_words_of<S: Copy + Into<u32>>(src: &[S], shape: &[usize]) -> Vec<u32> {
    let rank = shape.len();
    let (rows, lanes) = (shape[rank - 2], shape[rank - 1]);
    let outer: usize = shape[..rank - 2].iter().product();
    let width = 8 * std::mem::size_of::<S>();
    let q = 32 / width;
    let new_rows = rows / q;
    let mut out: Vec<u32> = Vec::with_capacity(outer * new_rows * lanes);
    for o in 0..outer {
        for r in 0..new_rows {
            let base = (o * rows + q * r) * lanes;
            let start = out.len();
            out.extend(src[base..base + lanes].iter().map(|&x| x.into()));
            let word = &mut out[start..];
            for k in 1..q {
                let row = &src[base + k * lanes..base + (k + 1) * lanes];
                for (w, &x) in word.iter_mut().zip(row) {
                    *w |= x.into() << (k * width);
                }
            }
        }
    }
    out
}

/// [`bitcast_rows`] over `src` (row-major, of `shape`) from `T` to `U`, typed: one pass.
fn repack<T: Element, U: Element>(src: &[T], shape: &[usize]) -> Vec<U> {
    let (a, b) = (T::DTYPE.bit_width() as usize, U::DTYPE.bit_width() as usize);
    let bits = |x: &T| x.literal().bits & ones(a as u32);
    if a == b {
        return src.iter().map(|x| U::from_literal_bits(bits(x))).collect();
    }
    let rank = shape.len();
    let (rows, lanes) = (shape[rank - 2], shape[rank - 1]);
    let outer: usize = shape[..rank - 2].iter().product();
    if a < b {
        // Rows i = q·r + k (q = b / a) are the bits k·a.. of row r.
        let q = b / a;
        let new_rows = rows / q;
        let mut out = Vec::with_capacity(outer * new_rows * lanes);
        for o in 0..outer {
            for r in 0..new_rows {
                for j in 0..lanes {
                    let mut x = 0u64;
                    for k in 0..q {
                        x |= bits(&src[(o * rows + q * r + k) * lanes + j]) << (k * a);
                    }
                    out.push(U::from_literal_bits(x));
                }
            }
        }
        out
    } else {
        // Row i holds rows q·i + k (q = a / b), each b bits.
        let q = a / b;
        let mut out = Vec::with_capacity(outer * rows * q * lanes);
        for o in 0..outer {
            for i in 0..rows {
                for k in 0..q {
                    let row = &src[(o * rows + i) * lanes..(o * rows + i + 1) * lanes];
                    out.extend(
                        row.iter()
                            .map(|x| U::from_literal_bits((bits(x) >> (k * b)) & ones(b as u32))),
                    );
                }
            }
        }
        out
    }
}

/// One step run forward over `t`.
pub(super) fn forward(t: &Tensor, s: &ViewStep) -> Result<Tensor> {
    match s {
        ViewStep::Window {
            starts,
            sizes,
            squeezed,
        } => Ok(t.window(starts, sizes, squeezed)),
        ViewStep::Bitcast(to) => bitcast_rows(t, *to),
        ViewStep::Reshape(shape) => t.reshape(shape),
    }
}

/// Path `p` run over `base` (a ref's contents) as a view of the same buffer, where every step
/// re-indexes it for free (windows, and reshapes of contiguous stages); `None` where a step would copy.
pub(super) fn forward_for_free(base: &Tensor, p: &ViewPath) -> Result<Option<Tensor>> {
    if p.steps.iter().any(|s| matches!(s, ViewStep::Bitcast(_))) {
        return Ok(None);
    }
    let mut t = base.clone();
    for s in &p.steps {
        if matches!(s, ViewStep::Reshape(_)) && !t.is_contiguous() {
            return Ok(None);
        }
        t = forward(&t, s)?;
    }
    Ok(Some(t))
}

impl<'k> Machine<'k> {
    /// The path of view `v`: its own, or one from its ref through its window.
    pub(super) fn path_of_view<'v>(&self, v: &'v RefView) -> std::borrow::Cow<'v, ViewPath> {
        if let Some(p) = &v.via {
            return std::borrow::Cow::Borrowed(p);
        }
        let st = &self.refs[v.r];
        let mut p = ViewPath::new(&st.shape, st.dtype);
        if *v != RefView::whole(v.r, &st.shape) {
            p.steps.push(ViewStep::Window {
                starts: v.starts.clone(),
                sizes: v.sizes.clone(),
                squeezed: v.squeezed.clone(),
            });
        }
        std::borrow::Cow::Owned(p)
    }

    /// `RefBitcast` / `RefReshape`: the operand's path with one more step.
    pub(super) fn ref_transform(&mut self, op: &Op) -> Result<Value> {
        let base = self.view_ref(op.operands[0])?;
        let made = self.memo_view(op, (&base, &[]), || {
            let mut p = self.path_of_view(&base).into_owned();
            let ty = self.func.ty(op.results[0]);
            p.steps.push(match op.kind {
                OpKind::RefBitcast => ViewStep::Bitcast(ty.dtype()),
                _ => ViewStep::Reshape(ty.shape().into()),
            });
            Ok(RefView::through(base.r, p))
        })?;
        Ok(Value::View(made))
    }

    /// A window (already bounds-checked against the view's shape) of view `base` as a view.
    pub(super) fn view_window(
        &self,
        base: &RefView,
        starts: &[usize],
        (sizes, squeezed): (&[usize], &[bool]),
    ) -> RefView {
        let mut p = self.path_of_view(base).into_owned();
        p.steps.push(ViewStep::Window {
            starts: starts.into(),
            sizes: sizes.into(),
            squeezed: squeezed.into(),
        });
        RefView::through(base.r, p)
    }

    /// A value `Bitcast` whose operand dies here (see [`Plan`](super::super::plan::Plan)'s
    /// `bitcast_owned`): the operand is taken from the environment and its buffer reused when
    /// nothing else holds it ([`bitcast_consumed`]).
    pub(super) fn bitcast_consuming(&mut self, op: &Op) -> Result<Values> {
        let to = self.func.ty(op.results[0]).dtype();
        let t = match self.env.get_mut(op.operands[0].0 as usize) {
            Some(slot @ Some(Value::T(_))) => match slot.take() {
                Some(Value::T(t)) => t,
                _ => return Err(internal("bitcast operand")),
            },
            _ => return Err(internal("bitcast operand")),
        };
        Ok(smallvec::smallvec![Value::T(bitcast_consumed(t, to)?)])
    }

    /// A load of window `w` of view `v`: bounds-checked against the view, raced against the copies
    /// in flight over the box of the ref it reaches.
    pub(super) fn load_view(&self, op: &Op, w: &Window, v: &RefView) -> Result<Tensor> {
        let (p, starts) = self.view_access_start(op, w, v, false)?;
        self.read_view(v.r, &p, (&starts, &w.sizes, &w.squeezed), &w.strides)
    }

    /// A store into window `w` of view `v`.
    pub(super) fn store_view(
        &mut self,
        op: &Op,
        w: &Window,
        masked: bool,
        v: &RefView,
    ) -> Result<()> {
        let value = self.tensor(op.operands[1])?.clone();
        let mask = if masked {
            let m = op
                .operands
                .last()
                .ok_or_else(|| internal("masked store without a mask"))?;
            Some(self.tensor(*m)?.clone())
        } else {
            None
        };
        let (p, starts) = self.view_access_start(op, w, v, true)?;
        self.write_through_view(
            (v.r, &p),
            (&starts, &w.sizes, &w.squeezed),
            &w.strides,
            value,
            mask,
        )
    }

    /// What a view reads now.
    pub(super) fn view_contents(&self, v: &RefView) -> Result<Tensor> {
        let Some(p) = &v.via else {
            return Ok(self.contents(v.r)?.window(&v.starts, &v.sizes, &v.squeezed));
        };
        let (shape, _) = p.result();
        let rank = shape.len();
        let whole = (&vec![0; rank][..], &shape[..], &vec![false; rank][..]);
        self.read_view(v.r, p, whole, &vec![1; rank])
    }

    /// The window (`starts`, `sizes` `steps` apart, `squeezed` dropped) of view `p` of ref `r`: a
    /// re-indexing of the ref's contents where every step of the path is one for free (windows, and
    /// reshapes of contiguous stages), else read element run by element run ([`walk`](super::walk)).
    fn read_view(
        &self,
        r: usize,
        p: &ViewPath,
        window: (&[usize], &[usize], &[bool]),
        steps: &[usize],
    ) -> Result<Tensor> {
        let base = self.contents(r)?;
        if let Some(t) = forward_for_free(&base, p)? {
            let t = t.strided_window(window.0, (window.1, steps), window.2);
            // A lent buffer changes under a view of it: what was read is copied out now.
            return match base.buf {
                Buf::Shared(_) => t.materialize(),
                _ => Ok(t),
            };
        }
        let dtype = p.result().1;
        let kept = kept_sizes(window.1, window.2);
        let n = kept.iter().product();
        let segs = self
            .segments
            .window(p, (&base.strides, base.offset), window, steps)?;
        let data = walk::read(&base, &segs, dtype, n)?;
        Ok(Tensor::from_data(kept, data))
    }

    /// Write `value` into the window (`starts`, `sizes` `steps` apart, `squeezed` dropped) of view
    /// `p` of ref `r`, where `mask`: element run by element run into the ref's contents
    /// ([`walk`](super::walk)). (The path alone: the box of the ref it reaches is not needed.)
    pub(super) fn write_through_view(
        &mut self,
        (r, p): (usize, &ViewPath),
        window: (&[usize], &[usize], &[bool]),
        steps: &[usize],
        value: Tensor,
        mask: Option<Tensor>,
    ) -> Result<()> {
        // The contents are written as `owned_contents` gives them: row-major from offset 0.
        let strides = row_major_strides(&self.refs[r].shape);
        let dtype = p.result().1;
        let n: usize = kept_sizes(window.1, window.2).iter().product();
        if value.dtype != dtype || value.numel() != n {
            return Err(internal("stored value does not match the view's window"));
        }
        let segs = self.segments.window(p, (&strides, 0), window, steps)?;
        let mut base = self.owned_contents(r)?;
        let written = write_value(&mut base, &segs, &value, mask.as_ref());
        self.refs[r].content = Some(base);
        written
    }
}

/// Write `value` (the window's `value.numel()` elements) into `base` as `segs` place them, where
/// `mask`: 32-bit words whose halves go to two runs of 16-bit elements half by half
/// ([`walk::write_halves`]), anything else bit piece by bit piece ([`walk::write`]).
fn write_value(
    base: &mut Tensor,
    segs: &[walk::Segment],
    value: &Tensor,
    mask: Option<&Tensor>,
) -> Result<()> {
    let n = value.numel();
    if mask.is_none() && value.dtype == DType::U32 {
        let flat;
        let words = match value.is_contiguous() && value.offset == 0 {
            true => value,
            false => {
                flat = value.materialize()?;
                &flat
            }
        };
        let words = words
            .data::<u32>()?
            .get(..n)
            .ok_or_else(|| internal("stored value does not match the view's window"))?;
        if walk::write_halves(base, segs, words)? {
            return Ok(());
        }
    }
    let bits: Vec<u64> = with_dtype!(value.dtype, T => {
        value.to_vec::<T>()?.into_iter().map(|x| x.literal().bits).collect()
    });
    let keep: Option<Vec<u64>> = match mask {
        Some(m) => {
            let keep: Vec<u64> = m
                .to_vec::<bool>()?
                .into_iter()
                .map(|b| if b { u64::MAX } else { 0 })
                .collect();
            if keep.len() != n {
                return Err(internal("store mask does not match the view's window"));
            }
            Some(keep)
        }
        None => None,
    };
    walk::write(base, segs, (&bits, keep.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{f8e4m3fn, f8e5m2};
    use half::{bf16, f16};

    /// `n` random bit patterns (xorshift from `seed`).
    fn random_bits(n: usize, mut state: u64) -> Vec<u64> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            })
            .collect()
    }

    /// The byte copy of a same-width bitcast gives `repack`'s elements, bit for bit, for every pair
    /// of dtypes of one width (NaN payloads, subnormals and signed zeros among the random bits).
    #[test]
    fn same_width_bitcasts_copy_repacks_bits() {
        fn check<T: Element, U: Element>(bits: &[u64]) {
            let src: Vec<T> = bits.iter().map(|b| T::from_literal_bits(*b)).collect();
            let fast: Vec<U> = same_bits::<T, U>(&src);
            let slow: Vec<U> = repack::<T, U>(&src, &[src.len()]);
            let lit = |v: &[U]| v.iter().map(|x| x.literal().bits).collect::<Vec<_>>();
            assert_eq!(lit(&fast), lit(&slow), "{:?} -> {:?}", T::DTYPE, U::DTYPE);
        }
        let bits = random_bits(4099, 0x9e37_79b9_7f4a_7c15);
        let w32: Vec<u64> = bits.iter().map(|b| b & 0xffff_ffff).collect();
        let w16: Vec<u64> = bits.iter().map(|b| b & 0xffff).collect();
        let w8: Vec<u64> = bits.iter().map(|b| b & 0xff).collect();
        check::<u32, f32>(&w32);
        check::<f32, i32>(&w32);
        check::<i32, u32>(&w32);
        check::<bf16, f16>(&w16);
        check::<f16, bf16>(&w16);
        check::<u8, f8e4m3fn>(&w8);
        check::<f8e4m3fn, f8e5m2>(&w8);
        check::<f8e5m2, i8>(&w8);
        check::<i8, u8>(&w8);
    }

    /// Narrow rows packed into words by `pack_words` give `repack`'s bits, for 16- and 8-bit rows
    /// into every 32-bit type, with leading dimensions.
    #[test]
    fn packed_words_are_repacks_bits() {
        fn check<T: Element, U: Element>(bits: &[u64], shape: &[usize]) {
            let src: Vec<T> = bits.iter().map(|b| T::from_literal_bits(*b)).collect();
            let fast: Vec<U> = reuse::<u32, U>(pack_words(&src, shape));
            let slow: Vec<U> = repack::<T, U>(&src, shape);
            let lit = |v: &[U]| v.iter().map(|x| x.literal().bits).collect::<Vec<_>>();
            assert_eq!(lit(&fast), lit(&slow), "{:?} -> {:?}", T::DTYPE, U::DTYPE);
        }
        let bits = random_bits(3 * 8 * 40, 0x2545_f491_4f6c_dd1d);
        let w16: Vec<u64> = bits.iter().map(|b| b & 0xffff).collect();
        let w8: Vec<u64> = bits.iter().map(|b| b & 0xff).collect();
        check::<bf16, u32>(&w16, &[3, 8, 40]);
        check::<f16, f32>(&w16, &[24, 40]);
        check::<bf16, i32>(&w16, &[2, 12, 40]);
        check::<f8e4m3fn, u32>(&w8, &[3, 8, 40]);
        check::<i8, f32>(&w8, &[24, 40]);
        check::<f8e5m2, i32>(&w8, &[6, 4, 40]);
    }

    /// A consumed operand's buffer becomes the result when nothing else holds it (same pointer,
    /// same bits); a shared buffer, a window of a larger one or a width change is copied, the
    /// operand's holders untouched — every way giving `bitcast_rows`'s bits.
    #[test]
    fn a_consumed_bitcast_reuses_a_buffer_only_it_holds() {
        let bits: Vec<u32> = (0..24u32).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
        let t = Tensor::from_vec(vec![4, 6], bits.clone());
        let want = bitcast_rows(&t, DType::F32).expect("bitcast");
        let ptr = t.data::<u32>().expect("u32").as_ptr() as usize;
        let got = bitcast_consumed(t, DType::F32).expect("consumed");
        assert_eq!(
            got.data::<f32>().expect("f32").as_ptr() as usize,
            ptr,
            "reused"
        );
        let b = |t: &Tensor| {
            t.data::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(b(&got), b(&want));

        let shared = Tensor::from_vec(vec![4, 6], bits.clone());
        let holder = shared.clone();
        let got = bitcast_consumed(shared, DType::F32).expect("consumed");
        assert_eq!(b(&got), b(&want));
        assert_eq!(
            holder.data::<u32>().expect("u32"),
            &bits[..],
            "the holder keeps its data"
        );

        let mut window = Tensor::from_vec(vec![4, 6], bits.clone());
        window.shape = smallvec::smallvec![2, 6];
        window.offset = 12;
        let got = bitcast_consumed(window.clone(), DType::I32).expect("consumed");
        let want = bitcast_rows(&window, DType::I32).expect("bitcast");
        assert_eq!(got.data::<i32>().unwrap(), want.data::<i32>().unwrap());

        let narrow = Tensor::from_vec(vec![4, 6], bits);
        let got = bitcast_consumed(narrow.clone(), DType::BF16).expect("consumed");
        let want = bitcast_rows(&narrow, DType::BF16).expect("bitcast");
        assert_eq!(got.shape, want.shape);
        assert_eq!(
            got.data::<half::bf16>().unwrap(),
            want.data::<half::bf16>().unwrap()
        );
    }

    /// A strided (non-contiguous) operand takes the element-by-element path and gives its bits.
    #[test]
    fn a_strided_operand_is_bitcast_element_by_element() {
        let t = Tensor::from_vec(vec![4, 3], (0..12u32).map(|i| i * 0x0101_0101).collect());
        let mut col = t.clone();
        col.shape = smallvec::smallvec![4, 1];
        col.strides = smallvec::smallvec![3, 1];
        col.offset = 1;
        let out = bitcast_rows(&col, DType::F32).expect("bitcast");
        let got: Vec<u32> = out.data::<f32>().expect("f32")[..4]
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(got, [1u32, 4, 7, 10].map(|i| i * 0x0101_0101));
    }
}

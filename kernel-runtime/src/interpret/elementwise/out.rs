//! Where an elementwise loop writes: a fresh buffer, or an output block offered by the executor.

use super::super::tensor::{take_vec, Dims, Tensor};
use crate::dtype::DType;
use crate::semantics::host::HostElement;

/// Where an elementwise result may be written directly: an output block inside the output array
/// (so the store that follows needs no block buffer and write-back needs no copy).
#[derive(Clone, Debug)]
pub(crate) struct RawDest {
    pub ptr: *mut u8,
    /// Elements the pointer may address.
    pub len: usize,
    pub off: usize,
    pub strides: Dims,
    pub shape: Dims,
    pub dtype: DType,
}

/// Where an elementwise rule writes its result: a fresh tensor ([`Sink::fresh`]), or an offered
/// [`RawDest`] when the result has the destination's dtype and shape ([`Sink::offer`]). The executor
/// passes it down explicitly; [`Sink::filled`] then tells whether the result went there.
pub(crate) struct Sink<'a> {
    offer: Option<&'a RawDest>,
    filled: std::cell::Cell<bool>,
}

impl<'a> Sink<'a> {
    /// Results go to fresh tensors.
    pub(crate) fn fresh() -> Sink<'static> {
        Sink {
            offer: None,
            filled: std::cell::Cell::new(false),
        }
    }

    /// Offer `dest` to the rule that runs with this sink.
    ///
    /// # Safety
    /// `dest` must address `len` elements of `dtype` that nothing else reads or writes while the sink
    /// lives.
    pub(crate) unsafe fn offer(dest: &'a RawDest) -> Sink<'a> {
        Sink {
            offer: Some(dest),
            filled: std::cell::Cell::new(false),
        }
    }

    /// Whether a destination is offered (a result that is not to go there may be a broadcast view).
    pub(super) fn offered(&self) -> bool {
        self.offer.is_some()
    }

    /// Whether the result was written to the offered destination (the rule's tensor is then a
    /// placeholder).
    pub(crate) fn filled(&self) -> bool {
        self.filled.get()
    }

    /// The offered destination, once, if it fits a result of `dtype` and `shape`.
    fn take(&self, dtype: DType, shape: &[usize]) -> Option<&'a RawDest> {
        let d = self
            .offer
            .filter(|d| d.dtype == dtype && d.shape[..] == shape[..])?;
        (!self.filled.replace(true)).then_some(d)
    }
}

/// The output of one elementwise loop: a fresh buffer, or an offered [`RawDest`] of the right type.
pub(super) struct Out<R> {
    vec: Option<Vec<R>>,
    ptr: *mut R,
    len: usize,
    pub(super) off: usize,
    pub(super) strides: Dims,
}

impl<R: HostElement> Out<R> {
    pub(super) fn new(shape: &[usize], sink: &Sink<'_>) -> Out<R> {
        if let Some(d) = sink.take(R::DTYPE, shape) {
            return Out {
                vec: None,
                ptr: d.ptr as *mut R,
                len: d.len,
                off: d.off,
                strides: d.strides.clone(),
            };
        }
        let n = shape.iter().product();
        let mut v = take_vec::<R>(n);
        let ptr = v.as_mut_ptr();
        Out {
            vec: Some(v),
            ptr,
            len: n,
            off: 0,
            strides: super::super::tensor::row_major_strides(shape),
        }
    }
    /// Whether every row of `len` elements at `inner` stride stays inside the destination.
    pub(super) fn fits(&self, shape: &[usize]) -> bool {
        let reach: usize = shape
            .iter()
            .zip(&self.strides)
            .map(|(n, s)| n.saturating_sub(1) * s)
            .sum();
        shape.contains(&0) || self.off + reach < self.len
    }
    /// The destination row at `o` as a slice (inner stride 1).
    ///
    /// # Safety
    /// `o + len` must be within the destination (guaranteed by `fits`) and rows must not overlap.
    #[inline(always)]
    pub(super) unsafe fn row(&mut self, o: usize, len: usize) -> &mut [std::mem::MaybeUninit<R>] {
        // SAFETY: forwarded to the caller.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(o) as *mut std::mem::MaybeUninit<R>, len)
        }
    }
    #[inline(always)]
    pub(super) unsafe fn put(&mut self, o: usize, v: R) {
        // SAFETY: forwarded to the caller.
        unsafe { self.ptr.add(o).write(v) }
    }
    pub(super) fn finish(self, shape: &[usize]) -> Tensor {
        match self.vec {
            Some(mut v) => {
                // SAFETY: every element of the row-major result was written by the caller's rows.
                unsafe { v.set_len(shape.iter().product()) };
                Tensor::from_vec(shape, v)
            }
            None => Tensor::splat(crate::dtype::Literal::zero(R::DTYPE), &[]),
        }
    }
}

/// The shape an elementwise op needs to compute over when every operand is broadcast along some
/// dimension (stride 0 over more than one element) and the result goes to a fresh buffer: that
/// shape with those dimensions cut to one element. The result computed there is then broadcast back
/// along them ([`widened`]) — each element of the full result is the op on the same operand elements,
/// so the bits are the same. An iota plus a scalar, or such a value compared with a scalar (a key
/// position mask), costs one row of the block, not the block.
pub(super) fn shared_broadcast(
    shape: &[usize],
    strides: &[&[usize]],
    sink: &Sink<'_>,
) -> Option<Dims> {
    if sink.offered() {
        return None;
    }
    let mut narrow: Option<Dims> = None;
    for d in 0..shape.len() {
        if shape[d] > 1 && strides.iter().all(|s| s[d] == 0) {
            narrow.get_or_insert_with(|| Dims::from_slice(shape))[d] = 1;
        }
    }
    narrow
}

/// `t` cut to `shape` (a [`shared_broadcast`] shape: the same element at every index it drops).
pub(super) fn narrowed(t: &Tensor, shape: &Dims) -> Tensor {
    Tensor {
        shape: shape.clone(),
        ..t.clone()
    }
}

/// A result computed over a [`shared_broadcast`] shape, broadcast back to `shape`.
pub(super) fn widened(mut t: Tensor, shape: &[usize]) -> Tensor {
    for (d, &n) in shape.iter().enumerate() {
        if t.shape[d] != n {
            t.strides[d] = 0;
        }
    }
    t.shape = Dims::from_slice(shape);
    t
}

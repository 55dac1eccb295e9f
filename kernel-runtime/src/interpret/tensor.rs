//! The interpreter's value: a strided view of a shared typed buffer. Broadcasts, splat constants, iota,
//! transposes, windows of refs and input blocks are all views (no copy); ops write fresh contiguous
//! buffers. Scalars are rank-0 tensors, so one code path serves both.

use crate::dtype::{DType, Element, Literal};
use crate::error::{kerr, Result};
use crate::semantics::host::{HostData, HostElement};
use half::bf16;
use std::sync::Arc;

/// Shapes and strides: inline up to rank 4, so cloning a view allocates nothing.
pub(crate) type Dims = smallvec::SmallVec<[usize; 4]>;

mod buf;
pub(crate) use buf::{Buf, Foreign, One, Shared};

#[derive(Debug)]
pub(crate) struct Tensor {
    pub dtype: DType,
    pub shape: Dims,
    /// Element strides; 0 along broadcast dimensions.
    pub strides: Dims,
    pub offset: usize,
    pub buf: Buf,
}

/// A view of the same buffer, its shape and strides copied (smallvec's own `clone` collects them
/// element by element; a tensor is cloned for every value a loop or a split loop's machines take).
impl Clone for Tensor {
    fn clone(&self) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: Dims::from_slice(&self.shape),
            strides: Dims::from_slice(&self.strides),
            offset: self.offset,
            buf: self.buf.clone(),
        }
    }
}

pub(crate) fn row_major_strides(shape: &[usize]) -> Dims {
    let mut s: Dims = smallvec::smallvec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

pub(crate) fn internal(what: &str) -> crate::error::KernelError {
    kerr!(
        Unsupported,
        "internal interpreter error: {what} (please report with the kernel IR)"
    )
}

impl Tensor {
    pub fn from_data(shape: impl AsRef<[usize]>, data: HostData) -> Tensor {
        let shape = Dims::from_slice(shape.as_ref());
        let strides = row_major_strides(&shape);
        Tensor {
            dtype: data.dtype(),
            shape,
            strides,
            offset: 0,
            buf: Buf::host(data),
        }
    }
    pub fn from_vec<T: HostElement>(shape: impl AsRef<[usize]>, v: Vec<T>) -> Tensor {
        Self::from_data(shape, T::wrap(v))
    }
    /// `value` broadcast to `shape` (one element, zero strides).
    pub fn splat(lit: Literal, shape: &[usize]) -> Tensor {
        Tensor {
            dtype: lit.dtype,
            shape: Dims::from_slice(shape),
            strides: smallvec::smallvec![0; shape.len()],
            offset: 0,
            buf: Buf::One(One::of_literal(lit)),
        }
    }
    /// A rank-0 tensor holding `v`.
    pub fn scalar<T: HostElement>(v: T) -> Tensor {
        Tensor {
            dtype: T::DTYPE,
            shape: Dims::new(),
            strides: Dims::new(),
            offset: 0,
            buf: Buf::One(One::new(v)),
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The whole underlying buffer as `T` (views index into it with `offset` and `strides`).
    pub fn data<T: HostElement>(&self) -> Result<&[T]> {
        self.buf
            .slice::<T>()
            .ok_or_else(|| internal("tensor element type mismatch"))
    }
    /// Row-major contiguous from `offset` (dims of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1;
        for d in (0..self.shape.len()).rev() {
            if self.shape[d] != 1 && self.strides[d] != expect {
                return false;
            }
            expect *= self.shape[d];
        }
        true
    }
    /// Numpy-style broadcast view to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let (r, n) = (self.shape.len(), shape.len());
        if r > n {
            return Err(internal("broadcast to a lower rank"));
        }
        let mut strides: Dims = smallvec::smallvec![0; n];
        for i in 0..n {
            if i + r < n {
                continue;
            }
            let j = i + r - n;
            strides[i] = if self.shape[j] == shape[i] {
                self.strides[j]
            } else if self.shape[j] == 1 {
                0
            } else {
                return Err(internal("broadcast of incompatible shapes"));
            };
        }
        Ok(Tensor {
            dtype: self.dtype,
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
            buf: self.buf.clone(),
        })
    }
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        if perm.len() != self.shape.len() || perm.iter().any(|&p| p >= self.shape.len()) {
            return Err(internal("bad permutation"));
        }
        Ok(Tensor {
            dtype: self.dtype,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            buf: self.buf.clone(),
        })
    }
    /// A window view: `starts`/`sizes` per dim (already bounds-checked), squeezed dims dropped.
    /// The window at `starts` of `sizes` elements `steps` apart (`squeezed` dimensions dropped).
    pub fn strided_window(
        &self,
        starts: &[usize],
        (sizes, steps): (&[usize], &[usize]),
        squeezed: &[bool],
    ) -> Tensor {
        let mut t = self.window(starts, sizes, squeezed);
        let kept = steps.iter().zip(squeezed).filter(|(_, s)| !**s);
        for (stride, (k, _)) in t.strides.iter_mut().zip(kept) {
            *stride *= k;
        }
        t
    }
    pub fn window(&self, starts: &[usize], sizes: &[usize], squeezed: &[bool]) -> Tensor {
        let mut offset = self.offset;
        let (mut shape, mut strides) = (Dims::new(), Dims::new());
        for d in 0..self.shape.len() {
            offset += starts[d] * self.strides[d];
            if !squeezed[d] {
                shape.push(sizes[d]);
                strides.push(self.strides[d]);
            }
        }
        Tensor {
            dtype: self.dtype,
            shape,
            strides,
            offset,
            buf: self.buf.clone(),
        }
    }
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(internal("reshape changes the element count"));
        }
        let base = if self.is_contiguous() {
            self.clone()
        } else {
            self.materialize()?
        };
        Ok(Tensor {
            dtype: base.dtype,
            shape: Dims::from_slice(shape),
            strides: row_major_strides(shape),
            offset: base.offset,
            buf: base.buf,
        })
    }
    /// The elements in row-major order.
    pub fn to_vec<T: HostElement>(&self) -> Result<Vec<T>> {
        let data = self.data::<T>()?;
        let mut out = take_vec(self.numel());
        for_each_row(
            &self.shape,
            [&self.strides],
            [self.offset],
            |[o], len, [s]| match s {
                1 => out.extend_from_slice(&data[o..o + len]),
                0 => out.extend(std::iter::repeat_n(data[o], len)),
                s => out.extend((0..len).map(|i| data[o + i * s])),
            },
        );
        Ok(out)
    }
    /// A contiguous copy.
    pub fn materialize(&self) -> Result<Tensor> {
        let data = super::elementwise::with_dtype!(self.dtype, T => T::wrap(self.to_vec::<T>()?));
        Ok(Tensor::from_data(self.shape.clone(), data))
    }
    /// The first element as a literal (scalars, conditions, loop bounds).
    pub fn literal(&self) -> Result<Literal> {
        self.literal_at_offset(self.offset)
    }
    /// The element at `index` (one per dimension; checked against the shape).
    pub fn literal_at(&self, index: &[usize]) -> Result<Literal> {
        if index.len() != self.shape.len() || index.iter().zip(&self.shape).any(|(i, n)| i >= n) {
            return Err(internal("element index outside the tensor"));
        }
        let at = index
            .iter()
            .zip(&self.strides)
            .map(|(i, s)| i * s)
            .sum::<usize>();
        self.literal_at_offset(self.offset + at)
    }
    fn literal_at_offset(&self, o: usize) -> Result<Literal> {
        let b = &self.buf;
        let bits = super::elementwise::with_dtype!(self.dtype, T => {
            b.slice::<T>().and_then(|v| v.get(o)).map(|x| x.literal().bits)
        });
        Ok(Literal {
            dtype: self.dtype,
            bits: bits.ok_or_else(|| internal("empty scalar"))?,
        })
    }
    pub fn scalar_i64(&self) -> Result<i64> {
        Ok(self.literal()?.as_i64())
    }
    pub fn scalar_bool(&self) -> Result<bool> {
        Ok(self.literal()?.bits != 0)
    }
}

/// The innermost rows of `shape`, for `N` operands walking the same index space with their own strides:
/// yields each row's start offsets; every row has `inner` elements at `inner_strides`. Dimensions that
/// are contiguous for every operand are merged first, so a contiguous block is one long row and a
/// row-broadcast is rows with an inner stride of 0: the loops over a row are then plain slice loops that
/// vectorize. (An iterator rather than a callback so those loops stay inside the caller, which may be
/// compiled with AVX2.)
pub(crate) struct Rows<const N: usize> {
    outer: smallvec::SmallVec<[(usize, [usize; N]); 4]>,
    idx: Dims,
    off: [usize; N],
    done: bool,
    pub inner: usize,
    pub inner_strides: [usize; N],
}

impl<const N: usize> Rows<N> {
    pub fn new(shape: &[usize], strides: [&[usize]; N], offsets: [usize; N]) -> Self {
        // Drop size-1 dims, then merge mergeable neighbours (innermost first).
        let mut merged: smallvec::SmallVec<[(usize, [usize; N]); 4]> = smallvec::SmallVec::new();
        let empty = shape.contains(&0);
        for d in (0..shape.len()).rev() {
            if shape[d] == 1 {
                continue;
            }
            let s: [usize; N] = std::array::from_fn(|k| strides[k][d]);
            if let Some((mn, ms)) = merged.last_mut() {
                if (0..N).all(|k| s[k] == ms[k] * *mn) {
                    *mn *= shape[d];
                    continue;
                }
            }
            merged.push((shape[d], s));
        }
        merged.reverse();
        let (inner, inner_strides) = merged.pop().unwrap_or((1, [0; N]));
        let idx = smallvec::smallvec![0; merged.len()];
        Rows {
            outer: merged,
            idx,
            off: offsets,
            done: empty,
            inner,
            inner_strides,
        }
    }
}

impl<const N: usize> Iterator for Rows<N> {
    type Item = [usize; N];
    #[inline(always)]
    fn next(&mut self) -> Option<[usize; N]> {
        if self.done {
            return None;
        }
        let cur = self.off;
        // Odometer over the outer dims.
        let mut d = self.outer.len();
        loop {
            if d == 0 {
                self.done = true;
                break;
            }
            d -= 1;
            let (n, s) = self.outer[d];
            self.idx[d] += 1;
            if self.idx[d] < n {
                for (o, s) in self.off.iter_mut().zip(s) {
                    *o += s;
                }
                break;
            }
            for (o, s) in self.off.iter_mut().zip(s) {
                *o -= s * (n - 1);
            }
            self.idx[d] = 0;
        }
        Some(cur)
    }
}

/// Call `f(offsets, inner_len, inner_strides)` once per row of [`Rows`] (for code off the hot path).
#[inline(always)]
pub(crate) fn for_each_row<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    offsets: [usize; N],
    mut f: impl FnMut([usize; N], usize, [usize; N]),
) {
    let rows = Rows::new(shape, strides, offsets);
    let (inner, strides) = (rows.inner, rows.inner_strides);
    for off in rows {
        f(off, inner, strides);
    }
}

/// bf16 ↔ f32 as bit operations (round to nearest even, NaN kept quiet: the vector math's rounding,
/// which Mosaic on CPU calls too), written so loops vectorize.
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> bf16 {
    bf16::from_bits(crate::math::bf16_bits(x))
}

#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    crate::math::f32_of_bf16_bits(x.to_bits())
}

// ---------------------------------------------------------------------------------------------- buffer pool

/// Buffers of dead values are kept per thread and reused for new results: without this, each block-sized
/// temporary is a fresh `mmap` whose pages fault in on first touch (measured: half the time of a 1024²
/// add). Small buffers are left to malloc; the pool is bounded.
mod pool {
    use crate::semantics::host::{HostData, HostElement};
    use std::cell::RefCell;

    const MIN_ELEMS: usize = 4096;
    const MAX_BUFFERS: usize = 24;
    const MAX_BYTES: usize = 96 << 20;

    thread_local! {
        static POOL: RefCell<Vec<HostData>> = const { RefCell::new(Vec::new()) };
    }

    fn bytes(d: &HostData) -> usize {
        d.capacity() * d.dtype().size_bytes()
    }

    /// An empty `Vec<T>` with room for `n` elements, reused when possible.
    pub(crate) fn take<T: HostElement>(n: usize) -> Vec<T> {
        if n >= MIN_ELEMS {
            let found = POOL.with(|p| {
                let mut p = p.borrow_mut();
                let i = p.iter().position(|d| {
                    d.dtype() == T::DTYPE && d.capacity() >= n && d.capacity() <= 4 * n
                })?;
                T::into_vec(p.swap_remove(i))
            });
            if let Some(mut v) = found {
                v.clear();
                return v;
            }
        }
        Vec::with_capacity(n)
    }

    /// Keep a dead buffer for reuse.
    pub(crate) fn give(d: HostData) {
        if d.capacity() < MIN_ELEMS {
            return;
        }
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            let held: usize = p.iter().map(bytes).sum();
            if p.len() < MAX_BUFFERS && held + bytes(&d) <= MAX_BYTES {
                p.push(d);
            }
        });
    }
}

pub(crate) use pool::take as take_vec;

/// `n` elements of `lit`, in a pooled buffer (scratch refs start so on every call: a fresh allocation
/// of a block-sized scratch faults its pages in each time).
pub(crate) fn filled(lit: Literal, n: usize) -> HostData {
    super::elementwise::with_dtype!(lit.dtype, T => {
        let mut v = pool::take::<T>(n);
        v.resize(n, T::from_literal_bits(lit.bits));
        T::wrap(v)
    })
}

/// Return a tensor's buffer to the pool if nothing else holds it.
pub(crate) fn recycle(t: Tensor) {
    recycle_buf(t.buf);
}

/// [`recycle`] of a tensor left in its place (a dead value's slot), its buffer replaced by an empty
/// one: the tensor itself is not moved (moving a dead value out of its slot and into [`recycle`]
/// cost two `memcpy` calls of its 144–168 bytes, 3% of a decode launch's samples, when a `Value`
/// was that large).
pub(crate) fn recycle_in(t: &mut Tensor) {
    recycle_buf(std::mem::replace(&mut t.buf, Buf::One(One::new(0i32))));
}

fn recycle_buf(buf: Buf) {
    if let Buf::Host(a) = buf {
        if let Ok(d) = Arc::try_unwrap(a) {
            pool::give(d);
        }
    }
}

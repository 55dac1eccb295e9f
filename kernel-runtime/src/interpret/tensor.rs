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

/// A tensor's storage: an interpreter-owned buffer (shared between views), or a caller's array
/// borrowed for the length of one run (`interpret_into`: XLA's input buffers, read in place).
#[derive(Clone, Debug)]
pub(crate) enum Buf {
    Host(Arc<HostData>),
    Foreign(Foreign),
    /// A single element held inline: scalars and splat constants, which a kernel's index arithmetic,
    /// loop counters and semaphore bookkeeping make by the thousand (no allocation, no reference count).
    One(One),
    /// A ref's buffer written in place by the iterations of a loop run across threads
    /// (`machine/split.rs`), each through its own machine, each touching only its own part of it.
    Shared(Shared),
}

/// A ref's interpreter-owned buffer, lent to the iterations of a split loop: `len` elements of
/// `dtype` at `ptr`. Reads of it are copied out at once (a loaded value must not change when the
/// buffer is written later); writes go straight into it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shared {
    pub dtype: DType,
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a shared buffer is lent only while its owner (the machine that runs the split loop) waits
// for the loop's iterations and touches nothing of it; each iteration reads and writes only the
// elements at its own index along one dimension (`plan/split.rs` proves it of the loop body), so no
// two threads touch one element, and no handle outlives the loop (the iterations' machines are
// dropped before the owner goes on: `workers::run`).
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

impl Shared {
    /// The buffer's elements, to write into.
    ///
    /// # Safety
    /// No other thread may touch the elements written (the split loop's disjointness) while the slice
    /// lives, which must not outlive the lent buffer; `T` must be its element type (checked).
    pub unsafe fn slice_mut<'a, T: HostElement>(self) -> Option<&'a mut [T]> {
        holds::<T>(self.dtype, self.ptr.cast_const())
            // SAFETY: `len` initialized, aligned elements of `T` (the lent buffer's); the caller
            // writes only elements no other thread touches.
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) })
    }
}

/// Whether `len` elements of `dtype` at `ptr` can be read as `T`: the same element type, aligned.
fn holds<T: HostElement>(dtype: DType, ptr: *const u8) -> bool {
    dtype == T::DTYPE && (ptr as usize).is_multiple_of(std::mem::align_of::<T>())
}

/// The `len` elements of `dtype` at `ptr` as a slice of `T`, when [`holds`].
///
/// # Safety
/// `ptr` must address `len` initialized elements of `dtype` that no thread writes while the slice
/// lives (or, for a lent buffer, none of the elements this thread reads).
unsafe fn typed_slice<'a, T: HostElement>(
    dtype: DType,
    ptr: *const u8,
    len: usize,
) -> Option<&'a [T]> {
    // SAFETY: the caller's contract; the type and alignment are checked.
    holds::<T>(dtype, ptr).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len) })
}

/// One element of any dtype, stored in place (every element type is at most 4 bytes, aligned to at
/// most 4).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(4))]
pub(crate) struct One {
    bytes: [u8; 4],
    dtype: DType,
}

impl One {
    pub fn new<T: HostElement>(v: T) -> One {
        const {
            assert!(std::mem::size_of::<T>() <= 4 && std::mem::align_of::<T>() <= 4);
        }
        let mut one = One {
            bytes: [0; 4],
            dtype: T::DTYPE,
        };
        // SAFETY: `bytes` is the first field of a 4-aligned `repr(C)` struct, so 4-aligned, and holds
        // at least `size_of::<T>()` bytes (asserted above).
        unsafe { one.bytes.as_mut_ptr().cast::<T>().write(v) };
        one
    }
    fn of_literal(lit: Literal) -> One {
        // A literal's bits, as `HostData::filled` reads them.
        super::elementwise::with_dtype!(lit.dtype, T => One::new(T::from_literal_bits(lit.bits)))
    }
    /// The element as a one-element slice of `T`, when `T` is its type.
    pub fn slice<T: HostElement>(&self) -> Option<&[T]> {
        // SAFETY: `One::new::<U>` wrote a valid `U` at the start of `bytes` (aligned, see `new`), and
        // `U::DTYPE == T::DTYPE` means `U` is `T` (each dtype has one host element type).
        (self.dtype == T::DTYPE)
            .then(|| unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<T>(), 1) })
    }
    fn to_data(self) -> HostData {
        super::elementwise::with_dtype!(self.dtype, T => match self.slice::<T>() {
            Some(v) => T::wrap(v.to_vec()),
            None => unreachable!("the element's own type"),
        })
    }
}

/// A caller's read-only array: `len` elements of `dtype` at `ptr`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Foreign {
    pub dtype: DType,
    pub ptr: *const u8,
    pub len: usize,
}

// SAFETY: a foreign array is read-only and outlives the run that borrows it (the contract of
// `ArrayView::from_raw`); no tensor outlives its run (the machines and their caches are per run, and
// the per-thread pool only keeps interpreter-owned buffers). The one write into memory a foreign
// array may share — a whole output aliased to its own input's buffer — comes after the grid, when no
// tensor reads it any more (`grid.rs`'s `start_aliased_outputs`).
unsafe impl Send for Foreign {}
// SAFETY: as for `Send`: shared reads of an array nobody writes during the run.
unsafe impl Sync for Foreign {}

impl Buf {
    pub fn host(d: HostData) -> Buf {
        Buf::Host(Arc::new(d))
    }
    pub fn slice<T: HostElement>(&self) -> Option<&[T]> {
        match self {
            Buf::Host(d) => T::slice(d),
            // SAFETY: `len` initialized elements of the array's dtype that nobody writes during the run.
            Buf::Foreign(f) => unsafe { typed_slice(f.dtype, f.ptr, f.len) },
            // SAFETY: `len` initialized elements of the lent buffer's dtype; the elements a thread
            // reads are ones no other thread writes (see `Shared`).
            Buf::Shared(s) => unsafe { typed_slice(s.dtype, s.ptr.cast_const(), s.len) },
            Buf::One(o) => o.slice(),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Buf::Host(d) => d.len(),
            Buf::Foreign(f) => f.len,
            Buf::Shared(s) => s.len,
            Buf::One(_) => 1,
        }
    }
    /// The same storage (views of one buffer).
    pub fn same(a: &Buf, b: &Buf) -> bool {
        match (a, b) {
            (Buf::Host(x), Buf::Host(y)) => Arc::ptr_eq(x, y),
            (Buf::Foreign(x), Buf::Foreign(y)) => x.ptr == y.ptr && x.len == y.len,
            (Buf::Shared(x), Buf::Shared(y)) => x.ptr == y.ptr && x.len == y.len,
            _ => false,
        }
    }
    /// The owned data if this is the only handle to it (for reuse), else the buffer back.
    pub fn try_unwrap(self) -> std::result::Result<HostData, Buf> {
        match self {
            Buf::Host(a) => Arc::try_unwrap(a).map_err(Buf::Host),
            Buf::One(o) => Ok(o.to_data()),
            f => Err(f),
        }
    }
    /// Owned, uniquely held data to write into (copying a shared or foreign buffer first).
    pub fn make_mut(&mut self, dtype: DType) -> Result<&mut HostData> {
        if let Buf::Foreign(f) = *self {
            let data = super::elementwise::with_dtype!(dtype, T => {
                let s = self.slice::<T>().ok_or_else(|| internal("foreign buffer type"))?;
                let _ = f;
                // A pooled buffer: a paged kernel's cache is copied here on every call, and a fresh
                // allocation of its size faults its pages in each time.
                let mut v = pool::take::<T>(s.len());
                v.extend_from_slice(s);
                T::wrap(v)
            });
            *self = Buf::host(data);
        }
        if let Buf::One(o) = *self {
            *self = Buf::host(o.to_data());
        }
        match self {
            Buf::Host(a) => Ok(Arc::make_mut(a)),
            Buf::Shared(_) => Err(internal("a lent buffer is written in place, not copied")),
            Buf::Foreign(_) | Buf::One(_) => Err(internal("foreign buffer")),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Tensor {
    pub dtype: DType,
    pub shape: Dims,
    /// Element strides; 0 along broadcast dimensions.
    pub strides: Dims,
    pub offset: usize,
    pub buf: Buf,
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
        let o = self.offset;
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
    if let Buf::Host(a) = t.buf {
        if let Ok(d) = Arc::try_unwrap(a) {
            pool::give(d);
        }
    }
}

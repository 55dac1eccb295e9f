//! A tensor's storage ([`Buf`]): an interpreter-owned buffer, a caller's array borrowed for one run,
//! one inline element, or a buffer lent to be written in place.

use super::{internal, pool};
use crate::dtype::DType;
use crate::dtype::{Element, Literal};
use crate::error::Result;
use crate::semantics::host::{HostData, HostElement};
use std::sync::Arc;

/// A tensor's storage: an interpreter-owned buffer (shared between views), or a caller's array
/// borrowed for the length of one run (`interpret_into`: XLA's input buffers, read in place).
#[derive(Clone, Debug)]
pub(crate) enum Buf {
    Host(Arc<HostData>),
    Foreign(Foreign),
    /// A single element held inline: scalars and splat constants, which a kernel's index arithmetic,
    /// loop counters and semaphore bookkeeping make by the thousand (no allocation, no reference count).
    One(One),
    /// A buffer written in place, not owned by the contents that hold it: a ref's buffer lent to
    /// the iterations of a loop run across threads (`machine/split.rs`), each through its own
    /// machine, each touching only its own part of it; or a whole output's own array, which the
    /// kernel updates in place (`Runner::lend_sink`).
    Shared(Shared),
}

/// A buffer written in place by the contents that hold it, which do not own it: `len` elements of
/// `dtype` at `ptr`. Reads of it are copied out at once (a loaded value must not change when the
/// buffer is written later); writes go straight into it. Two kinds are lent:
/// - a ref's interpreter-owned buffer, to the iterations of a split loop;
/// - a whole output's array, to the one chunk that runs a kernel with whole outputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shared {
    pub dtype: DType,
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a split loop's buffer is lent only while its owner (the machine that runs the loop) waits
// for the loop's iterations and touches nothing of it; each iteration reads and writes only the
// elements at its own index along one dimension (`plan/split.rs` proves it of the loop body), so no
// two threads touch one element, and no handle outlives the loop (the iterations' machines are
// dropped before the owner goes on: `workers::run`). A whole output's array is lent to the one
// chunk a kernel with whole outputs runs as (`parallel_axes`); that chunk's machine writes it, and
// the split loops it forks never write it (their written refs are the loop's own, lent anew), so
// one thread writes it at a time and the run ends before the caller gets the array back.
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
    pub(super) fn of_literal(lit: Literal) -> One {
        // A literal's bits, as `HostData::filled` reads them.
        crate::interpret::elementwise::with_dtype!(lit.dtype, T => One::new(T::from_literal_bits(lit.bits)))
    }
    /// The element as a one-element slice of `T`, when `T` is its type.
    pub fn slice<T: HostElement>(&self) -> Option<&[T]> {
        // SAFETY: `One::new::<U>` wrote a valid `U` at the start of `bytes` (aligned, see `new`), and
        // `U::DTYPE == T::DTYPE` means `U` is `T` (each dtype has one host element type).
        (self.dtype == T::DTYPE)
            .then(|| unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<T>(), 1) })
    }
    fn to_data(self) -> HostData {
        crate::interpret::elementwise::with_dtype!(self.dtype, T => match self.slice::<T>() {
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
// tensor reads it any more (`grid.rs`'s `start_aliased_outputs`), or, when the kernel never reads that
// input, during the run through the output's lent array (`Runner::lend_sink`), while no tensor of the
// input is read.
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
    /// The elements to write into: an owned buffer's ([`Buf::make_mut`]), or a lent one's in place.
    pub fn elems_mut<T: HostElement>(&mut self) -> Result<&mut [T]> {
        if let Buf::Shared(lent) = *self {
            // SAFETY: a lent buffer's writer is the only thread touching the elements it writes
            // (see `Shared`), and the slice lives no longer than this borrow of the contents.
            return unsafe { lent.slice_mut::<T>() }.ok_or_else(|| internal("ref buffer type"));
        }
        let data = self.make_mut(T::DTYPE)?;
        T::vec_mut(data)
            .map(|v| &mut v[..])
            .ok_or_else(|| internal("ref buffer type"))
    }
    /// Owned, uniquely held data to write into (copying a shared or foreign buffer first).
    pub fn make_mut(&mut self, dtype: DType) -> Result<&mut HostData> {
        if let Buf::Foreign(f) = *self {
            let data = crate::interpret::elementwise::with_dtype!(dtype, T => {
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

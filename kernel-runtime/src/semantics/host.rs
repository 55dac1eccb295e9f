//! Host arrays: what the interpreter takes and returns (a whole array's shape plus typed data; bf16 via
//! the `half` crate). The data sits behind an `Arc` so input blocks are zero-copy views of the caller's
//! arrays.

use crate::dtype::{f8e4m3fn, f8e5m2, i4, DType, Element, Literal};
use crate::error::{kerr, Result};
use half::bf16;
use std::sync::Arc;

macro_rules! host_data {
    ($( ($V:ident, $name:literal, $rust:ty, $($rest:tt)*) )*) => {
        /// Typed element storage, one variant per kernel element type (one row of the dtype table,
        /// `crate::dtype::for_each_dtype!`, each).
        #[derive(Clone, Debug)]
        pub enum HostData { $( $V(Vec<$rust>), )* }

        /// Equality compares bits: a float NaN equals a NaN with the same payload, `-0.0` differs
        /// from `0.0` — what "the same result" means for the engines' fast paths, which must give the
        /// plain path's bits. (Compare values with a tolerance, or by IEEE `==` on the elements, where
        /// that is what is meant.)
        impl PartialEq for HostData {
            fn eq(&self, other: &Self) -> bool {
                match (self, other) {
                    $( (HostData::$V(a), HostData::$V(b)) => same_bits(a, b), )*
                    _ => false,
                }
            }
        }

        impl HostData {
            pub fn dtype(&self) -> DType {
                match self { $( HostData::$V(_) => DType::$V, )* }
            }
            pub fn len(&self) -> usize {
                match self { $( HostData::$V(v) => v.len(), )* }
            }
            pub(crate) fn capacity(&self) -> usize {
                match self { $( HostData::$V(v) => v.capacity(), )* }
            }
            /// `n` copies of a literal (converted to this dtype's bit pattern).
            pub fn filled(lit: Literal, n: usize) -> HostData {
                match lit.dtype { $( DType::$V => HostData::$V(vec![<$rust>::from_literal_bits(lit.bits); n]), )* }
            }
            /// Room for `n` elements, none initialized yet (see [`HostData::assume_init`]); an error,
            /// not an abort, when the allocator refuses.
            pub(crate) fn try_uninit(
                dtype: DType,
                n: usize,
            ) -> std::result::Result<HostData, std::collections::TryReserveError> {
                Ok(match dtype { $( DType::$V => HostData::$V(room(n)?), )* })
            }
            /// Set the length to `n`.
            ///
            /// # Safety
            /// The first `n` elements (within the capacity) must have been written.
            pub(crate) unsafe fn assume_init(&mut self, n: usize) {
                // SAFETY: forwarded to the caller.
                unsafe { match self { $( HostData::$V(v) => v.set_len(n), )* } }
            }
            /// The whole capacity as an output view of `shape`, to be written before
            /// [`HostData::assume_init`]; `None` when `shape` has more elements than the capacity.
            pub(crate) fn spare_view<'a>(&'a mut self, shape: &'a [usize]) -> Option<ArrayViewMut<'a>> {
                if shape.iter().product::<usize>() > self.capacity() {
                    return None;
                }
                let dtype = self.dtype();
                let ptr = match self { $( HostData::$V(v) => v.as_mut_ptr() as *mut u8, )* };
                // SAFETY: `ptr` has room for the capacity (checked: at least the shape's product)
                // of elements of `dtype`, aligned for it, borrowed mutably from `self` for `'a`.
                Some(unsafe { ArrayViewMut::from_raw(shape, dtype, ptr) })
            }
            /// Zeros (`calloc`-backed, so cheap for big arrays: every dtype's zero is all-zero bits).
            pub fn zeros(dtype: DType, n: usize) -> HostData {
                match dtype { $( DType::$V => HostData::$V(vec![<$rust>::from_literal_bits(0); n]), )* }
            }
            /// Element `i` as f64 (exact for every dtype); `None` out of range.
            pub fn get_f64(&self, i: usize) -> Option<f64> {
                match self { $( HostData::$V(v) => Some(v.get(i)?.literal().as_f64()), )* }
            }
        }

        $( host_element!($rust, $V); )*
    };
}
/// An empty vector with room for `n` elements, or the allocator's refusal.
fn room<T>(n: usize) -> std::result::Result<Vec<T>, std::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    Ok(v)
}

/// Whether two element slices hold the same bytes.
fn same_bits<T: HostElement>(a: &[T], b: &[T]) -> bool {
    // SAFETY: every `HostElement` (the dtype table's Rust types) is plain data with no padding, so
    // its slice is `size_of_val` initialized bytes, borrowed for this call.
    let bytes = |v: &[T]| unsafe {
        std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
    };
    a.len() == b.len() && bytes(a) == bytes(b)
}

impl Eq for HostData {}

impl HostData {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A Rust element type that host arrays can hold: a row of the dtype table.
pub trait HostElement: Element + Send + Sync + PartialEq + std::fmt::Debug {
    fn wrap(v: Vec<Self>) -> HostData;
    fn slice(d: &HostData) -> Option<&[Self]>;
    fn vec_mut(d: &mut HostData) -> Option<&mut Vec<Self>>;
    fn into_vec(d: HostData) -> Option<Vec<Self>>;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn wrap(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            #[inline]
            fn slice(d: &HostData) -> Option<&[Self]> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            #[inline]
            fn vec_mut(d: &mut HostData) -> Option<&mut Vec<Self>> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_vec(d: HostData) -> Option<Vec<Self>> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
crate::dtype::for_each_dtype!(host_data);

/// A whole array on the host: row-major data of a shape. Equality compares shapes and bits (see
/// [`HostData`]'s `PartialEq`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostArray {
    shape: Vec<usize>,
    data: Arc<HostData>,
}

impl HostArray {
    /// An array of `shape` holding `data` (row-major); the lengths must agree.
    pub fn new(shape: impl AsRef<[usize]>, data: HostData) -> Result<Self> {
        let shape = shape.as_ref().to_vec();
        let n = elements_of(&shape, data.dtype())?;
        if n != data.len() {
            return Err(kerr!(
                Shape,
                "a host array of shape {shape:?} needs {n} elements, got {}",
                data.len()
            ));
        }
        Ok(HostArray {
            shape,
            data: Arc::new(data),
        })
    }
    /// `HostArray::from_vec([2, 3], vec![0f32; 6])`.
    pub fn from_vec<T: HostElement>(shape: impl AsRef<[usize]>, data: Vec<T>) -> Result<Self> {
        Self::new(shape, T::wrap(data))
    }
    /// An int4 array from one `i8` per element (ml_dtypes' layout of numpy `int4` arrays): an error
    /// naming the first element outside int4's -8..=7.
    pub fn from_i8_as_i4(shape: impl AsRef<[usize]>, v: &[i8]) -> Result<Self> {
        let data = v
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                i4::new(x)
                    .ok_or_else(|| kerr!(DType, "int4 element {i} is {x}, outside int4's -8..=7"))
            })
            .collect::<Result<Vec<i4>>>()?;
        Self::from_vec(shape, data)
    }
    /// Zeros; an error for a shape whose size overflows.
    pub fn zeros(shape: impl AsRef<[usize]>, dtype: DType) -> Result<Self> {
        let shape = shape.as_ref().to_vec();
        let n = elements_of(&shape, dtype)?;
        Ok(HostArray {
            shape,
            data: Arc::new(HostData::zeros(dtype, n)),
        })
    }
    /// Deterministic pseudo-random contents: floats uniform in [-1, 1) (rounded to the dtype),
    /// signed ints in [-8, 8), unsigned in [0, 16), bools fair coins.
    pub fn random(shape: impl AsRef<[usize]>, dtype: DType, seed: u64) -> Result<Self> {
        let shape = shape.as_ref().to_vec();
        let n = elements_of(&shape, dtype)?;
        let mut rng = SplitMix(seed ^ 0x9E37_79B9_7F4A_7C15);
        let mut unit = || (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        let data = match dtype {
            DType::F32 => HostData::F32((0..n).map(|_| unit()).collect()),
            DType::BF16 => HostData::BF16((0..n).map(|_| bf16::from_f32(unit())).collect()),
            DType::I32 => HostData::I32((0..n).map(|_| (unit() * 8.0).floor() as i32).collect()),
            DType::I8 => HostData::I8((0..n).map(|_| (unit() * 8.0).floor() as i8).collect()),
            DType::U8 => HostData::U8((0..n).map(|_| ((unit() + 1.0) * 8.0) as u8).collect()),
            DType::U32 => HostData::U32((0..n).map(|_| ((unit() + 1.0) * 8.0) as u32).collect()),
            DType::Bool => HostData::Bool((0..n).map(|_| unit() >= 0.0).collect()),
            DType::F16 => HostData::F16((0..n).map(|_| half::f16::from_f32(unit())).collect()),
            DType::F8E4M3FN => {
                HostData::F8E4M3FN((0..n).map(|_| f8e4m3fn::from_f32(unit())).collect())
            }
            DType::F8E5M2 => HostData::F8E5M2((0..n).map(|_| f8e5m2::from_f32(unit())).collect()),
            DType::I4 => HostData::I4(
                (0..n)
                    .map(|_| i4::saturating_from_f64((unit() * 8.0).floor() as f64))
                    .collect(),
            ),
        };
        Ok(HostArray {
            shape,
            data: Arc::new(data),
        })
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn data(&self) -> &HostData {
        &self.data
    }
    /// The elements as a slice of `T`, if `T` is this array's element type.
    pub fn as_slice<T: HostElement>(&self) -> Option<&[T]> {
        T::slice(&self.data)
    }
    /// The elements as a `Vec<T>` (no copy when this is the only handle), if `T` is the element type.
    pub fn into_vec<T: HostElement>(mut self) -> Option<Vec<T>> {
        let data = std::mem::replace(&mut self.data, Arc::new(HostData::F32(Vec::new())));
        T::into_vec(Arc::try_unwrap(data).unwrap_or_else(|shared| (*shared).clone()))
    }
    /// Every element as f64 (exact), for comparisons.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len())
            .map(|i| self.data.get_f64(i).unwrap_or(f64::NAN))
            .collect()
    }
    pub(crate) fn shared_data(&self) -> Arc<HostData> {
        Arc::clone(&self.data)
    }
    pub(crate) fn from_parts(shape: Vec<usize>, data: HostData) -> Self {
        HostArray {
            shape,
            data: Arc::new(data),
        }
    }
}

impl Drop for HostArray {
    /// Large buffers go back to the interpreter's output pool (see `take_output`).
    fn drop(&mut self) {
        if let Some(d) = Arc::get_mut(&mut self.data) {
            if d.capacity() * d.dtype().size_bytes() >= OUTPUT_POOL_MIN_BYTES {
                give_output(std::mem::replace(d, HostData::F32(Vec::new())));
            }
        }
    }
}

// Output arrays are handed to the caller and dropped there; keeping their buffers (like XLA's
// allocator keeps device buffers) means the next run writes into memory that is already mapped instead
// of faulting in fresh pages — measured as a third of a 1024² add.
const OUTPUT_POOL_MIN_BYTES: usize = 256 << 10;
const OUTPUT_POOL_MAX_BYTES: usize = 256 << 20;
const OUTPUT_POOL_MAX_BUFFERS: usize = 16;
static OUTPUT_POOL: std::sync::Mutex<Vec<HostData>> = std::sync::Mutex::new(Vec::new());

fn give_output(d: HostData) {
    if let Ok(mut p) = OUTPUT_POOL.lock() {
        let held: usize = p
            .iter()
            .map(|x| x.capacity() * x.dtype().size_bytes())
            .sum();
        if p.len() < OUTPUT_POOL_MAX_BUFFERS
            && held + d.capacity() * d.dtype().size_bytes() <= OUTPUT_POOL_MAX_BYTES
        {
            p.push(d);
        }
    }
}

/// An empty buffer of `dtype` with room for `n` elements, reusing a dropped array's when one fits.
/// The element count of a host array of `shape`: an error, not a wrap, when its size overflows.
fn elements_of(shape: &[usize], dtype: DType) -> Result<usize> {
    match crate::size::bytes(shape, dtype) {
        Some(_) => Ok(shape.iter().product()),
        None => Err(kerr!(
            Shape,
            "a host array of shape {shape:?} ({dtype}) has more bytes than fit in memory (its size overflows)"
        )),
    }
}

pub(crate) fn take_output(
    dtype: DType,
    n: usize,
) -> std::result::Result<HostData, std::collections::TryReserveError> {
    if n * dtype.size_bytes() >= OUTPUT_POOL_MIN_BYTES {
        if let Ok(mut p) = OUTPUT_POOL.lock() {
            if let Some(i) = p
                .iter()
                .position(|d| d.dtype() == dtype && d.capacity() >= n && d.capacity() <= 2 * n)
            {
                let mut d = p.swap_remove(i);
                // SAFETY: length 0 is always valid.
                unsafe { d.assume_init(0) };
                return Ok(d);
            }
        }
    }
    HostData::try_uninit(dtype, n)
}

/// A tiny deterministic generator (SplitMix64) so random inputs need no extra dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A borrowed, read-only input array in foreign memory (an XLA buffer): row-major elements of `dtype`
/// (bool as one byte 0/1), as [`interpret_into`](crate::interpret::interpret_into) reads them.
#[derive(Clone, Copy, Debug)]
pub struct ArrayView<'a> {
    pub shape: &'a [usize],
    pub dtype: DType,
    ptr: *const u8,
    _life: std::marker::PhantomData<&'a [u8]>,
}

/// A borrowed output array in foreign memory, written whole by [`interpret_into`](crate::interpret::interpret_into).
#[derive(Debug)]
pub struct ArrayViewMut<'a> {
    pub shape: &'a [usize],
    pub dtype: DType,
    ptr: *mut u8,
    _life: std::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> ArrayView<'a> {
    /// # Safety
    /// `ptr` must point to `shape.iter().product()` initialized elements of `dtype` (bools as bytes
    /// 0 or 1, int4 as one byte per element holding -8..=7 — XLA's packed S4 buffers are unpacked
    /// first: `export/ffi.rs`), aligned for that dtype, not written by anyone while `'a` lasts.
    pub unsafe fn from_raw(shape: &'a [usize], dtype: DType, ptr: *const u8) -> Self {
        ArrayView {
            shape,
            dtype,
            ptr,
            _life: std::marker::PhantomData,
        }
    }
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub(crate) fn ptr(&self) -> *const u8 {
        self.ptr
    }
}

impl<'a> ArrayViewMut<'a> {
    /// # Safety
    /// `ptr` must point to room for `shape.iter().product()` elements of `dtype`, aligned for that
    /// dtype, not read or written by anyone else while `'a` lasts.
    pub unsafe fn from_raw(shape: &'a [usize], dtype: DType, ptr: *mut u8) -> Self {
        ArrayViewMut {
            shape,
            dtype,
            ptr,
            _life: std::marker::PhantomData,
        }
    }
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equality_compares_bits() {
        let f = |v: Vec<f32>| HostArray::new([v.len()], HostData::F32(v)).unwrap();
        let nan = f32::from_bits(0x7fc0_0001);
        assert_eq!(f(vec![nan, 1.0]), f(vec![nan, 1.0]), "the same NaN payload");
        assert_ne!(f(vec![nan]), f(vec![f32::NAN]), "another NaN payload");
        assert_ne!(f(vec![0.0]), f(vec![-0.0]), "signed zeros differ");
        let b = |v: f32| HostArray::new([1], HostData::BF16(vec![bf16::from_f32(v)])).unwrap();
        assert_ne!(b(0.0), b(-0.0));
        assert_eq!(b(f32::NAN), b(f32::NAN));
        assert_ne!(
            f(vec![1.0]),
            HostArray::new([1], HostData::I32(vec![1])).unwrap(),
            "dtypes differ"
        );
        assert_ne!(
            f(vec![1.0, 2.0]),
            HostArray::new([2, 1], HostData::F32(vec![1.0, 2.0])).unwrap(),
            "shapes differ"
        );
    }
}

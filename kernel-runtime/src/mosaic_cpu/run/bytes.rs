//! Memory as the JIT'd code sees it: block buffers (8-byte aligned bytes), host arrays to and from
//! native-endian bytes, and the rows of a block inside its array (clipped at the array's edge), which
//! the block copies in and out walk.
//!
//! May depend on: `crate::semantics::host`'s data, `crate::dtype`, `rewrite::row_major`; nothing else.

use crate::dtype::DType;
use crate::mosaic_cpu::rewrite::row_major;
use crate::semantics::host::HostData;
use half::bf16;

/// Bytes of one element in host arrays and in the JIT'd code's memrefs (`i1` is a byte).
pub(super) fn elem_size(d: DType) -> usize {
    match d {
        DType::F32 | DType::I32 | DType::U32 => 4,
        DType::BF16 | DType::F16 => 2,
        // int4 is one byte per element here as on the host (LLVM stores an `i4` in a byte).
        DType::I8 | DType::U8 | DType::Bool | DType::F8E4M3FN | DType::F8E5M2 | DType::I4 => 1,
    }
}

/// A block buffer: 8-byte aligned bytes.
pub(super) struct Buffer {
    pub(super) words: Vec<u64>,
    len: usize,
}

impl Buffer {
    pub(super) fn zeroed(len: usize) -> Buffer {
        Buffer {
            words: vec![0; len.div_ceil(8).max(1)],
            len,
        }
    }
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `words` holds at least `len` bytes (`len.div_ceil(8)` words); u8 has no alignment
        // requirement and every byte pattern is a valid u64, so the two views may alias freely.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`, read-only.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }
}

/// Element types whose values are plain bytes: no padding, every bit pattern valid.
pub(super) trait Plain: Copy + Default {}
impl Plain for f32 {}
impl Plain for bf16 {}
impl Plain for i32 {}
impl Plain for i8 {}
impl Plain for u8 {}
impl Plain for u32 {}
impl Plain for half::f16 {}
impl Plain for crate::dtype::f8e4m3fn {}
impl Plain for crate::dtype::f8e5m2 {}

fn bytes_of<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding, so all `size_of_val(v)` bytes are initialized; u8 has no
    // alignment requirement.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub(super) fn from_plain_bytes<T: Plain>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::default(); b.len() / std::mem::size_of::<T>()];
    let n = std::mem::size_of_val(&v[..]);
    // SAFETY: every bit pattern is a valid `Plain` value, so writing arbitrary bytes over the `n`
    // bytes of `v` keeps it valid; u8 has no alignment requirement.
    let dst = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n) };
    dst.copy_from_slice(&b[..n]);
    v
}

/// Host data as native-endian bytes (bool as 0/1 bytes).
pub(super) fn to_bytes(d: &HostData) -> Vec<u8> {
    match d {
        HostData::F32(v) => bytes_of(v).to_vec(),
        HostData::BF16(v) => bytes_of(v).to_vec(),
        HostData::I32(v) => bytes_of(v).to_vec(),
        HostData::I8(v) => bytes_of(v).to_vec(),
        HostData::U8(v) => v.clone(),
        HostData::U32(v) => bytes_of(v).to_vec(),
        HostData::Bool(v) => v.iter().map(|x| *x as u8).collect(),
        HostData::F16(v) => bytes_of(v).to_vec(),
        HostData::F8E4M3FN(v) => bytes_of(v).to_vec(),
        HostData::F8E5M2(v) => bytes_of(v).to_vec(),
        HostData::I4(v) => v.iter().map(|x| x.get() as u8).collect(),
    }
}

pub(super) fn from_bytes(dtype: DType, b: &[u8]) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(from_plain_bytes(b)),
        DType::BF16 => HostData::BF16(from_plain_bytes(b)),
        DType::I32 => HostData::I32(from_plain_bytes(b)),
        DType::I8 => HostData::I8(from_plain_bytes(b)),
        DType::U8 => HostData::U8(b.to_vec()),
        DType::U32 => HostData::U32(from_plain_bytes(b)),
        DType::Bool => HostData::Bool(b.iter().map(|x| *x != 0).collect()),
        DType::F16 => HostData::F16(from_plain_bytes(b)),
        DType::F8E4M3FN => HostData::F8E4M3FN(from_plain_bytes(b)),
        DType::F8E5M2 => HostData::F8E5M2(from_plain_bytes(b)),
        // LLVM leaves the bits above an `i4` store unspecified: the low nibble is the value.
        DType::I4 => HostData::I4(b.iter().map(|x| crate::dtype::i4::from_bits(*x)).collect()),
    }
}

/// Visit the rows of block `idx` (of `block` shape) inside an array of `shape`, clipped to the array:
/// `f(array byte offset, block byte offset, bytes)`.
pub(super) fn block_rows(
    shape: &[usize],
    block: &[usize],
    idx: &[i64],
    esize: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let r = shape.len();
    if r == 0 {
        f(0, 0, esize);
        return;
    }
    let starts: Vec<usize> = (0..r).map(|d| idx[d] as usize * block[d]).collect();
    let clipped: Vec<usize> = (0..r)
        .map(|d| block[d].min(shape[d].saturating_sub(starts[d])))
        .collect();
    if clipped.contains(&0) {
        return;
    }
    let astr = row_major(shape);
    let bstr = row_major(block);
    let mut i = vec![0usize; r - 1];
    loop {
        let a: usize = (0..r - 1)
            .map(|d| (starts[d] + i[d]) * astr[d])
            .sum::<usize>()
            + starts[r - 1];
        let b: usize = (0..r - 1).map(|d| i[d] * bstr[d]).sum();
        f(a * esize, b * esize, clipped[r - 1] * esize);
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            i[d] += 1;
            if i[d] < clipped[d] {
                break;
            }
            i[d] = 0;
        }
    }
}

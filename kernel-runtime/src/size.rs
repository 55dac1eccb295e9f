//! Checked size arithmetic on the numbers users give: array, block, scratch and value shapes. Every
//! shape that enters a kernel is checked here once (dimensions within MLIR's `i64`, element and byte
//! counts without overflow), so the arithmetic done on it afterwards — tiling hints, VMEM padding,
//! grids of blocks — cannot wrap, in debug and release alike.

use crate::dtype::DType;
use crate::error::{kerr, Result};

/// The largest dimension MLIR can type (`memref`/`vector` dims are `i64`).
pub const MAX_DIM: usize = i64::MAX as usize;

/// The number of elements of `shape`, or `None` if it overflows `usize`.
pub fn elements(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// The bytes of a `dtype` array of `shape`, or `None` past `i64::MAX` (XLA's and MLIR's byte sizes).
pub fn bytes(shape: &[usize], dtype: DType) -> Option<u64> {
    elements(shape)
        .and_then(|n| (n as u64).checked_mul(dtype.size_bytes() as u64))
        .filter(|&b| b <= i64::MAX as u64)
}

/// `what` (e.g. "array", "block shape", "value") of `shape` is representable: every dimension fits MLIR's
/// `i64`, and its byte size fits `i64`.
pub fn check(what: &str, shape: &[usize], dtype: DType) -> Result<()> {
    if let Some(d) = shape.iter().position(|&d| d > MAX_DIM) {
        return Err(kerr!(
            Shape,
            "{what} {shape:?}: dimension {d} ({}) is above the largest MLIR dimension, i64::MAX = {MAX_DIM}",
            shape[d]
        ));
    }
    if bytes(shape, dtype).is_none() {
        return Err(kerr!(
            Shape,
            "{what} {shape:?} of {dtype}: its size in bytes overflows (more than i64::MAX bytes)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_shapes_are_errors_not_wraps() {
        assert_eq!(elements(&[1 << 32, 1 << 32]), None);
        assert_eq!(elements(&[3, 4]), Some(12));
        assert!(check("array", &[usize::MAX], DType::F32)
            .unwrap_err()
            .message
            .contains("dimension 0 (18446744073709551615) is above the largest MLIR dimension"));
        assert!(check("array", &[1 << 31, 1 << 31], DType::F32)
            .unwrap_err()
            .message
            .contains("overflows"));
        assert!(check("array", &[8, 128], DType::F32).is_ok());
        assert_eq!(bytes(&[1 << 61], DType::F32), None);
    }
}

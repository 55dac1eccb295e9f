//! `i4`, the dtype table's 4-bit signed integer (jax's / ml_dtypes' `int4`, XLA's `S4`, Mosaic's
//! `i4`): values -8..=7.
//!
//! **On the host one element is one byte** (an `i8` holding the value, sign-extended), not two
//! elements packed in a byte: the engines index, slice, pad and copy blocks element by element (a
//! block may start at any row, an edge block is padded, a window may be strided), which packing would
//! turn into nibble arithmetic on every path for no gain on a CPU. Packing happens only where a
//! boundary demands it: XLA hands a custom call on CPU its `S4` buffers packed two per byte (measured
//! with jax 0.12: element `2i` in the low nibble of byte `i`, `2i + 1` in the high one, across rows;
//! `export/ffi.rs` unpacks inputs and packs outputs with [`pack`] / [`unpack`]). numpy's `int4`
//! (ml_dtypes) is one byte per element, as ours. A value outside -8..=7 cannot be made: [`i4::new`]
//! refuses it, and host arrays built from bytes check every one (`HostArray::from_i8_as_i4`).

use std::fmt;

/// A 4-bit signed integer, -8..=7 (one byte on the host: see the module docs).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct i4(i8);

impl i4 {
    pub const MIN: i4 = i4(-8);
    pub const MAX: i4 = i4(7);

    /// `v` as an `i4`, or `None` outside -8..=7.
    pub const fn new(v: i8) -> Option<i4> {
        if v >= -8 && v <= 7 {
            Some(i4(v))
        } else {
            None
        }
    }
    /// The low 4 bits of `v`, sign-extended: what an integer cast to `int4` computes (XLA's and
    /// Mosaic's `trunci`, wrapping).
    pub const fn wrapping(v: i64) -> i4 {
        i4(((v as u8) << 4) as i8 >> 4)
    }
    /// `x` rounded toward zero and saturated to -8..=7, NaN to 0: a float cast to `int4`.
    pub fn saturating_from_f64(x: f64) -> i4 {
        if x.is_nan() {
            i4(0)
        } else {
            i4(x.clamp(-8.0, 7.0) as i8)
        }
    }
    /// The value.
    pub const fn get(self) -> i8 {
        self.0
    }
    /// The 4-bit pattern (in the low nibble).
    pub const fn to_bits(self) -> u8 {
        self.0 as u8 & 0x0F
    }
    /// The value of the 4-bit pattern in the low nibble of `b` (the high nibble is ignored).
    pub const fn from_bits(b: u8) -> i4 {
        i4(((b << 4) as i8) >> 4)
    }
    pub fn to_f64(self) -> f64 {
        self.0 as f64
    }
    pub fn to_f32(self) -> f32 {
        self.0 as f32
    }
}

impl fmt::Debug for i4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for i4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Bytes XLA's packed `S4` layout takes for `n` elements.
pub const fn packed_len(n: usize) -> usize {
    n.div_ceil(2)
}

/// `n` elements from XLA's packed layout (element `2i` in the low nibble of `packed[i]`).
pub fn unpack(packed: &[u8], n: usize) -> Vec<i4> {
    (0..n)
        .map(|i| i4::from_bits(packed[i / 2] >> (4 * (i % 2))))
        .collect()
}

/// `v` into XLA's packed layout (an odd count leaves the last byte's high nibble zero).
pub fn pack(v: &[i4], packed: &mut [u8]) {
    for (i, pair) in v.chunks(2).enumerate() {
        let hi = pair.get(1).map_or(0, |x| x.to_bits());
        packed[i] = pair[0].to_bits() | (hi << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_and_its_value() {
        for b in 0..16u8 {
            let v = i4::from_bits(b);
            assert_eq!(v.to_bits(), b);
            assert_eq!(i4::new(v.get()), Some(v));
            assert_eq!(i4::wrapping(v.get() as i64), v);
            assert_eq!(i4::from_bits(b | 0xA0), v, "the high nibble is ignored");
        }
        assert_eq!(i4::new(8), None);
        assert_eq!(i4::new(-9), None);
        assert_eq!(i4::wrapping(9).get(), -7);
        assert_eq!(i4::wrapping(-9).get(), 7);
        assert_eq!(i4::saturating_from_f64(7.9).get(), 7);
        assert_eq!(i4::saturating_from_f64(-100.0).get(), -8);
        assert_eq!(i4::saturating_from_f64(-2.7).get(), -2);
        assert_eq!(i4::saturating_from_f64(f64::NAN).get(), 0);
    }

    #[test]
    fn packing_is_xlas_low_nibble_first() {
        // Measured: jax 0.12 hands the custom call [0, 1, .., 7, -8, .., -1] as 0x10 0x32 .. 0xfe.
        let v: Vec<i4> = (0..16).map(i4::wrapping).collect();
        let mut p = vec![0u8; packed_len(16)];
        pack(&v, &mut p);
        assert_eq!(p, [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]);
        assert_eq!(unpack(&p, 16), v);
        let mut odd = vec![0u8; packed_len(3)];
        pack(&v[..3], &mut odd);
        assert_eq!(odd, [0x10, 0x02]);
        assert_eq!(unpack(&odd, 3), &v[..3]);
    }
}

//! The element types of the elementwise loops: floats computed in f32 (bf16 rounded back on every op,
//! and the op table's vector loops run on f32 chunks), and the conversions `cast` makes.

use super::{map1, map1_rows, map2, map2_rows, RowArg, Sink};
use crate::error::Result;
use crate::interpret::tensor::{bf16_from_f32, bf16_to_f32, Tensor};
use crate::math::{BinaryF32, Operand, UnaryF32};
use crate::semantics::host::HostElement;
use half::bf16;
use std::mem::MaybeUninit;

/// f32 and bf16: computed in f32, results rounded back to the element type.
pub(crate) trait FloatElem: HostElement {
    fn f(self) -> f32;
    fn from_f(x: f32) -> Self;
    /// A row of an op table function with vector loops (bf16 through f32 chunks).
    fn unary_row<F: UnaryF32>(f: F, src: &[Self], dst: &mut [MaybeUninit<Self>]);
    fn binary_row<F: BinaryF32>(
        f: F,
        a: RowArg<'_, Self>,
        b: RowArg<'_, Self>,
        dst: &mut [MaybeUninit<Self>],
    );
}
impl FloatElem for f32 {
    #[inline(always)]
    fn f(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f(x: f32) -> Self {
        x
    }
    fn unary_row<F: UnaryF32>(f: F, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        f.map(src, dst)
    }
    fn binary_row<F: BinaryF32>(
        f: F,
        a: RowArg<'_, f32>,
        b: RowArg<'_, f32>,
        dst: &mut [MaybeUninit<f32>],
    ) {
        fn op(o: RowArg<'_, f32>) -> Operand<'_> {
            match o {
                RowArg::Slice(s) => Operand::Slice(s),
                RowArg::Scalar(x) => Operand::Scalar(x),
            }
        }
        f.zip_into(dst, op(a), op(b))
    }
}
impl FloatElem for bf16 {
    #[inline(always)]
    fn f(self) -> f32 {
        bf16_to_f32(self)
    }
    #[inline(always)]
    fn from_f(x: f32) -> Self {
        bf16_from_f32(x)
    }
    fn unary_row<F: UnaryF32>(f: F, src: &[bf16], dst: &mut [MaybeUninit<bf16>]) {
        let mut v = [0f32; BF16_CHUNK];
        for (s, d) in src.chunks(BF16_CHUNK).zip(dst.chunks_mut(BF16_CHUNK)) {
            let v = &mut v[..s.len()];
            for (v, &x) in v.iter_mut().zip(s) {
                *v = bf16_to_f32(x);
            }
            f.run(v);
            for (d, &y) in d.iter_mut().zip(&*v) {
                d.write(bf16_from_f32(y));
            }
        }
    }
    fn binary_row<F: BinaryF32>(
        f: F,
        a: RowArg<'_, bf16>,
        b: RowArg<'_, bf16>,
        dst: &mut [MaybeUninit<bf16>],
    ) {
        let (mut va, mut vb) = ([0f32; BF16_CHUNK], [0f32; BF16_CHUNK]);
        let mut v = [MaybeUninit::<f32>::uninit(); BF16_CHUNK];
        for (c, d) in dst.chunks_mut(BF16_CHUNK).enumerate() {
            /// Elements `at..at + n` of `o` in f32 (through `buf`).
            fn widen<'b>(
                o: RowArg<'_, bf16>,
                buf: &'b mut [f32; BF16_CHUNK],
                at: usize,
                n: usize,
            ) -> Operand<'b> {
                match o {
                    RowArg::Slice(s) => {
                        for (w, &x) in buf.iter_mut().zip(&s[at..at + n]) {
                            *w = bf16_to_f32(x);
                        }
                        Operand::Slice(&buf[..n])
                    }
                    RowArg::Scalar(x) => Operand::Scalar(bf16_to_f32(x)),
                }
            }
            let (at, n) = (c * BF16_CHUNK, d.len());
            let v = &mut v[..n];
            f.zip_into(v, widen(a, &mut va, at, n), widen(b, &mut vb, at, n));
            for (d, y) in d.iter_mut().zip(&*v) {
                // SAFETY: `zip_into` wrote every element of `v`.
                d.write(bf16_from_f32(unsafe { y.assume_init() }));
            }
        }
    }
}

/// The f32 chunk a bf16 row goes through.
const BF16_CHUNK: usize = 256;

/// Conversions used by `cast` (saturating float→int with NaN→0, wrapping int→int, exact int→float then
/// one rounding).
pub(crate) trait Convert: HostElement {
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn from_f64_sat(x: f64) -> Self;
    fn from_i64(x: i64) -> Self;
}
macro_rules! convert_int {
    ($($t:ty),*) => {$(
        impl Convert for $t {
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_f64_sat(x: f64) -> Self { x as $t }
            #[inline(always)] fn from_i64(x: i64) -> Self { x as $t }
        }
    )*};
}
convert_int!(i32, u32, i8, u8);
impl Convert for f32 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_f64_sat(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn from_i64(x: i64) -> Self {
        x as f32
    }
}
impl Convert for bf16 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        bf16_to_f32(self) as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        bf16_to_f32(self) as i64
    }
    #[inline(always)]
    fn from_f64_sat(x: f64) -> Self {
        bf16_from_f32(x as f32)
    }
    fn from_i64(x: i64) -> Self {
        bf16::from_bits(crate::math::bf16_bits_of_i64(x))
    }
}
/// The narrow floats: every value is exact in f64; a conversion into one rounds once, from the exact
/// value (ml_dtypes' and XLA's `convert`).
macro_rules! convert_narrow_float {
    ($($t:ty),*) => {$(
        impl Convert for $t {
            #[inline(always)]
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                <$t>::to_f64(self) as i64
            }
            #[inline(always)]
            fn from_f64_sat(x: f64) -> Self {
                <$t>::from_f64(x)
            }
            #[inline(always)]
            fn from_i64(x: i64) -> Self {
                // Exact in f64 for every i32/u32/i8/u8 a kernel casts, then rounded once.
                <$t>::from_f64(x as f64)
            }
        }
    )*};
}
convert_narrow_float!(half::f16, crate::dtype::f8e4m3fn, crate::dtype::f8e5m2);
/// int4: floats round toward zero and saturate (NaN → 0), integers wrap to their low 4 bits (XLA's
/// `convert` and Mosaic's `fptosi` / `trunci`).
impl Convert for crate::dtype::i4 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self.get() as i64
    }
    #[inline(always)]
    fn from_f64_sat(x: f64) -> Self {
        Self::saturating_from_f64(x)
    }
    #[inline(always)]
    fn from_i64(x: i64) -> Self {
        Self::wrapping(x)
    }
}

impl Convert for bool {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_f64_sat(x: f64) -> Self {
        x != 0.0
    }
    #[inline(always)]
    fn from_i64(x: i64) -> Self {
        x != 0
    }
}

/// The op table's f32 function `f` over `a`: rows through its vector loops when it has them.
pub(super) fn unary_with<T: FloatElem, F: UnaryF32>(
    f: F,
    a: &Tensor,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    let elem = move |x: T| T::from_f(f.scalar(x.f()));
    if !F::VECTOR {
        return map1(a, elem, sink);
    }
    map1_rows(
        a,
        elem,
        Some(&move |src: &[T], dst: &mut _| T::unary_row(f, src, dst)),
        sink,
    )
}

/// The op table's f32 function `f` over `a` and `b`: rows through its vector loops when it has them.
pub(super) fn binary_with<T: FloatElem, F: BinaryF32>(
    f: F,
    a: &Tensor,
    b: &Tensor,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    let elem = move |x: T, y: T| T::from_f(f.scalar(x.f(), y.f()));
    if !F::VECTOR {
        return map2(a, b, elem, sink);
    }
    let row = move |x: RowArg<'_, T>, y: RowArg<'_, T>, dst: &mut _| T::binary_row(f, x, y, dst);
    map2_rows(a, b, elem, Some(&row), sink)
}

//! Elementwise rules (unary, binary, compare, select, cast): one generic strided loop per arity, then a
//! small table per op family. Floats compute in f32; bf16 results are rounded on every op, like XLA.

mod elem;
mod rows;

use super::host::HostElement;
use super::math::IntOps;
use super::tensor::{bf16_from_f32, bf16_to_f32, internal, take_vec, Rows, Tensor};
use crate::dtype::DType;
use crate::error::{kerr, Result};
use crate::ir::{BinaryOp, CmpOp, UnaryOp};
pub(crate) use elem::FloatElem;
use elem::{binary_with, unary_with, Convert};
use half::bf16;
use rows::zip3;
pub(crate) use rows::RowArg;

// ---------------------------------------------------------------------------------------------- loops

/// Where an elementwise result may be written directly: an output block inside the output array
/// (so the store that follows needs no block buffer and write-back needs no copy).
#[derive(Clone, Debug)]
pub(crate) struct RawDest {
    pub ptr: *mut u8,
    /// Elements the pointer may address.
    pub len: usize,
    pub off: usize,
    pub strides: super::tensor::Dims,
    pub shape: super::tensor::Dims,
    pub dtype: DType,
}

thread_local! {
    static DEST: std::cell::RefCell<Option<RawDest>> = const { std::cell::RefCell::new(None) };
}

/// Run the elementwise rule `f` offering `dest` as its output: `Ok(None)` if the result was written
/// there, `Ok(Some(t))` if `f` produced a tensor instead (e.g. a no-op cast).
///
/// # Safety
/// `dest` must address `len` elements of `dtype` that nothing else reads or writes while `f` runs.
pub(crate) unsafe fn into_dest(
    dest: RawDest,
    f: impl FnOnce() -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    DEST.with(|d| *d.borrow_mut() = Some(dest));
    let r = f();
    let unused = DEST.with(|d| d.borrow_mut().take());
    let t = r?;
    Ok(if unused.is_some() { Some(t) } else { None })
}

/// The output of one elementwise loop: a fresh buffer, or an offered [`RawDest`] of the right type.
struct Out<R> {
    vec: Option<Vec<R>>,
    ptr: *mut R,
    len: usize,
    off: usize,
    strides: super::tensor::Dims,
}

impl<R: HostElement> Out<R> {
    fn new(shape: &[usize]) -> Out<R> {
        let offered = DEST.with(|d| {
            let mut d = d.borrow_mut();
            if d.as_ref()
                .is_some_and(|x| x.dtype == R::DTYPE && x.shape[..] == shape[..])
            {
                d.take()
            } else {
                None
            }
        });
        if let Some(d) = offered {
            return Out {
                vec: None,
                ptr: d.ptr as *mut R,
                len: d.len,
                off: d.off,
                strides: d.strides,
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
            strides: super::tensor::row_major_strides(shape),
        }
    }
    /// Whether every row of `len` elements at `inner` stride stays inside the destination.
    fn fits(&self, shape: &[usize]) -> bool {
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
    unsafe fn row(&mut self, o: usize, len: usize) -> &mut [std::mem::MaybeUninit<R>] {
        // SAFETY: forwarded to the caller.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(o) as *mut std::mem::MaybeUninit<R>, len)
        }
    }
    #[inline(always)]
    unsafe fn put(&mut self, o: usize, v: R) {
        // SAFETY: forwarded to the caller.
        unsafe { self.ptr.add(o).write(v) }
    }
    fn finish(self, shape: &[usize]) -> Tensor {
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

macro_rules! dispatch {
    ($avx:ident, $imp:ident, ($($a:ident),*)) => {{
        #[cfg(target_arch = "x86_64")]
        if super::simd::avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            return unsafe { $avx($($a),*) };
        }
        $imp($($a),*)
    }};
}

/// A function over a whole contiguous row (`src` and `dst` of one length): the vector loops of an op
/// whose per-element form is the `f` given with it.
type Row1<'a, A, R> = Option<&'a dyn Fn(&[A], &mut [std::mem::MaybeUninit<R>])>;
/// A binary row function (each operand a row or a broadcast value).
type Row2<'a, A, B, R> =
    Option<&'a dyn Fn(RowArg<'_, A>, RowArg<'_, B>, &mut [std::mem::MaybeUninit<R>])>;

/// `f` over every element of `a`.
pub(crate) fn map1<A: HostElement, R: HostElement>(
    a: &Tensor,
    f: impl Fn(A) -> R,
) -> Result<Tensor> {
    map1_rows(a, f, None)
}

/// [`map1`], with contiguous rows computed by `row` when given.
pub(crate) fn map1_rows<A: HostElement, R: HostElement>(
    a: &Tensor,
    f: impl Fn(A) -> R,
    row: Row1<'_, A, R>,
) -> Result<Tensor> {
    dispatch!(map1_avx2, map1_impl, (a, f, row))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map1_avx2<A: HostElement, R: HostElement>(
    a: &Tensor,
    f: impl Fn(A) -> R,
    row: Row1<'_, A, R>,
) -> Result<Tensor> {
    map1_impl(a, f, row)
}

#[inline(always)]
fn map1_impl<A: HostElement, R: HostElement>(
    a: &Tensor,
    f: impl Fn(A) -> R,
    row: Row1<'_, A, R>,
) -> Result<Tensor> {
    let ad = a.data::<A>()?;
    let mut out = Out::<R>::new(&a.shape);
    if !out.fits(&a.shape) {
        return Err(internal("elementwise destination too small"));
    }
    let rows = Rows::new(&a.shape, [&a.strides, &out.strides], [a.offset, out.off]);
    let (len, [sa, so]) = (rows.inner, rows.inner_strides);
    for [oa, od] in rows {
        // SAFETY: `fits` checked every destination row; rows of one result never overlap.
        unsafe {
            match (sa, so) {
                (1, 1) => match row {
                    Some(row) => row(&ad[oa..oa + len], out.row(od, len)),
                    None => {
                        for (d, &x) in out.row(od, len).iter_mut().zip(&ad[oa..oa + len]) {
                            d.write(f(x));
                        }
                    }
                },
                (0, 1) => {
                    let v = f(ad[oa]);
                    for d in out.row(od, len) {
                        d.write(v);
                    }
                }
                (sa, so) => {
                    for i in 0..len {
                        out.put(od + i * so, f(ad[oa + i * sa]));
                    }
                }
            }
        }
    }
    Ok(out.finish(&a.shape))
}

/// `f` over pairs of elements of same-shaped `a` and `b`.
pub(crate) fn map2<A: HostElement, B: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> R,
) -> Result<Tensor> {
    map2_rows(a, b, f, None)
}

/// [`map2`], with contiguous rows (an operand may be broadcast) computed by `row` when given.
pub(crate) fn map2_rows<A: HostElement, B: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> R,
    row: Row2<'_, A, B, R>,
) -> Result<Tensor> {
    dispatch!(map2_avx2, map2_impl, (a, b, f, row))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map2_avx2<A: HostElement, B: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> R,
    row: Row2<'_, A, B, R>,
) -> Result<Tensor> {
    map2_impl(a, b, f, row)
}

#[inline(always)]
fn map2_impl<A: HostElement, B: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> R,
    row: Row2<'_, A, B, R>,
) -> Result<Tensor> {
    if a.shape != b.shape {
        return Err(internal("elementwise operands of different shapes"));
    }
    let (ad, bd) = (a.data::<A>()?, b.data::<B>()?);
    let mut out = Out::<R>::new(&a.shape);
    if !out.fits(&a.shape) {
        return Err(internal("elementwise destination too small"));
    }
    let rows = Rows::new(
        &a.shape,
        [&a.strides, &b.strides, &out.strides],
        [a.offset, b.offset, out.off],
    );
    let (len, [sa, sb, so]) = (rows.inner, rows.inner_strides);
    for [oa, ob, od] in rows {
        // SAFETY: `fits` checked every destination row; rows of one result never overlap.
        unsafe {
            if let (Some(row), 1) = (row, so) {
                if let (Some(x), Some(y)) =
                    (RowArg::of(ad, oa, sa, len), RowArg::of(bd, ob, sb, len))
                {
                    row(x, y, out.row(od, len));
                    continue;
                }
            }
            match (sa, sb, so) {
                (1, 1, 1) => {
                    for ((d, &x), &y) in out
                        .row(od, len)
                        .iter_mut()
                        .zip(&ad[oa..oa + len])
                        .zip(&bd[ob..ob + len])
                    {
                        d.write(f(x, y));
                    }
                }
                (1, 0, 1) => {
                    let y = bd[ob];
                    for (d, &x) in out.row(od, len).iter_mut().zip(&ad[oa..oa + len]) {
                        d.write(f(x, y));
                    }
                }
                (0, 1, 1) => {
                    let x = ad[oa];
                    for (d, &y) in out.row(od, len).iter_mut().zip(&bd[ob..ob + len]) {
                        d.write(f(x, y));
                    }
                }
                (sa, sb, so) => {
                    for i in 0..len {
                        out.put(od + i * so, f(ad[oa + i * sa], bd[ob + i * sb]));
                    }
                }
            }
        }
    }
    Ok(out.finish(&a.shape))
}

/// `f` over triples of elements of same-shaped `a`, `b`, `c`.
pub(crate) fn map3<A: HostElement, B: HostElement, C: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl Fn(A, B, C) -> R,
) -> Result<Tensor> {
    dispatch!(map3_avx2, map3_impl, (a, b, c, f))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map3_avx2<A: HostElement, B: HostElement, C: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl Fn(A, B, C) -> R,
) -> Result<Tensor> {
    map3_impl(a, b, c, f)
}

#[inline(always)]
fn map3_impl<A: HostElement, B: HostElement, C: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl Fn(A, B, C) -> R,
) -> Result<Tensor> {
    if a.shape != b.shape || a.shape != c.shape {
        return Err(internal("elementwise operands of different shapes"));
    }
    let (ad, bd, cd) = (a.data::<A>()?, b.data::<B>()?, c.data::<C>()?);
    let mut out = Out::<R>::new(&a.shape);
    if !out.fits(&a.shape) {
        return Err(internal("elementwise destination too small"));
    }
    let rows = Rows::new(
        &a.shape,
        [&a.strides, &b.strides, &c.strides, &out.strides],
        [a.offset, b.offset, c.offset, out.off],
    );
    let (len, [sa, sb, sc, so]) = (rows.inner, rows.inner_strides);
    for [oa, ob, oc, od] in rows {
        // SAFETY: `fits` checked every destination row; rows of one result never overlap.
        unsafe {
            let args = (
                RowArg::of(ad, oa, sa, len),
                RowArg::of(bd, ob, sb, len),
                RowArg::of(cd, oc, sc, len),
            );
            match (so, args) {
                // Contiguous or broadcast operands (`select(m, 0.0, x)`): one loop per combination.
                (1, (Some(x), Some(y), Some(z))) => zip3(out.row(od, len), x, y, z, &f),
                _ => {
                    for i in 0..len {
                        out.put(
                            od + i * so,
                            f(ad[oa + i * sa], bd[ob + i * sb], cd[oc + i * sc]),
                        );
                    }
                }
            }
        }
    }
    Ok(out.finish(&a.shape))
}

// ---------------------------------------------------------------------------------------------- dispatch

/// Instantiate `$body` with `$T` bound to the Rust type of a dtype.
macro_rules! with_dtype {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

macro_rules! with_int {
    ($d:expr, $T:ident => $body:expr, else $other:expr) => {
        match $d {
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            _ => $other,
        }
    };
}

fn unsupported(what: String) -> crate::error::KernelError {
    kerr!(Unsupported, "{what} is not supported by the interpreter")
}

pub(crate) fn unary(op: UnaryOp, a: &Tensor) -> Result<Tensor> {
    match a.dtype {
        DType::F32 => float_unary::<f32>(op, a),
        DType::BF16 => float_unary::<bf16>(op, a),
        DType::Bool if op == UnaryOp::Not => map1(a, |x: bool| !x),
        d => {
            with_int!(d, T => int_unary::<T>(op, a), else Err(unsupported(format!("{op:?} on {d}"))))
        }
    }
}

fn float_unary<T: FloatElem>(op: UnaryOp, a: &Tensor) -> Result<Tensor> {
    crate::ir::unary_f32!(
        op,
        f => unary_with::<T, _>(f, a),
        else Err(unsupported(format!("`{}` on {}", op.name(), T::DTYPE)))
    )
}

fn int_unary<T: HostElement + IntOps>(op: UnaryOp, a: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Neg => map1(a, |x: T| x.wneg()),
        UnaryOp::Abs => map1(a, |x: T| x.wabs()),
        UnaryOp::Not => map1(a, |x: T| x.not()),
        _ => Err(unsupported(format!("{op:?} on {}", T::DTYPE))),
    }
}

pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype != b.dtype {
        return Err(internal("binary operands of different dtypes"));
    }
    match a.dtype {
        DType::F32 => float_binary::<f32>(op, a, b),
        DType::BF16 => float_binary::<bf16>(op, a, b),
        DType::Bool => match op {
            BinaryOp::And => map2(a, b, |x: bool, y: bool| x & y),
            BinaryOp::Or => map2(a, b, |x: bool, y: bool| x | y),
            BinaryOp::Xor => map2(a, b, |x: bool, y: bool| x ^ y),
            _ => Err(unsupported(format!("{op:?} on bool"))),
        },
        d => with_int!(d, T => int_binary::<T>(op, a, b), else Err(internal("dtype"))),
    }
}

fn float_binary<T: FloatElem>(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::ir::binary_f32!(
        op,
        f => binary_with::<T, _>(f, a, b),
        else Err(unsupported(format!("`{}` on {}", op.name(), T::DTYPE)))
    )
}

fn int_binary<T: HostElement + IntOps>(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::ir::binary_int!(
        op, T,
        f => map2(a, b, f),
        else Err(unsupported(format!("`{}` on {}", op.name(), T::DTYPE)))
    )
}

/// Ordered float comparisons (false with a NaN), except `!=` (true with a NaN), like XLA.
pub(crate) fn compare(op: CmpOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype != b.dtype {
        return Err(internal("compared operands of different dtypes"));
    }
    fn cmp<T: HostElement + PartialOrd>(op: CmpOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        match op {
            CmpOp::Eq => map2(a, b, |x: T, y: T| x == y),
            CmpOp::Ne => map2(a, b, |x: T, y: T| x != y),
            CmpOp::Lt => map2(a, b, |x: T, y: T| x < y),
            CmpOp::Le => map2(a, b, |x: T, y: T| x <= y),
            CmpOp::Gt => map2(a, b, |x: T, y: T| x > y),
            CmpOp::Ge => map2(a, b, |x: T, y: T| x >= y),
        }
    }
    match a.dtype {
        // bf16 → f32 is exact, so comparing in f32 is comparing the bf16 values.
        DType::BF16 => cmp::<f32>(op, &cast(a, DType::F32)?, &cast(b, DType::F32)?),
        d => with_dtype!(d, T => cmp::<T>(op, a, b)),
    }
}

pub(crate) fn select(c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype != b.dtype || c.dtype != DType::Bool {
        return Err(internal("select operand types"));
    }
    with_dtype!(a.dtype, T => map3(c, a, b, |c: bool, x: T, y: T| if c { x } else { y }))
}

pub(crate) fn cast(a: &Tensor, to: DType) -> Result<Tensor> {
    let from = a.dtype;
    if from == to {
        return Ok(a.clone());
    }
    match (from, to) {
        (DType::F32, DType::BF16) => map1(a, bf16_from_f32),
        (DType::BF16, DType::F32) => map1(a, bf16_to_f32),
        _ => with_dtype!(from, F => cast_from::<F>(a, to)),
    }
}

fn cast_from<F: Convert>(a: &Tensor, to: DType) -> Result<Tensor> {
    let from = F::DTYPE;
    with_dtype!(to, T => {
        if from.is_float() && !to.is_float() {
            // float → int/bool: saturating, NaN → 0 (bool: x != 0, NaN → true)
            if to == DType::Bool {
                map1(a, |x: F| x.to_f64() != 0.0 || x.to_f64().is_nan())
            } else {
                map1(a, |x: F| T::from_f64_sat(x.to_f64()))
            }
        } else if to.is_float() {
            map1(a, |x: F| T::from_i64(x.to_i64()))
        } else {
            // int/bool → int/bool: sign- or zero-extend per the source, then wrap (bool: x != 0)
            map1(a, |x: F| T::from_i64(x.to_i64()))
        }
    })
}

//! Elementwise rules (unary, binary, compare, select, cast): one generic strided loop per arity, then a
//! small table per op family. Floats compute in f32; bf16 results are rounded on every op, like XLA.

mod elem;
mod out;
mod rows;

use super::plan::WordHalf;
use super::simd::multiversion;
use super::tensor::{bf16_from_f32, bf16_to_f32, internal, Rows, Tensor};
use crate::dtype::DType;
use crate::error::{kerr, Result};
use crate::ir::{BinaryOp, CmpOp, UnaryOp};
use crate::math::IntOps;
use crate::semantics::host::HostElement;
pub(crate) use elem::FloatElem;
use elem::{binary_with, unary_with, Convert};
use half::bf16;
use out::{narrowed, shared_broadcast, widened, Out};
pub(crate) use out::{RawDest, Sink};
use rows::zip3;
pub(crate) use rows::RowArg;

// ---------------------------------------------------------------------------------------------- loops

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
    sink: &Sink<'_>,
) -> Result<Tensor> {
    map1_rows(a, f, None, sink)
}

multiversion! {
/// [`map1`], with contiguous rows computed by `row` when given.
pub(crate) fn map1_rows[A: HostElement, R: HostElement](
    a: &Tensor,
    f: impl Fn(A) -> R,
    row: Row1<'_, A, R>,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    let ad = a.data::<A>()?;
    if a.shape.is_empty() {
        // A scalar (index arithmetic, loop counters): held inline, never sunk.
        return Ok(Tensor::scalar(f(*ad.get(a.offset).ok_or_else(|| internal("empty scalar"))?)));
    }
    if let Some(n) = shared_broadcast(&a.shape, &[&a.strides], sink) {
        return Ok(widened(map1_rows(&narrowed(a, &n), f, row, sink)?, &a.shape));
    }
    let mut out = Out::<R>::new(&a.shape, sink);
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
}

/// `f` over pairs of elements of same-shaped `a` and `b`.
pub(crate) fn map2<A: HostElement, B: HostElement, R: HostElement>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> R,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    map2_rows(a, b, f, None, sink)
}

multiversion! {
/// [`map2`], with contiguous rows (an operand may be broadcast) computed by `row` when given.
pub(crate) fn map2_rows[A: HostElement, B: HostElement, R: HostElement](
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> R,
    row: Row2<'_, A, B, R>,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    if a.shape != b.shape {
        return Err(internal("elementwise operands of different shapes"));
    }
    let (ad, bd) = (a.data::<A>()?, b.data::<B>()?);
    if a.shape.is_empty() {
        let (x, y) = (ad.get(a.offset), bd.get(b.offset));
        let (Some(&x), Some(&y)) = (x, y) else {
            return Err(internal("empty scalar"));
        };
        return Ok(Tensor::scalar(f(x, y)));
    }
    if let Some(n) = shared_broadcast(&a.shape, &[&a.strides, &b.strides], sink) {
        let (a2, b2) = (narrowed(a, &n), narrowed(b, &n));
        return Ok(widened(map2_rows(&a2, &b2, f, row, sink)?, &a.shape));
    }
    let mut out = Out::<R>::new(&a.shape, sink);
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
                (0, 0, 1) => {
                    // Both broadcast along the row (an iota over rows plus a scalar): one value.
                    let v = f(ad[oa], bd[ob]);
                    for d in out.row(od, len).iter_mut() {
                        d.write(v);
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
}

multiversion! {
/// `f` over triples of elements of same-shaped `a`, `b`, `c`.
pub(crate) fn map3[A: HostElement, B: HostElement, C: HostElement, R: HostElement](
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl Fn(A, B, C) -> R,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    if a.shape != b.shape || a.shape != c.shape {
        return Err(internal("elementwise operands of different shapes"));
    }
    let (ad, bd, cd) = (a.data::<A>()?, b.data::<B>()?, c.data::<C>()?);
    if a.shape.is_empty() {
        let (x, y, z) = (ad.get(a.offset), bd.get(b.offset), cd.get(c.offset));
        let (Some(&x), Some(&y), Some(&z)) = (x, y, z) else {
            return Err(internal("empty scalar"));
        };
        return Ok(Tensor::scalar(f(x, y, z)));
    }
    if let Some(n) = shared_broadcast(&a.shape, &[&a.strides, &b.strides, &c.strides], sink) {
        let (a2, b2, c2) = (narrowed(a, &n), narrowed(b, &n), narrowed(c, &n));
        return Ok(widened(map3(&a2, &b2, &c2, f, sink)?, &a.shape));
    }
    let mut out = Out::<R>::new(&a.shape, sink);
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
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::F8E4M3FN => {
                type $T = $crate::dtype::f8e4m3fn;
                $body
            }
            DType::F8E5M2 => {
                type $T = $crate::dtype::f8e5m2;
                $body
            }
            DType::I4 => {
                type $T = $crate::dtype::i4;
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

pub(crate) fn unary(op: UnaryOp, a: &Tensor, sink: &Sink<'_>) -> Result<Tensor> {
    match a.dtype {
        DType::F32 => float_unary::<f32>(op, a, sink),
        DType::BF16 => float_unary::<bf16>(op, a, sink),
        DType::Bool if op == UnaryOp::Not => map1(a, |x: bool| !x, sink),
        d => {
            with_int!(d, T => int_unary::<T>(op, a, sink), else Err(unsupported(format!("{op:?} on {d}"))))
        }
    }
}

fn float_unary<T: FloatElem>(op: UnaryOp, a: &Tensor, sink: &Sink<'_>) -> Result<Tensor> {
    super::ops::unary_f32!(
        op,
        f => unary_with::<T, _>(f, a, sink),
        else Err(unsupported(format!("`{}` on {}", op.name(), T::DTYPE)))
    )
}

fn int_unary<T: HostElement + IntOps>(op: UnaryOp, a: &Tensor, sink: &Sink<'_>) -> Result<Tensor> {
    match op {
        UnaryOp::Neg => map1(a, |x: T| x.wneg(), sink),
        UnaryOp::Abs => map1(a, |x: T| x.wabs(), sink),
        UnaryOp::Not => map1(a, |x: T| x.not(), sink),
        _ => Err(unsupported(format!("{op:?} on {}", T::DTYPE))),
    }
}

pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, sink: &Sink<'_>) -> Result<Tensor> {
    if a.dtype != b.dtype {
        return Err(internal("binary operands of different dtypes"));
    }
    match a.dtype {
        DType::F32 => float_binary::<f32>(op, a, b, sink),
        DType::BF16 => float_binary::<bf16>(op, a, b, sink),
        DType::Bool => match op {
            BinaryOp::And => map2(a, b, |x: bool, y: bool| x & y, sink),
            BinaryOp::Or => map2(a, b, |x: bool, y: bool| x | y, sink),
            BinaryOp::Xor => map2(a, b, |x: bool, y: bool| x ^ y, sink),
            _ => Err(unsupported(format!("{op:?} on bool"))),
        },
        d => with_int!(d, T => int_binary::<T>(op, a, b, sink), else Err(internal("dtype"))),
    }
}

fn float_binary<T: FloatElem>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    super::ops::binary_f32!(
        op,
        f => binary_with::<T, _>(f, a, b, sink),
        else Err(unsupported(format!("`{}` on {}", op.name(), T::DTYPE)))
    )
}

fn int_binary<T: HostElement + IntOps>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    sink: &Sink<'_>,
) -> Result<Tensor> {
    super::ops::binary_int!(
        op, T,
        f => map2(a, b, f, sink),
        else Err(unsupported(format!("`{}` on {}", op.name(), T::DTYPE)))
    )
}

/// Ordered float comparisons (false with a NaN), except `!=` (true with a NaN), like XLA.
pub(crate) fn compare(op: CmpOp, a: &Tensor, b: &Tensor, sink: &Sink<'_>) -> Result<Tensor> {
    if a.dtype != b.dtype {
        return Err(internal("compared operands of different dtypes"));
    }
    fn cmp<T: HostElement + PartialOrd>(
        op: CmpOp,
        a: &Tensor,
        b: &Tensor,
        sink: &Sink<'_>,
    ) -> Result<Tensor> {
        match op {
            CmpOp::Eq => map2(a, b, |x: T, y: T| x == y, sink),
            CmpOp::Ne => map2(a, b, |x: T, y: T| x != y, sink),
            CmpOp::Lt => map2(a, b, |x: T, y: T| x < y, sink),
            CmpOp::Le => map2(a, b, |x: T, y: T| x <= y, sink),
            CmpOp::Gt => map2(a, b, |x: T, y: T| x > y, sink),
            CmpOp::Ge => map2(a, b, |x: T, y: T| x >= y, sink),
        }
    }
    match a.dtype {
        // bf16 → f32 is exact, so comparing in f32 is comparing the bf16 values.
        DType::BF16 => cmp::<f32>(op, &cast(a, DType::F32)?, &cast(b, DType::F32)?, sink),
        d => with_dtype!(d, T => cmp::<T>(op, a, b, sink)),
    }
}

pub(crate) fn select(c: &Tensor, a: &Tensor, b: &Tensor, sink: &Sink<'_>) -> Result<Tensor> {
    if a.dtype != b.dtype || c.dtype != DType::Bool {
        return Err(internal("select operand types"));
    }
    with_dtype!(a.dtype, T => map3(c, a, b, |c: bool, x: T, y: T| if c { x } else { y }, sink))
}

pub(crate) fn cast(a: &Tensor, to: DType) -> Result<Tensor> {
    cast_to(a, to, &Sink::fresh())
}

/// `cast<bf16>(bitcast<f32>(half(w)))` of u32 words `w` in one pass (the plan's `word_half`): the
/// f32 bits the `shl`/`and` gives, rounded by the cast's own `bf16_from_f32`.
pub(crate) fn word_half_to_bf16(w: &Tensor, half: WordHalf) -> Result<Tensor> {
    map1(w, |x: u32| half.to_bf16(x), &Sink::fresh())
}

pub(crate) fn cast_to(a: &Tensor, to: DType, sink: &Sink<'_>) -> Result<Tensor> {
    let from = a.dtype;
    if from == to {
        return Ok(a.clone());
    }
    match (from, to) {
        (DType::F32, DType::BF16) => map1(a, bf16_from_f32, sink),
        (DType::BF16, DType::F32) => map1(a, bf16_to_f32, sink),
        _ => with_dtype!(from, F => cast_from::<F>(a, to, sink)),
    }
}

fn cast_from<F: Convert>(a: &Tensor, to: DType, sink: &Sink<'_>) -> Result<Tensor> {
    let from = F::DTYPE;
    with_dtype!(to, T => {
        if from.is_float() && !to.is_float() {
            // float → int/bool: saturating, NaN → 0 (bool: x != 0, NaN → true)
            if to == DType::Bool {
                map1(a, |x: F| x.to_f64() != 0.0 || x.to_f64().is_nan(), sink)
            } else {
                map1(a, |x: F| T::from_f64_sat(x.to_f64()), sink)
            }
        } else if from.is_float() && to.is_float() {
            // float → float: exact in f64, rounded once (f32/bf16 sources are f32 values, so the
            // f64 → f32 → bf16 path of bf16's `from_f64_sat` rounds once too)
            map1(a, |x: F| T::from_f64_sat(x.to_f64()), sink)
        } else if to.is_float() {
            map1(a, |x: F| T::from_i64(x.to_i64()), sink)
        } else {
            // int/bool → int/bool: sign- or zero-extend per the source, then wrap (bool: x != 0)
            map1(a, |x: F| T::from_i64(x.to_i64()), sink)
        }
    })
}

#[cfg(test)]
mod tests;

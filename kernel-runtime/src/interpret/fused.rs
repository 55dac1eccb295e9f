//! Fused elementwise chains: a run of float unary/binary/cast ops where each result feeds only the next
//! op (`exp(x - m)`, `x * r * w → bf16`) is evaluated in one pass over cache-sized chunks instead of one
//! pass and one block-sized temporary per op. Each op still rounds its result to its own dtype, so the
//! values are exactly those of the unfused ops.

#[cfg(target_arch = "x86_64")]
mod narrow;
mod rows;

use super::elementwise::RawDest;
use super::simd::multiversion;
use super::tensor::{bf16_from_f32, bf16_to_f32, internal, take_vec, Buf, Tensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{BinaryOp, ReduceKind, UnaryOp};
use crate::math::{self, Pre};
use half::bf16;

/// One link of a chain, applied to the running value `v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Link {
    /// `v = op(v)`, rounded to `dtype`.
    Unary(UnaryOp, DType),
    /// `v = op(v, ext)` or `op(ext, v)` (`v_is_lhs` false), rounded to `dtype`; `ext` is the next
    /// external operand.
    Binary(BinaryOp, bool, DType),
    /// `v = cast(v)` between f32 and bf16.
    Cast(DType),
}

/// Whether a link is supported: ops with an f32 meaning (the op table's float operand classes).
pub(crate) fn supported_unary(u: UnaryOp) -> bool {
    u.operands().has_float()
}
pub(crate) fn supported_binary(b: BinaryOp) -> bool {
    b.operands().has_float()
}

const CHUNK: usize = 1024;

thread_local! {
    /// Working chunks of [`chain_impl`], kept per thread (taken while a chain runs).
    static SCRATCH: std::cell::Cell<Option<Box<[[f32; CHUNK]; 3]>>> =
        const { std::cell::Cell::new(None) };
}

// An operand chunk: a contiguous f32 slice (maybe a gathered copy) or a broadcast scalar.
use crate::math::Operand as Src;

#[inline(always)]
fn round(v: &mut [f32], d: DType) {
    if d == DType::BF16 {
        for x in v {
            *x = bf16_to_f32(bf16_from_f32(*x));
        }
    }
}

/// `x op y`, applied on the way into a leading unary function, for the ops a [`Pre`] covers.
fn pre_of(op: BinaryOp, y: f32) -> Option<Pre> {
    match op {
        BinaryOp::Add => Some(Pre::Add(y)),
        BinaryOp::Sub => Some(Pre::Sub(y)),
        BinaryOp::Mul => Some(Pre::Mul(y)),
        BinaryOp::Div => Some(Pre::Div(y)),
        _ => None,
    }
}

#[inline(always)]
fn unary(u: UnaryOp, v: &mut [f32]) {
    super::ops::unary_f32!(u, f => f.run(v), else {})
}

#[inline(always)]
fn zip<F: math::BinaryF32>(v: &mut [f32], e: Src<'_>, lhs: bool, f: F) {
    if F::VECTOR {
        return f.zip_in_place(v, e, lhs);
    }
    let f = |x: f32, y: f32| f.scalar(x, y);
    match (e, lhs) {
        (Src::Slice(s), true) => {
            for (x, &y) in v.iter_mut().zip(s) {
                *x = f(*x, y);
            }
        }
        (Src::Slice(s), false) => {
            for (x, &y) in v.iter_mut().zip(s) {
                *x = f(y, *x);
            }
        }
        (Src::Scalar(y), true) => {
            for x in v.iter_mut() {
                *x = f(*x, y);
            }
        }
        (Src::Scalar(y), false) => {
            for x in v.iter_mut() {
                *x = f(y, *x);
            }
        }
    }
}

/// `v = a op b` with both operands read from sources.
#[inline(always)]
fn binary_from(op: BinaryOp, v: &mut [f32], a: Src<'_>, b: Src<'_>) {
    #[inline(always)]
    fn zip2<F: math::BinaryF32>(v: &mut [f32], a: Src<'_>, b: Src<'_>, f: F) {
        if F::VECTOR {
            // SAFETY: f32 and MaybeUninit<f32> have one layout; only f32 values are written.
            let dst = unsafe { &mut *(v as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
            return f.zip_into(dst, a, b);
        }
        let f = |x: f32, y: f32| f.scalar(x, y);
        match (a, b) {
            (Src::Slice(x), Src::Slice(y)) => {
                for ((o, &x), &y) in v.iter_mut().zip(x).zip(y) {
                    *o = f(x, y);
                }
            }
            (Src::Slice(x), Src::Scalar(y)) => {
                for (o, &x) in v.iter_mut().zip(x) {
                    *o = f(x, y);
                }
            }
            (Src::Scalar(x), Src::Slice(y)) => {
                for (o, &y) in v.iter_mut().zip(y) {
                    *o = f(x, y);
                }
            }
            (Src::Scalar(x), Src::Scalar(y)) => v.fill(f(x, y)),
        }
    }
    super::ops::binary_f32!(op, f => zip2(v, a, b, f), else {})
}

#[inline(always)]
fn binary(b: BinaryOp, v: &mut [f32], e: Src<'_>, lhs: bool) {
    super::ops::binary_f32!(b, f => zip(v, e, lhs, f), else {})
}

/// The chain's leading links that one vector pass can do: a vector function of the op table, maybe
/// after `v op s` with the first external operand (if it turns out to be a broadcast value), in f32.
fn leading_vector(links: &[Link], exts: usize) -> Option<(Option<BinaryOp>, UnaryOp)> {
    fn vector<F: math::UnaryF32>(_: F) -> bool {
        F::VECTOR
    }
    let is_vector = |u: UnaryOp| super::ops::unary_f32!(u, f => vector(f), else false);
    let simple = |b: BinaryOp| {
        matches!(
            b,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
        )
    };
    match links {
        [Link::Binary(b, true, DType::F32), Link::Unary(u, DType::F32), ..]
            if exts > 0 && simple(*b) && is_vector(*u) =>
        {
            Some((Some(*b), *u))
        }
        [Link::Unary(u, DType::F32), ..] if is_vector(*u) => Some((None, *u)),
        _ => None,
    }
}

/// A reduction over the last axis folded into a chain: its kind and the reduction's result type.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Epilogue {
    pub kind: ReduceKind,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

/// What a chain produces: its value (unless only the reduction needs it, or it went to `dest`) and the
/// epilogue's reduction.
pub(crate) type ChainResult = (Option<Tensor>, Option<Tensor>);

multiversion! {
/// Evaluate `first` (the chain's input, already a tensor) through `links`, taking external operands from
/// `exts` in order. The value has `out_dtype`; it is written to `dest` when given, to a fresh tensor if
/// `store`, and otherwise only fed to the epilogue's reduction (in `row_order`'s order, as an unfused
/// `reduce`, so the bits agree).
pub(crate) fn run_chain[](
    first: &Tensor,
    links: &[Link],
    exts: &[&Tensor],
    out_dtype: DType,
    dest: Option<&RawDest>,
    epi: Option<&Epilogue>,
    store: bool,
) -> Result<ChainResult> {
    chain_impl(first, links, exts, out_dtype, dest, epi, store)
}
}

use super::row_order::{comb_f32, RowAcc, MAX, MIN, SUM};

/// Typed read access to an operand: a float, or the i32 of a deferred `i32 → f32` cast (see
/// `plan::defer_widening_casts`), converted as the cast converts it (`as f32`, one rounding).
enum FData<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    I32(&'a [i32]),
}

fn fdata(t: &Tensor) -> Result<FData<'_>> {
    match t.dtype {
        DType::F32 => Ok(FData::F32(t.data::<f32>()?)),
        DType::BF16 => Ok(FData::BF16(t.data::<bf16>()?)),
        DType::I32 => Ok(FData::I32(t.data::<i32>()?)),
        _ => Err(internal("fused chain on a non-float operand")),
    }
}

/// The `n` elements of a row at `o` with stride `s` as an f32 source, gathering into `tmp` if needed.
#[inline(always)]
fn source<'a>(
    d: &'a FData<'_>,
    o: usize,
    s: usize,
    n: usize,
    tmp: &'a mut [f32; CHUNK],
) -> Src<'a> {
    match (d, s) {
        (FData::F32(x), 1) => Src::Slice(&x[o..o + n]),
        (FData::F32(x), 0) => Src::Scalar(x[o]),
        (FData::BF16(x), 1) => {
            for (t, &b) in tmp[..n].iter_mut().zip(&x[o..o + n]) {
                *t = bf16_to_f32(b);
            }
            Src::Slice(&tmp[..n])
        }
        (FData::BF16(x), 0) => Src::Scalar(bf16_to_f32(x[o])),
        (FData::F32(x), s) => {
            for (i, t) in tmp[..n].iter_mut().enumerate() {
                *t = x[o + i * s];
            }
            Src::Slice(&tmp[..n])
        }
        (FData::BF16(x), s) => {
            for (i, t) in tmp[..n].iter_mut().enumerate() {
                *t = bf16_to_f32(x[o + i * s]);
            }
            Src::Slice(&tmp[..n])
        }
        (FData::I32(x), 1) => {
            for (t, &v) in tmp[..n].iter_mut().zip(&x[o..o + n]) {
                *t = v as f32;
            }
            Src::Slice(&tmp[..n])
        }
        (FData::I32(x), 0) => Src::Scalar(x[o] as f32),
        (FData::I32(x), s) => {
            for (i, t) in tmp[..n].iter_mut().enumerate() {
                *t = x[o + i * s] as f32;
            }
            Src::Slice(&tmp[..n])
        }
    }
}

#[inline(always)]
fn chain_impl(
    first: &Tensor,
    links: &[Link],
    exts: &[&Tensor],
    out_dtype: DType,
    dest: Option<&RawDest>,
    epi: Option<&Epilogue>,
    store: bool,
) -> Result<ChainResult> {
    let shape = first.shape.clone();
    if exts.iter().any(|e| e.shape != shape) || !matches!(out_dtype, DType::F32 | DType::BF16) {
        return Err(internal("fused chain operands"));
    }
    let rank = shape.len();
    if epi.is_some() && (rank == 0 || shape[rank - 1] < 2) {
        return Err(internal("fused reduction over a trivial axis"));
    }
    let store = store || dest.is_some() || epi.is_none();
    let n: usize = shape.iter().product();
    let first_d = fdata(first)?;
    let ext_d: Vec<FData<'_>> = exts.iter().map(|t| fdata(t)).collect::<Result<_>>()?;
    // Output: the offered destination (an output block of the right type and shape) or a fresh buffer.
    let dest = dest.filter(|d| d.dtype == out_dtype && d.shape[..] == shape[..]);
    let (mut out_f32, mut out_bf16): (Vec<f32>, Vec<bf16>) = (Vec::new(), Vec::new());
    let (ptr, len, off, out_strides) = match dest {
        Some(d) => (d.ptr, d.len, d.off, d.strides.clone()),
        None if !store => (
            std::ptr::null_mut(),
            0,
            0,
            super::tensor::row_major_strides(&shape),
        ),
        None => {
            let strides = super::tensor::row_major_strides(&shape);
            let ptr = if out_dtype == DType::F32 {
                out_f32 = take_vec(n);
                out_f32.as_mut_ptr() as *mut u8
            } else {
                out_bf16 = take_vec(n);
                out_bf16.as_mut_ptr() as *mut u8
            };
            (ptr, n, 0, strides)
        }
    };
    let reach: usize = shape
        .iter()
        .zip(&out_strides)
        .map(|(a, s)| a.saturating_sub(1) * s)
        .sum();
    if store && n > 0 && off + reach >= len {
        return Err(internal("fused chain destination too small"));
    }
    // The epilogue's accumulators: one per row of the last axis (strides 0 along it keep rows intact).
    let mut red_strides = super::tensor::row_major_strides(&shape);
    if rank > 0 {
        let kept: Vec<usize> = (0..rank)
            .map(|d| if d + 1 == rank { 1 } else { shape[d] })
            .collect();
        red_strides = super::tensor::row_major_strides(&kept);
        red_strides[rank - 1] = 0;
    }
    let identity = match epi.map(|e| e.kind) {
        Some(ReduceKind::Max) => f32::NEG_INFINITY,
        Some(ReduceKind::Min) => f32::INFINITY,
        _ => 0.0,
    };
    let n_red = if rank > 0 {
        n / shape[rank - 1].max(1)
    } else {
        1
    };
    let mut red = if epi.is_some() {
        vec![identity; n_red]
    } else {
        Vec::new()
    };
    let mut strides: Vec<&[usize]> = vec![&first.strides];
    strides.extend(exts.iter().map(|e| e.strides.as_slice()));
    strides.push(&out_strides);
    let mut offsets: Vec<usize> = vec![first.offset];
    offsets.extend(exts.iter().map(|e| e.offset));
    offsets.push(off);
    if epi.is_some() {
        strides.push(&red_strides);
        offsets.push(0);
    }
    // The first external operand is the chain's input itself (same buffer and strides).
    let same_first = exts
        .first()
        .is_some_and(|e| Buf::same(&e.buf, &first.buf) && e.strides == first.strides);
    #[cfg(target_arch = "x86_64")]
    let sub_exp = !exts.is_empty()
        && links.len() >= 2
        && links[0] == Link::Binary(BinaryOp::Sub, true, DType::F32)
        && links[1] == Link::Unary(UnaryOp::Exp, DType::F32)
        && super::simd::avx2();
    let leading = leading_vector(links, exts.len());
    let mut rows = rows::RowsN::new(&shape, &strides, &offsets);
    // `exp(x - m)` (and its rows' sums) over rows a few lanes wide: many rows at a time.
    #[cfg(target_arch = "x86_64")]
    if sub_exp && links.len() == 2 && exts.len() == 1 && out_dtype == DType::F32 {
        let red = match epi.map(|e| e.kind) {
            None => Some(None),
            Some(ReduceKind::Sum) => Some(Some(&mut red[..])),
            Some(_) => None,
        };
        if let Some(red) = red {
            // SAFETY: `sub_exp` implies AVX2 and FMA; `ptr` is the destination the row loop would
            // write, checked above to hold every offset the rows reach.
            unsafe {
                narrow::try_pass(
                    &mut rows,
                    &offsets,
                    (&first_d, &ext_d[0]),
                    (ptr, store),
                    red,
                )
            };
        }
    }
    let inner = rows.inner;
    let inner_strides = rows.inner_strides.clone();
    let k = exts.len();
    // Per-thread working chunks, reused rather than zeroed on every call (each is written before read).
    let mut bufs = SCRATCH
        .with(|b| b.take())
        .unwrap_or_else(|| Box::new([[0f32; CHUNK]; 3]));
    let [v, tmp, tmp2] = &mut *bufs;
    while let Some(row) = rows.next_row() {
        let mut c0 = 0;
        let mut acc = RowAcc::new(identity);
        while c0 < inner {
            let c = CHUNK.min(inner - c0);
            let (o, s) = (row[k + 1] + c0 * inner_strides[k + 1], inner_strides[k + 1]);
            // A contiguous f32 store: the chunk is computed in the destination itself (no copy).
            let direct = store && s == 1 && out_dtype == DType::F32;
            let w: &mut [f32] = if direct {
                // SAFETY: `o..o + c` is below `off + reach < len` (checked above) in a buffer that is
                // exclusively ours (see the store below) and that no operand reads; every element is
                // written by the chain's first step before it is read.
                unsafe { std::slice::from_raw_parts_mut((ptr as *mut f32).add(o), c) }
            } else {
                &mut v[..c]
            };
            // The chain's input; a leading binary op reads it in place rather than from a copy.
            let s0 = inner_strides[0];
            let first_src = source(&first_d, row[0] + c0 * s0, s0, c, tmp);
            let mut e = 0;
            let mut start = 0;
            // `exp(x - m)` with a broadcast `m` (softmax): one pass reading `x`, and when the chain ends
            // there, its sum folded in the same pass (in the same order, see `row_order`).
            #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
            let mut folded = false;
            #[cfg(target_arch = "x86_64")]
            if sub_exp {
                let s1 = inner_strides[1];
                if let (Src::Slice(xs), Src::Scalar(m)) =
                    (first_src, source(&ext_d[0], row[1] + c0 * s1, s1, c, tmp2))
                {
                    let sum = (links.len() == 2 && epi.map(|e| e.kind) == Some(ReduceKind::Sum))
                        .then_some(math::LaneSum {
                            lanes: &mut acc.lanes,
                            rest: &mut acc.rest,
                        });
                    folded = sum.is_some();
                    // SAFETY: `sub_exp` implies the CPU has AVX2 and FMA (checked at run time).
                    unsafe { math::exp_run(&mut *w, math::ExpIn::SubScalar(xs, m), sum) };
                    (e, start) = (1, 2);
                }
            }
            // A leading vector function (after a binary op with a broadcast value) reads the chain's
            // input itself: one pass that overlaps the memory traffic with the arithmetic, instead
            // of a copying (or multiplying) pass and then a computing one.
            if let (0, Some((pre_op, u)), Src::Slice(xs)) = (start, leading, first_src) {
                let pre = match pre_op {
                    None => Some(Pre::Id),
                    Some(b) => {
                        let s1 = inner_strides[1];
                        match source(&ext_d[0], row[1] + c0 * s1, s1, c, tmp2) {
                            Src::Scalar(y) => pre_of(b, y),
                            Src::Slice(_) => None,
                        }
                    }
                };
                if let Some(pre) = pre {
                    super::ops::unary_f32!(u, f => f.map_pre(pre, xs, &mut *w), else {});
                    (e, start) = if pre_op.is_some() { (1, 2) } else { (0, 1) };
                }
            }
            match (links.first(), first_src) {
                _ if start > 0 => {}
                (Some(&Link::Binary(b, true, d)), first_src) if k > 0 => {
                    let s1 = inner_strides[1];
                    // `x * x`: the same elements need not be read (or widened) twice.
                    let ext = if same_first && row[1] == row[0] && s1 == s0 {
                        first_src
                    } else {
                        source(&ext_d[0], row[1] + c0 * s1, s1, c, tmp2)
                    };
                    binary_from(b, &mut *w, first_src, ext);
                    if !(links.len() == 1 && out_dtype == DType::BF16 && epi.is_none()) {
                        round(&mut *w, d);
                    }
                    e = 1;
                    start = 1;
                }
                (_, Src::Slice(s)) => w.copy_from_slice(s),
                (_, Src::Scalar(x)) => w.fill(x),
            }
            for (li, link) in links.iter().enumerate().skip(start) {
                // The store below rounds to bf16 itself, so the last link need not (rounding twice to
                // nearest-even bf16 gives the same bits as once).
                let rounds_at_store =
                    li + 1 == links.len() && out_dtype == DType::BF16 && epi.is_none();
                let rnd = |v: &mut [f32], d: DType| {
                    if !rounds_at_store {
                        round(v, d)
                    }
                };
                match *link {
                    Link::Unary(u, d) => {
                        unary(u, &mut *w);
                        rnd(&mut *w, d);
                    }
                    Link::Binary(b, lhs, d) => {
                        if e >= k {
                            return Err(internal("fused chain external operands"));
                        }
                        let s = inner_strides[1 + e];
                        let src = source(&ext_d[e], row[1 + e] + c0 * s, s, c, tmp);
                        binary(b, &mut *w, src, lhs);
                        rnd(&mut *w, d);
                        e += 1;
                    }
                    Link::Cast(d) => rnd(&mut *w, d),
                }
            }
            match epi.map(|e| e.kind) {
                _ if folded => {}
                Some(ReduceKind::Sum) => acc.fold_f32::<SUM>(w),
                Some(ReduceKind::Max) => acc.fold_f32::<MAX>(w),
                Some(ReduceKind::Min) => acc.fold_f32::<MIN>(w),
                None => {}
            }
            if !store {
                c0 += c;
                continue;
            }
            if direct {
                c0 += c;
                continue;
            }
            // Store the chunk.
            // SAFETY: every offset reached is below `off + reach < len` (checked above); rows of one
            // result never overlap; the destination is exclusively ours (fresh buffer or an owned
            // output block, see `Machine::sunk_op`).
            unsafe {
                if out_dtype == DType::F32 {
                    let p = ptr as *mut f32;
                    if s == 1 {
                        std::slice::from_raw_parts_mut(p.add(o), c).copy_from_slice(&v[..c]);
                    } else {
                        for (i, &x) in v[..c].iter().enumerate() {
                            p.add(o + i * s).write(x);
                        }
                    }
                } else {
                    let p = ptr as *mut bf16;
                    if s == 1 {
                        let dst = std::slice::from_raw_parts_mut(
                            p.add(o) as *mut std::mem::MaybeUninit<bf16>,
                            c,
                        );
                        for (d, &x) in dst.iter_mut().zip(&v[..c]) {
                            d.write(bf16_from_f32(x));
                        }
                    } else {
                        for (i, &x) in v[..c].iter().enumerate() {
                            p.add(o + i * s).write(bf16_from_f32(x));
                        }
                    }
                }
            }
            c0 += c;
        }
        if let Some(e) = epi {
            let o = row[k + 2];
            // The row's result joins the output's accumulator, as in the unfused `reduce`.
            red[o] = match e.kind {
                ReduceKind::Sum => comb_f32::<SUM>(red[o], acc.finish_f32::<SUM>()),
                ReduceKind::Max => comb_f32::<MAX>(red[o], acc.finish_f32::<MAX>()),
                ReduceKind::Min => comb_f32::<MIN>(red[o], acc.finish_f32::<MIN>()),
            };
        }
    }
    SCRATCH.with(|b| b.set(Some(bufs)));
    let reduced = match epi {
        Some(e) if e.shape.iter().product::<usize>() != n_red => {
            return Err(internal("fused reduction shape"))
        }
        Some(e) if e.dtype == DType::BF16 => Some(Tensor::from_vec(
            &e.shape,
            red.into_iter().map(bf16_from_f32).collect::<Vec<_>>(),
        )),
        Some(e) => Some(Tensor::from_vec(&e.shape, red)),
        None => None,
    };
    if dest.is_some() || !store {
        return Ok((None, reduced));
    }
    // SAFETY: the rows covered all `n` elements of the row-major result.
    let value = unsafe {
        if out_dtype == DType::F32 {
            out_f32.set_len(n);
            Tensor::from_vec(shape, out_f32)
        } else {
            out_bf16.set_len(n);
            Tensor::from_vec(shape, out_bf16)
        }
    };
    Ok((Some(value), reduced))
}

//! Windows of refs as refs: `tpu.memref_slice` (a [`RefView`] into its base: an offset and strides;
//! sizes static, or run-time `?` sizes given as i32 operands — Pallas's `pl.ds(start, traced_size)`)
//! and `tpu.memref_squeeze`; and what the DMA rules need of a window whose sizes may be known only at
//! run time: its [`extents`], its [`bytes`].
//!
//! Out of bounds, the check is recorded and the window placed at its base's origin with its run-time
//! sizes 0, so nothing past a buffer is touched while the failing step runs to its end. The checks run
//! dimension by dimension — a run-time size below one, then the window past its base — in the
//! interpreter's order, so the first fault is the interpreter's, in its words (`semantics::refs`).
//!
//! May depend on: `rewrite` (the [`Rewriter`], its types and check sites), the shared bounds check of
//! `rules`; nothing else of `mosaic_cpu`.

use super::rewrite::{
    bad, elem_bits, i32_array, memref_dims, operand, RefView, Rewriter, SiteKind, Val,
};
use super::rules::window_in_bounds;
use crate::error::Result;
use crate::semantics::dma::copy_bytes;
use melior::ir::operation::OperationRef;
use melior::ir::ValueLike;

/// An `index` copy of an integer value.
fn as_index(rw: &mut Rewriter<'_>, v: &Val) -> Val {
    let t = v.ty.text();
    if t == "index" {
        return v.clone();
    }
    let i = rw.fresh();
    rw.line(format!("{i} = arith.index_cast {} : {t} to index", v.name));
    Val::index(i)
}

/// `tpu.memref_slice %base[%starts...][%sizes...]`: i32 starts, one per base dim; sizes from the
/// result type, its `?` dims from the size operands in order.
pub(super) fn memref_slice(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let seg = i32_array(op, "operandSegmentSizes")?;
    let [1, n_starts, n_sizes] = seg[..] else {
        return Err(bad(op, format!("operand segments {seg:?}")));
    };
    let (n_starts, n_sizes) = (n_starts as usize, n_sizes as usize);
    let base = rw.view(operand(op, 0)?)?;
    if base.dynamic.iter().any(Option::is_some) {
        return Err(bad(op, "a window of a window with a run-time size"));
    }
    let starts: Vec<Val> = (1..1 + n_starts)
        .map(|i| rw.val(operand(op, i)?))
        .collect::<Result<_>>()?;
    let dims = op
        .result(0)
        .ok()
        .and_then(|r| memref_dims(r.r#type()))
        .ok_or_else(|| bad(op, "the result is not a ranked ref"))?;
    let rank = base.shape.len();
    let n_dynamic = dims.iter().filter(|d| d.is_none()).count();
    if starts.len() != rank
        || dims.len() != rank
        || n_dynamic != n_sizes
        || dims
            .iter()
            .zip(&base.shape)
            .any(|(s, n)| s.is_some_and(|s| s > *n))
    {
        return Err(bad(
            op,
            format!(
                "{} starts and a window of {dims:?} for a base of shape {:?}",
                starts.len(),
                base.shape
            ),
        ));
    }
    let at: Vec<Val> = starts.iter().map(|s| as_index(rw, s)).collect();
    let mut sizes_in = (1 + n_starts..1 + n_starts + n_sizes).map(|i| operand(op, i));
    // Static sizes (a run-time size's bound: the base's) and the run-time ones.
    let sizes: Vec<usize> = dims
        .iter()
        .zip(&base.shape)
        .map(|(d, n)| d.unwrap_or(*n))
        .collect();
    let mut dynamic = Vec::with_capacity(rank);
    for d in &dims {
        dynamic.push(match d {
            Some(_) => None,
            None => {
                let v = rw.val(sizes_in.next().ok_or_else(|| bad(op, "missing size"))??)?;
                Some(as_index(rw, &v))
            }
        });
    }
    let ok = if n_sizes == 0 {
        let site = rw.site(
            op,
            SiteKind::Slice {
                sizes: sizes.clone(),
                shape: base.shape.clone(),
            },
            base.ref_id,
        );
        let ok = window_in_bounds(rw, &at, &base.shape, &sizes, &vec![1; rank]);
        rw.if_else(&ok, |_| Ok(()), |rw| rw.record(site, &at))?;
        ok
    } else {
        dynamic_checks(rw, op, &base, &at, (&sizes, &dynamic))?
    };
    let terms: Vec<(String, usize)> = at
        .iter()
        .map(|s| s.name.clone())
        .zip(base.strides.iter().copied())
        .collect();
    let offset = rw.linear(&terms, Some(base.offset.clone()));
    let safe = rw.fresh();
    rw.line(format!(
        "{safe} = arith.select {ok}, {offset}, {} : index",
        base.offset
    ));
    let dynamic = if n_sizes == 0 {
        Vec::new()
    } else {
        let zero = rw.index(0);
        dynamic
            .into_iter()
            .map(|d| {
                d.map(|v| {
                    let s = rw.fresh();
                    rw.line(format!(
                        "{s} = arith.select {ok}, {}, {zero} : index",
                        v.name
                    ));
                    s
                })
            })
            .collect()
    };
    let view = RefView {
        offset: safe,
        shape: sizes,
        dynamic,
        ..base
    };
    rw.bind_view(
        op.result(0).map_err(|_| bad(op, "expected a result"))?,
        view,
    );
    Ok(())
}

/// The bounds checks of a window with run-time sizes, dimension by dimension (a size below one, then
/// the window past its base): `i1`, all passed.
fn dynamic_checks(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    base: &RefView,
    at: &[Val],
    (sizes, dynamic): (&[usize], &[Option<Val>]),
) -> Result<String> {
    let mut all = rw.constant("true", "i1");
    let zero = rw.index(0);
    for (d, start) in at.iter().enumerate() {
        let size = match &dynamic[d] {
            Some(v) => {
                let site = rw.site(op, SiteKind::SliceSize { dim: d }, base.ref_id);
                let one = rw.index(1);
                let small = rw.fresh();
                rw.line(format!(
                    "{small} = arith.cmpi slt, {}, {one} : index",
                    v.name
                ));
                rw.if_else(
                    &small,
                    |rw| rw.record(site, std::slice::from_ref(v)),
                    |_| Ok(()),
                )?;
                let big = rw.fresh();
                rw.line(format!("{big} = arith.cmpi sge, {}, {one} : index", v.name));
                let a = rw.fresh();
                rw.line(format!("{a} = arith.andi {all}, {big} : i1"));
                all = a;
                v.clone()
            }
            None => Val::index(rw.index(sizes[d])),
        };
        let site = rw.site(
            op,
            SiteKind::SliceDim {
                dim: d,
                shape: base.shape.clone(),
            },
            base.ref_id,
        );
        let ge = rw.fresh();
        rw.line(format!(
            "{ge} = arith.cmpi sge, {}, {zero} : index",
            start.name
        ));
        let end = rw.fresh();
        rw.line(format!(
            "{end} = arith.addi {}, {} : index",
            start.name, size.name
        ));
        let n = rw.index(base.shape[d]);
        let le = rw.fresh();
        rw.line(format!("{le} = arith.cmpi sle, {end}, {n} : index"));
        let inside = rw.fresh();
        rw.line(format!("{inside} = arith.andi {ge}, {le} : i1"));
        rw.if_else(
            &inside,
            |_| Ok(()),
            |rw| rw.record(site, &[start.clone(), size.clone()]),
        )?;
        let a = rw.fresh();
        rw.line(format!("{a} = arith.andi {all}, {inside} : i1"));
        all = a;
    }
    Ok(all)
}

/// `tpu.memref_squeeze`: the same window without (some of) its size-1 dims. A size-1 dim has only
/// index 0, so its stride never matters: which of several size-1 dims go does not change the view.
pub(super) fn memref_squeeze(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let base = rw.view(operand(op, 0)?)?;
    let want = op
        .result(0)
        .ok()
        .and_then(|r| memref_dims(r.r#type()))
        .ok_or_else(|| bad(op, "the result is not a ref"))?;
    let (mut shape, mut strides, mut dynamic) = (Vec::new(), Vec::new(), Vec::new());
    for (d, (&n, &s)) in base.shape.iter().zip(&base.strides).enumerate() {
        let run_time = base.dynamic.get(d).cloned().flatten();
        let here = want.get(shape.len()).copied();
        let keeps = match (&run_time, here) {
            (Some(_), Some(None)) => true,
            (None, Some(Some(w))) => w == n,
            _ => false,
        };
        if keeps {
            shape.push(n);
            strides.push(s);
            dynamic.push(run_time);
        } else if n != 1 || run_time.is_some() {
            break;
        }
    }
    if shape.len() != want.len() {
        return Err(bad(
            op,
            format!("{want:?} is not {:?} without size-1 dims", base.shape),
        ));
    }
    let dynamic = if dynamic.iter().any(Option::is_some) {
        dynamic
    } else {
        Vec::new()
    };
    let view = RefView {
        shape,
        strides,
        dynamic,
        ..base
    };
    rw.bind_view(
        op.result(0).map_err(|_| bad(op, "expected a result"))?,
        view,
    );
    Ok(())
}

/// The `index` extent of each dimension of `v` (its run-time size, or its static one).
pub(super) fn extents(rw: &mut Rewriter<'_>, v: &RefView) -> Vec<String> {
    (0..v.shape.len())
        .map(|d| match v.dynamic.get(d).cloned().flatten() {
            Some(s) => s,
            None => rw.index(v.shape[d]),
        })
        .collect()
}

/// Whether some dimension of `v` has a run-time size.
pub(super) fn is_dynamic(v: &RefView) -> bool {
    v.dynamic.iter().any(Option::is_some)
}

/// The bytes of window `v` (elements `elem`) as an `i32` value: the count both engines use
/// (`semantics::dma::copy_bytes`; a run-time window's computed when the kernel runs).
pub(super) fn bytes(
    rw: &mut Rewriter<'_>,
    op: OperationRef<'_, '_>,
    v: &RefView,
) -> Result<String> {
    let elem = v.elem();
    let bits = elem_bits(elem).ok_or_else(|| bad(op, format!("a copy of {elem} elements")))?;
    if !is_dynamic(v) {
        let bytes = copy_bytes(v.shape.iter().product(), bits);
        if bytes > i32::MAX as i64 {
            return Err(bad(
                op,
                format!("a copy of {bytes} bytes (past an i32 semaphore)"),
            ));
        }
        return Ok(rw.int(bytes, "i32"));
    }
    // Within the base, so within the static bound's bytes (checked above for a static window).
    let bound = copy_bytes(v.shape.iter().product(), bits);
    if bound > i32::MAX as i64 {
        return Err(bad(
            op,
            format!("a copy of up to {bound} bytes (past an i32 semaphore)"),
        ));
    }
    let ext = extents(rw, v);
    let mut n = rw.index(1);
    for e in ext {
        let m = rw.fresh();
        rw.line(format!("{m} = arith.muli {n}, {e} : index"));
        n = m;
    }
    let (b, seven, eight) = (rw.index(bits as usize), rw.index(7), rw.index(8));
    let (x, y, z) = (rw.fresh(), rw.fresh(), rw.fresh());
    rw.line(format!("{x} = arith.muli {n}, {b} : index"));
    rw.line(format!("{y} = arith.addi {x}, {seven} : index"));
    rw.line(format!("{z} = arith.divui {y}, {eight} : index"));
    let r = rw.fresh();
    rw.line(format!("{r} = arith.index_cast {z} : index to i32"));
    Ok(r)
}

//! Ref views and value bitcasts: `tpu.memref_reshape` (a [`RefView`] of the same elements in another
//! shape: the view must be contiguous, as Mosaic requires), `tpu.memref_bitcast` (a view whose elements
//! are bits of its ref's — [`Packed`]), and `tpu.bitcast` on values (the same packing over a value's
//! buffer). [`read`] and [`write`] are how every rule reaches one element of a view: loads, stores and
//! DMA go through them, so a view is a ref to each of those rules.
//!
//! A bitcast that changes the bit width packs consecutive rows of the second-to-last dimension into one
//! element, the lowest bits first (Pallas's rule, `crate::semantics::views`): element `(.., r, c)` of a
//! view narrower than its ref (ratio `q`) is bits `(r % q)·vb ..` of element `(.., r / q, c)`; of a
//! wider one, elements `(.., r·q + k, c)` of the ref at bits `k·rb`.
//!
//! May depend on: `rewrite` (the [`Rewriter`], its types); nothing else of `mosaic_cpu`.

use super::rewrite::{bad, elem_bits, row_major, Packed, RefView, Rewriter, Ty, Val};
use crate::error::Result;
use melior::ir::operation::{OperationLike, OperationRef};
use std::rc::Rc;

fn result_view_shape(rw: &Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<(Vec<usize>, String)> {
    match rw.result_ty(op, 0)? {
        Ty::Mem { shape, elem } => Ok((shape, elem)),
        Ty::Scalar(_) => Err(bad(op, "the result is not a ref")),
    }
}

/// Views of windows with run-time sizes are refused when the kernel is traced; here as a guard.
fn static_view(op: OperationRef<'_, '_>, v: &RefView) -> Result<()> {
    if v.dynamic.iter().any(Option::is_some) {
        return Err(bad(op, "a view of a window with a run-time size"));
    }
    Ok(())
}

/// `tpu.memref_reshape`: the same elements, row-major, in the result's shape. The view must be
/// contiguous (row-major strides); Mosaic refuses others ("Reshape on a non-contiguous memref").
pub(super) fn memref_reshape(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let v = rw.view(op.operand(0).map_err(|_| bad(op, "expected a ref"))?)?;
    static_view(op, &v)?;
    let (shape, _) = result_view_shape(rw, op)?;
    if v.strides != row_major(&v.shape)
        || shape.iter().product::<usize>() != v.shape.iter().product::<usize>()
    {
        return Err(bad(
            op,
            format!(
                "a reshape of a non-contiguous or differently sized view {:?} into {shape:?}",
                v.shape
            ),
        ));
    }
    let view = RefView {
        strides: row_major(&shape),
        shape,
        ..v
    };
    rw.bind_view(
        op.result(0).map_err(|_| bad(op, "expected a result"))?,
        view,
    );
    Ok(())
}

/// `tpu.memref_bitcast`: a view whose elements are bits of the (contiguous) ref's.
pub(super) fn memref_bitcast(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let v = rw.view(op.operand(0).map_err(|_| bad(op, "expected a ref"))?)?;
    static_view(op, &v)?;
    let (shape, elem) = result_view_shape(rw, op)?;
    let view = packed_view(rw, v, shape, elem).map_err(|e| bad(op, e))?;
    rw.bind_view(
        op.result(0).map_err(|_| bad(op, "expected a result"))?,
        view,
    );
    Ok(())
}

/// The view of `base`'s bits as `elem` elements of `shape`.
fn packed_view(
    rw: &mut Rewriter<'_>,
    base: RefView,
    shape: Vec<usize>,
    elem: String,
) -> std::result::Result<RefView, String> {
    let (rb, vb) = (elem_bits(base.elem()), elem_bits(&elem));
    let (Some(rb), Some(vb)) = (rb.map(|b| b as usize), vb.map(|b| b as usize)) else {
        return Err(format!("a bitcast of {} to {elem}", base.elem()));
    };
    let rank = shape.len();
    let ok_shape = rank == base.shape.len()
        && (rank >= 2 || rb == vb)
        && (0..rank).all(|d| {
            if rank >= 2 && d == rank - 2 {
                shape[d] * vb == base.shape[d] * rb
            } else {
                shape[d] == base.shape[d]
            }
        });
    if !ok_shape {
        return Err(format!("a bitcast of {:?} to {shape:?}", base.shape));
    }
    let root = base.root.clone();
    let ref_id = base.ref_id;
    let offset = rw.index(0);
    Ok(RefView {
        root,
        ref_id,
        offset,
        strides: row_major(&shape),
        packed: Some(Rc::new(Packed {
            base,
            shape: shape.clone(),
            elem,
            view_bits: vb,
            ref_bits: rb,
        })),
        shape,
        dynamic: Vec::new(),
    })
}

/// `tpu.bitcast` of a value: its buffer seen through a packed view, copied element by element.
pub(super) fn bitcast_value(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let ty = rw.result_ty(op, 0)?;
    let Ty::Mem { shape, elem } = ty.clone() else {
        return Err(bad(op, "the result is not a vector"));
    };
    let Ty::Mem { shape: sshape, .. } = src.ty.clone() else {
        return Err(bad(op, "the operand is not a vector"));
    };
    let offset = rw.index(0);
    let base = RefView {
        root: src.clone(),
        ref_id: None,
        offset,
        strides: row_major(&sshape),
        shape: sshape,
        packed: None,
        dynamic: Vec::new(),
    };
    let view = packed_view(rw, base, shape.clone(), elem).map_err(|e| bad(op, e))?;
    let out = Val {
        name: rw.alloc(&ty),
        ty,
    };
    let strides = row_major(&shape);
    rw.nest(&shape, |rw, ivs| {
        let terms: Vec<(String, usize)> =
            ivs.iter().cloned().zip(strides.iter().copied()).collect();
        let at = rw.linear(&terms, None);
        let x = read(rw, &view, &at);
        rw.store(&x, &out, &at);
        Ok(())
    })?;
    rw.bind_result(op, 0, out)
}

/// Element `addr` (an `index`: `offset + Σ i·stride` of the view) of view `v`, as a scalar of its
/// element type.
pub(in crate::mosaic_cpu) fn read(rw: &mut Rewriter<'_>, v: &RefView, addr: &str) -> String {
    let Some(p) = v.packed.clone() else {
        return rw.load(&v.root, addr);
    };
    let (vb, rb) = (p.view_bits, p.ref_bits);
    let (lead, r, c) = split(rw, &p, addr);
    if vb < rb {
        let q = rb / vb;
        let (row, k) = div_rem(rw, &r, q);
        let at = base_addr(rw, &p.base, &lead, &row, &c);
        let w = read(rw, &p.base, &at);
        let wi = to_int(rw, &w, p.base.elem(), rb);
        let sh = shift_amount(rw, &k, vb, rb);
        let s = rw.fresh();
        rw.line(format!("{s} = arith.shrui {wi}, {sh} : i{rb}"));
        let t = rw.fresh();
        rw.line(format!("{t} = arith.trunci {s} : i{rb} to i{vb}"));
        from_int(rw, &t, &p.elem, vb)
    } else {
        let q = vb / rb;
        let mut acc = rw.int(0, &format!("i{vb}"));
        for k in 0..q {
            let row = scaled(rw, &r, q, k);
            let at = base_addr(rw, &p.base, &lead, &row, &c);
            let w = read(rw, &p.base, &at);
            let wi = to_int(rw, &w, p.base.elem(), rb);
            let z = if vb == rb {
                wi
            } else {
                let z = rw.fresh();
                rw.line(format!("{z} = arith.extui {wi} : i{rb} to i{vb}"));
                z
            };
            let sh = rw.int((k * rb) as i64, &format!("i{vb}"));
            let s = rw.fresh();
            rw.line(format!("{s} = arith.shli {z}, {sh} : i{vb}"));
            let o = rw.fresh();
            rw.line(format!("{o} = arith.ori {acc}, {s} : i{vb}"));
            acc = o;
        }
        from_int(rw, &acc, &p.elem, vb)
    }
}

/// Write `x` (a scalar of `v`'s element type) into element `addr` of view `v`.
pub(in crate::mosaic_cpu) fn write(rw: &mut Rewriter<'_>, v: &RefView, addr: &str, x: &str) {
    let Some(p) = v.packed.clone() else {
        rw.store(x, &v.root, addr);
        return;
    };
    let (vb, rb) = (p.view_bits, p.ref_bits);
    let (lead, r, c) = split(rw, &p, addr);
    let xi = to_int(rw, x, &p.elem, vb);
    if vb < rb {
        let q = rb / vb;
        let (row, k) = div_rem(rw, &r, q);
        let at = base_addr(rw, &p.base, &lead, &row, &c);
        let old = read(rw, &p.base, &at);
        let oi = to_int(rw, &old, p.base.elem(), rb);
        let sh = shift_amount(rw, &k, vb, rb);
        let ones = rw.int((1i64 << vb) - 1, &format!("i{rb}"));
        let m = rw.fresh();
        rw.line(format!("{m} = arith.shli {ones}, {sh} : i{rb}"));
        let all = rw.int(-1, &format!("i{rb}"));
        let keep = rw.fresh();
        rw.line(format!("{keep} = arith.xori {m}, {all} : i{rb}"));
        let kept = rw.fresh();
        rw.line(format!("{kept} = arith.andi {oi}, {keep} : i{rb}"));
        let z = rw.fresh();
        rw.line(format!("{z} = arith.extui {xi} : i{vb} to i{rb}"));
        let s = rw.fresh();
        rw.line(format!("{s} = arith.shli {z}, {sh} : i{rb}"));
        let new = rw.fresh();
        rw.line(format!("{new} = arith.ori {kept}, {s} : i{rb}"));
        let w = from_int(rw, &new, p.base.elem(), rb);
        write(rw, &p.base, &at, &w);
    } else {
        let q = vb / rb;
        for k in 0..q {
            let row = scaled(rw, &r, q, k);
            let at = base_addr(rw, &p.base, &lead, &row, &c);
            let part = if vb == rb {
                xi.clone()
            } else {
                let sh = rw.int((k * rb) as i64, &format!("i{vb}"));
                let s = rw.fresh();
                rw.line(format!("{s} = arith.shrui {xi}, {sh} : i{vb}"));
                let t = rw.fresh();
                rw.line(format!("{t} = arith.trunci {s} : i{vb} to i{rb}"));
                t
            };
            let w = from_int(rw, &part, p.base.elem(), rb);
            write(rw, &p.base, &at, &w);
        }
    }
}

/// A view element's address split into (leading indices, row, lane) of the packed view's shape.
fn split(rw: &mut Rewriter<'_>, p: &Packed, addr: &str) -> (Vec<String>, String, String) {
    let rank = p.shape.len();
    let mut rest = addr.to_string();
    let mut idx = vec![String::new(); rank];
    for d in (0..rank).rev() {
        let (q, r) = div_rem(rw, &rest, p.shape[d]);
        idx[d] = r;
        rest = q;
    }
    let c = idx.pop().unwrap_or_default();
    let r = idx.pop().unwrap_or_else(|| rw.index(0));
    (idx, r, c)
}

fn div_rem(rw: &mut Rewriter<'_>, x: &str, n: usize) -> (String, String) {
    let k = rw.index(n);
    let (q, r) = (rw.fresh(), rw.fresh());
    rw.line(format!("{q} = arith.divui {x}, {k} : index"));
    rw.line(format!("{r} = arith.remui {x}, {k} : index"));
    (q, r)
}

/// `r·q + k` (an `index`).
fn scaled(rw: &mut Rewriter<'_>, r: &str, q: usize, k: usize) -> String {
    let kq = rw.index(k);
    rw.linear(&[(r.to_string(), q)], Some(kq))
}

/// The address in `base` of element (lead.., row, lane).
fn base_addr(
    rw: &mut Rewriter<'_>,
    base: &RefView,
    lead: &[String],
    row: &str,
    lane: &str,
) -> String {
    let mut terms: Vec<(String, usize)> = lead
        .iter()
        .cloned()
        .zip(base.strides.iter().copied())
        .collect();
    let rank = base.strides.len();
    if rank >= 2 {
        terms.push((row.to_string(), base.strides[rank - 2]));
    }
    if rank >= 1 {
        terms.push((lane.to_string(), base.strides[rank - 1]));
    }
    rw.linear(&terms, Some(base.offset.clone()))
}

/// `k · vb` as an `i{rb}` shift amount.
fn shift_amount(rw: &mut Rewriter<'_>, k: &str, vb: usize, rb: usize) -> String {
    let s = rw.linear(&[(k.to_string(), vb)], None);
    let c = rw.fresh();
    rw.line(format!("{c} = arith.index_cast {s} : index to i{rb}"));
    c
}

fn to_int(rw: &mut Rewriter<'_>, x: &str, elem: &str, bits: usize) -> String {
    if elem.starts_with('i') {
        return x.to_string();
    }
    let r = rw.fresh();
    rw.line(format!("{r} = arith.bitcast {x} : {elem} to i{bits}"));
    r
}

fn from_int(rw: &mut Rewriter<'_>, x: &str, elem: &str, bits: usize) -> String {
    if elem.starts_with('i') {
        return x.to_string();
    }
    let r = rw.fresh();
    rw.line(format!("{r} = arith.bitcast {x} : i{bits} to {elem}"));
    r
}

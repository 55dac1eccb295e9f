//! The `tpu` dialect's compute ops (not upstream) as loop nests or scalar code: `tpu.matmul` (with
//! [`DotDims`], its dimension numbers), `tpu.iota`, `tpu.transpose`, `tpu.assume_multiple` (its
//! promise checked at run time) and the profiler markers `tpu.trace_start`/`tpu.trace_stop`. Its
//! memory ops live elsewhere: `tpu.vector_store` in `load_store.rs`, windows, DMA and semaphores in
//! `dma.rs`, `tpu.region` in `scope.rs`; `tpu.logistic`, a function of the vector math, is an
//! element-wise op (`elementwise.rs`, `math.rs`).
//!
//! May depend on: the shared helpers of `rules.rs`, `rewrite` (the [`Rewriter`], its types and check
//! sites) and `scalar.rs`.

use super::{accumulator, bad, gather, mem, narrow, offset, result_buffer, scalar, widen};
use crate::error::{kerr, Result};
use crate::mosaic_cpu::rewrite::{
    attr, i32_array, i64_array, int_attr, is_float, row_major, Rewriter, SiteKind, Ty,
};
use crate::mosaic_cpu::scalar::scalar_op;
use melior::ir::operation::{OperationLike, OperationRef};

pub(super) fn iota(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let dims = i32_array(op, "dimensions")?;
    let out = result_buffer(rw, op)?;
    let (shape, elem) = mem(op, &out, "the result")?;
    let [d] = dims[..] else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: tpu.iota over dimensions {dims:?} (one dimension is supported)"
        ));
    };
    let d = usize::try_from(d)
        .ok()
        .filter(|d| *d < shape.len())
        .ok_or_else(|| {
            bad(
                op,
                format!("dimension {d} of a rank-{} result", shape.len()),
            )
        })?;
    if is_float(&elem) {
        return Err(bad(op, "a float iota"));
    }
    rw.nest(&shape, |rw, ivs| {
        let v = rw.fresh();
        rw.line(format!(
            "{v} = arith.index_cast {} : index to {elem}",
            ivs[d]
        ));
        let at = offset(rw, ivs, &shape);
        rw.store(&v, &out, &at);
        Ok(())
    })
}

pub(super) fn transpose(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [src] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let perm: Vec<usize> = i64_array(op, "permutation")?
        .into_iter()
        .map(|p| p as usize)
        .collect();
    let (sshape, _) = mem(op, src, "the source")?;
    let out = result_buffer(rw, op)?;
    let (shape, _) = mem(op, &out, "the result")?;
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..sshape.len()).collect::<Vec<_>>()
        || shape.len() != perm.len()
        || perm.iter().enumerate().any(|(d, p)| shape[d] != sshape[*p])
    {
        return Err(bad(
            op,
            format!("permutation {perm:?} does not map {sshape:?} to {shape:?}"),
        ));
    }
    let sstrides = row_major(&sshape);
    gather(rw, src, &out, &shape, |rw, ivs| {
        // Result dim d is source dim perm[d].
        let terms: Vec<(String, usize)> = ivs
            .iter()
            .enumerate()
            .map(|(d, iv)| (iv.clone(), sstrides[perm[d]]))
            .collect();
        rw.linear(&terms, None)
    })
}

/// `tpu.trace_start` / `tpu.trace_stop`: XProf region markers, nothing to compute.
pub(super) fn profiler_marker(_: &mut Rewriter<'_>, _: OperationRef<'_, '_>) -> Result<()> {
    Ok(())
}

pub(super) fn assume_multiple(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [x] = &operands[..] else {
        return Err(bad(op, "expected one operand"));
    };
    let Ty::Scalar(t) = &x.ty else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: tpu.assume_multiple on a vector"
        ));
    };
    let m = int_attr(op, "multiple")?;
    if m <= 0 {
        return Err(bad(op, format!("multiple {m}")));
    }
    // The hint is a promise the TPU compiler builds on: check it.
    let site = rw.site(op, SiteKind::AssumeMultiple(m), None);
    let c = rw.int(m, t);
    let rem = rw.fresh();
    rw.line(format!("{rem} = arith.remsi {}, {c} : {t}", x.name));
    let zero = rw.int(0, t);
    let off = rw.fresh();
    rw.line(format!("{off} = arith.cmpi ne, {rem}, {zero} : {t}"));
    rw.if_else(
        &off,
        |rw| rw.record(site, std::slice::from_ref(x)),
        |_| Ok(()),
    )?;
    rw.bind_result(op, 0, x.clone())
}

/// `#tpu.dot_dimension_numbers<[lhs contracting], [rhs contracting], [lhs non-contracting],
/// [rhs non-contracting], [output dim order: (operand, dim) pairs], [lhs batch], [rhs batch]>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DotDims {
    pub lhs_contracting: Vec<usize>,
    pub rhs_contracting: Vec<usize>,
    pub lhs_free: Vec<usize>,
    pub rhs_free: Vec<usize>,
    /// Each output dim: (0 = lhs / 1 = rhs, dim of that operand).
    pub output: Vec<(usize, usize)>,
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
}

impl DotDims {
    pub fn parse(text: &str) -> Option<DotDims> {
        let body = text
            .trim()
            .strip_prefix("#tpu.dot_dimension_numbers<")?
            .strip_suffix('>')?;
        let mut lists = Vec::new();
        let mut rest = body;
        while let Some(open) = rest.find('[') {
            let close = rest[open..].find(']')? + open;
            let items = rest[open + 1..close].trim();
            let list: Vec<usize> = if items.is_empty() {
                Vec::new()
            } else {
                items
                    .split(',')
                    .map(|x| x.trim().parse().ok())
                    .collect::<Option<_>>()?
            };
            lists.push(list);
            rest = &rest[close + 1..];
        }
        let [lc, rc, lf, rf, out, lb, rb] = <[Vec<usize>; 7]>::try_from(lists).ok()?;
        if out.len() % 2 != 0 {
            return None;
        }
        Some(DotDims {
            lhs_contracting: lc,
            rhs_contracting: rc,
            lhs_free: lf,
            rhs_free: rf,
            output: out.chunks(2).map(|p| (p[0], p[1])).collect(),
            lhs_batch: lb,
            rhs_batch: rb,
        })
    }

    /// The result shape for operands of shapes `lhs` and `rhs`, if the numbers are consistent.
    fn result_shape(&self, lhs: &[usize], rhs: &[usize]) -> Option<Vec<usize>> {
        let partition = |contracting: &[usize], free: &[usize], rank: usize| {
            let mut all: Vec<usize> = contracting.iter().chain(free).copied().collect();
            all.sort_unstable();
            all == (0..rank).collect::<Vec<_>>()
        };
        let ok = self.lhs_batch.is_empty()
            && self.rhs_batch.is_empty()
            && self.lhs_contracting.len() == self.rhs_contracting.len()
            && partition(&self.lhs_contracting, &self.lhs_free, lhs.len())
            && partition(&self.rhs_contracting, &self.rhs_free, rhs.len())
            && self
                .lhs_contracting
                .iter()
                .zip(&self.rhs_contracting)
                .all(|(l, r)| lhs[*l] == rhs[*r]);
        // The output lists every free dim of both operands exactly once.
        let mut listed: Vec<(usize, usize)> = self.output.clone();
        listed.sort_unstable();
        let mut free: Vec<(usize, usize)> = self
            .lhs_free
            .iter()
            .map(|d| (0, *d))
            .chain(self.rhs_free.iter().map(|d| (1, *d)))
            .collect();
        free.sort_unstable();
        (ok && listed == free).then(|| {
            self.output
                .iter()
                .map(|&(o, d)| if o == 0 { lhs[d] } else { rhs[d] })
                .collect()
        })
    }
}

pub(super) fn matmul(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let [lhs, rhs, acc] = &operands[..] else {
        return Err(bad(op, "expected lhs, rhs and acc"));
    };
    for flag in ["transpose_lhs", "transpose_rhs"] {
        if let Ok(a) = op.attribute(flag) {
            if a.to_string() != "false" {
                return Err(kerr!(
                    Unsupported,
                    "mosaic_cpu: tpu.matmul with `{flag}` (the dimension numbers say it)"
                ));
            }
        }
    }
    let dn_text = attr(op, "dimension_numbers")?.to_string();
    let dn = DotDims::parse(&dn_text)
        .ok_or_else(|| bad(op, format!("cannot read the dimension numbers `{dn_text}`")))?;
    let (ls, lelem) = mem(op, lhs, "lhs")?;
    let (rs, relem) = mem(op, rhs, "rhs")?;
    let (as_, aelem) = mem(op, acc, "acc")?;
    let shape = dn.result_shape(&ls, &rs).ok_or_else(|| {
        bad(
            op,
            format!("{dn_text} does not fit lhs {ls:?} and rhs {rs:?}"),
        )
    })?;
    if as_ != shape || is_float(&lelem) != is_float(&aelem) || is_float(&relem) != is_float(&aelem)
    {
        return Err(bad(
            op,
            format!("acc {as_:?} {aelem} does not fit the product {shape:?} of {lelem} × {relem}"),
        ));
    }
    let out = result_buffer(rw, op)?;
    if out.ty.shape() != Some(&shape[..]) || out.ty.elem() != aelem {
        return Err(bad(op, "the result type differs from the accumulator's"));
    }
    let sum_ty = accumulator(&aelem).to_string();
    let (mul, add) = if is_float(&aelem) {
        ("arith.mulf", "arith.addf")
    } else {
        ("arith.muli", "arith.addi")
    };
    let k_shape: Vec<usize> = dn.lhs_contracting.iter().map(|&d| ls[d]).collect();
    let (lstr, rstr) = (row_major(&ls), row_major(&rs));
    // Offset of an operand element: contracting dims from the k loop, free dims from the output.
    let place = |operand: usize,
                 contracting: &[usize],
                 rank: usize,
                 strides: &[usize],
                 oivs: &[String],
                 kivs: &[String]|
     -> Vec<(String, usize)> {
        (0..rank)
            .map(|d| {
                let iv = match contracting.iter().position(|c| *c == d) {
                    Some(p) => kivs[p].clone(),
                    None => {
                        let p = dn
                            .output
                            .iter()
                            .position(|o| *o == (operand, d))
                            .unwrap_or(0);
                        oivs[p].clone()
                    }
                };
                (iv, strides[d])
            })
            .collect()
    };
    rw.nest(&shape, |rw, oivs| {
        let at = offset(rw, oivs, &shape);
        let a0 = rw.load(acc, &at);
        let init = widen(rw, &a0, &aelem, &sum_ty);
        let r = rw.nest_acc(&k_shape, init, &sum_ty, &mut |rw, kivs, a| {
            let lt = place(0, &dn.lhs_contracting, ls.len(), &lstr, oivs, kivs);
            let rt = place(1, &dn.rhs_contracting, rs.len(), &rstr, oivs, kivs);
            let (lo, ro) = (rw.linear(&lt, None), rw.linear(&rt, None));
            let x = rw.load(lhs, &lo);
            let y = rw.load(rhs, &ro);
            let x = widen(rw, &x, &lelem, &sum_ty);
            let y = widen(rw, &y, &relem, &sum_ty);
            let p = scalar_op(
                rw,
                mul,
                &[scalar(x, &sum_ty), scalar(y, &sum_ty)],
                &sum_ty,
                "",
            )?;
            scalar_op(
                rw,
                add,
                &[scalar(a.to_string(), &sum_ty), scalar(p, &sum_ty)],
                &sum_ty,
                "",
            )
        })?;
        let r = narrow(rw, &r, &sum_ty, &aelem);
        rw.store(&r, &out, &at);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::DotDims;

    #[test]
    fn dimension_numbers_read_as_mosaic_prints_them() {
        let d =
            DotDims::parse("#tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>")
                .expect("parse");
        assert_eq!(d.lhs_contracting, vec![1]);
        assert_eq!(d.rhs_contracting, vec![0]);
        assert_eq!(d.output, vec![(0, 0), (1, 1)]);
        assert_eq!(d.result_shape(&[8, 16], &[16, 32]), Some(vec![8, 32]));
        // dot_nt: rhs contracted on its dim 1.
        let nt =
            DotDims::parse("#tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>")
                .expect("parse");
        assert_eq!(nt.result_shape(&[8, 16], &[32, 16]), Some(vec![8, 32]));
        assert_eq!(nt.result_shape(&[8, 16], &[16, 32]), None);
        assert!(DotDims::parse("#tpu.dot_dimension_numbers<[1], [0]>").is_none());
    }
}

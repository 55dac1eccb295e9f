//! The rewrite table: every op a Mosaic module may hold, and the upstream code it becomes. Vector values
//! are flat row-major buffers (see `rewrite`), so each vector or `tpu` op becomes a loop nest over
//! scalars; every attribute that decides what an op computes is read from the emitted op.
//!
//! This file holds the table ([`rule`]: op name → rule), the helpers the rules share (operand and
//! result buffers, widening to the accumulator type) and the structural ops (`scf.*`, `func.return`:
//! kept). The rules live by op family: `rules/elementwise.rs` (`arith`/`math`, constants),
//! `rules/load_store.rs` (`vector.load`, `tpu.vector_store`), `rules/vector.rs` (n-D `vector` ops),
//! `rules/tpu.rs` (the `tpu` compute ops), `rules/values.rs` (`tpu` ops building values from values); `dma.rs`, `scope.rs` and `memref.rs` (siblings of this
//! file) hold the ref-window, DMA, semaphore, `run_scoped` and SMEM-element rules.
//!
//! May depend on: `rewrite` (the walk calls [`rule`]; the rules write through its [`Rewriter`]) and
//! the rule files the table names. The files under `rules/` may depend on this file's helpers,
//! `rewrite` and `scalar.rs`, not on each other.

mod elementwise;
mod load_store;
mod tpu;
mod values;
mod vector;

pub(super) use load_store::{not_in_hbm, window_in_bounds};

use super::rewrite::{bad, is_float, row_major, Rewriter, SiteKind, Ty, Val};
use crate::error::Result;
use melior::ir::operation::OperationRef;

pub(super) type Rule = fn(&mut Rewriter<'_>, OperationRef<'_, '_>) -> Result<()>;

/// Op name → rule. Ops of the element-wise dialects ([`ELEMENTWISE`]) need no entry.
const TABLE: &[(&str, Rule)] = &[
    // The tpu dialect (not upstream).
    ("tpu.matmul", tpu::matmul),
    ("tpu.vector_store", load_store::vector_store),
    ("tpu.strided_load", load_store::strided_load),
    ("tpu.strided_store", load_store::strided_store),
    ("tpu.iota", tpu::iota),
    ("tpu.transpose", tpu::transpose),
    ("tpu.concatenate", values::concatenate),
    ("tpu.dynamic_rotate", values::dynamic_rotate),
    ("tpu.reduce_index", values::reduce_index),
    ("tpu.assume_multiple", tpu::assume_multiple),
    ("tpu.bitcast", super::views::bitcast_value),
    // A function of the vector math, per element like `arith`/`math` ops (`scalar.rs`, `math.rs`).
    ("tpu.logistic", elementwise::elementwise),
    ("tpu.trace_start", tpu::profiler_marker),
    ("tpu.trace_stop", tpu::profiler_marker),
    // Ref windows, DMA and semaphores (`dma.rs`): windows are views of a kernel ref's buffer, copies
    // happen at their start, semaphores are i32 counters.
    ("tpu.memref_slice", super::window::memref_slice),
    ("tpu.memref_squeeze", super::window::memref_squeeze),
    ("tpu.memref_bitcast", super::views::memref_bitcast),
    ("tpu.memref_reshape", super::views::memref_reshape),
    ("tpu.enqueue_dma", super::dma::enqueue_dma),
    ("tpu.wait_dma", super::dma::wait_dma),
    ("tpu.sem_signal", super::dma::sem_signal),
    ("tpu.sem_wait", super::dma::sem_wait),
    ("tpu.sem_read", super::dma::sem_read),
    // `run_scoped` (`scope.rs`): the region written in place; its allocations fresh (zeroed) at every
    // entry, its semaphores checked back at zero at its end.
    ("tpu.region", super::scope::region),
    ("memref.alloca", super::scope::alloca),
    ("tpu.sem_alloc", super::scope::sem_alloc),
    ("tpu.yield", super::scope::yield_op),
    // n-D vector ops (upstream, but not lowered to LLVM for n-D vectors): loops over the buffers.
    ("vector.load", load_store::vector_load),
    ("vector.broadcast", vector::broadcast),
    ("vector.shape_cast", vector::shape_cast),
    ("vector.multi_reduction", vector::multi_reduction),
    (
        "vector.extract_strided_slice",
        vector::extract_strided_slice,
    ),
    // One element of a ref (SMEM): bounds-checked scalar loads and stores.
    ("memref.load", super::memref::load),
    ("memref.store", super::memref::store),
    // Constants: scalars kept, vector splats become filled buffers.
    ("arith.constant", elementwise::constant),
    // Structure: kept (types mapped, regions rewritten); `scf.for` checks its step first.
    ("scf.for", for_loop),
    ("scf.if", keep),
    ("scf.while", keep),
    ("scf.yield", keep),
    ("scf.condition", keep),
    ("func.return", keep),
];

/// Dialects whose ops are all element-wise (MLIR's `ElementwiseMappable`): kept on scalars, applied per
/// element on vectors, whatever the op — so ops added to the lowering later need no entry.
const ELEMENTWISE: &[&str] = &["arith.", "math."];

/// The rule for op `name`, if there is one.
pub(super) fn rule(name: &str) -> Option<Rule> {
    TABLE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, r)| *r)
        .or_else(|| {
            ELEMENTWISE
                .iter()
                .any(|d| name.starts_with(d))
                .then_some(elementwise::elementwise as Rule)
        })
}

fn mem(op: OperationRef<'_, '_>, v: &Val, what: &str) -> Result<(Vec<usize>, String)> {
    match &v.ty {
        Ty::Mem { shape, elem } => Ok((shape.clone(), elem.clone())),
        Ty::Scalar(t) => Err(bad(
            op,
            format!("{what} is a scalar ({t}), expected a vector"),
        )),
    }
}

fn scalar(name: String, ty: &str) -> Val {
    Val {
        name,
        ty: Ty::Scalar(ty.to_string()),
    }
}

/// A fresh buffer for result `i` of `op`, bound to it.
fn result_buffer(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<Val> {
    let ty = rw.result_ty(op, 0)?;
    if !matches!(ty, Ty::Mem { .. }) {
        return Err(bad(op, "expected a vector result"));
    }
    let name = rw.alloc(&ty);
    let v = Val { name, ty };
    rw.bind_result(op, 0, v.clone())?;
    Ok(v)
}

/// Row-major offset of `ivs` in a buffer of `shape`.
fn offset(rw: &mut Rewriter<'_>, ivs: &[String], shape: &[usize]) -> String {
    let terms: Vec<(String, usize)> = ivs.iter().cloned().zip(row_major(shape)).collect();
    rw.linear(&terms, None)
}

/// `out[ivs] = src[source(ivs)]` over `shape` (`out` row-major): the loop nest of every rule that
/// rearranges a value (broadcast, strided slice, transpose, rotate), given where each element comes from.
fn gather(
    rw: &mut Rewriter<'_>,
    src: &Val,
    out: &Val,
    shape: &[usize],
    source: impl FnOnce(&mut Rewriter<'_>, &[String]) -> String,
) -> Result<()> {
    rw.nest(shape, |rw, ivs| {
        let from = source(rw, ivs);
        let to = offset(rw, ivs, shape);
        let x = rw.load(src, &from);
        rw.store(&x, out, &to);
        Ok(())
    })
}

fn keep(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    rw.keep(op, &[])
}

/// Widen `x` of element type `from` to `to` (floats `extf`, integers `extsi`); `x` if they agree.
fn widen(rw: &mut Rewriter<'_>, x: &str, from: &str, to: &str) -> String {
    if from == to {
        return x.to_string();
    }
    if to == "f32" {
        // An 8-bit float (a `dot` operand): the dtype table's exact conversion.
        if let Ok(w) = super::math::float8_to_f32(rw, x, from) {
            return w;
        }
    }
    let op = if is_float(from) { "extf" } else { "extsi" };
    let r = rw.fresh();
    rw.line(format!("{r} = arith.{op} {x} : {from} to {to}"));
    r
}

fn narrow(rw: &mut Rewriter<'_>, x: &str, from: &str, to: &str) -> String {
    if from == to {
        return x.to_string();
    }
    if (from, to) == ("f32", "bf16") {
        // The interpreter's rounding (`scalar.rs`), NaNs included.
        return super::scalar::round_to_bf16(rw, x);
    }
    let op = if is_float(from) { "truncf" } else { "trunci" };
    let r = rw.fresh();
    rw.line(format!("{r} = arith.{op} {x} : {from} to {to}"));
    r
}

/// What float accumulations run in: f32 for narrower floats (bf16 sums are rounded once, at the end,
/// as the interpreter and the MXU do), the element type otherwise.
fn accumulator(elem: &str) -> &str {
    if is_float(elem) && elem != "f64" {
        "f32"
    } else {
        elem
    }
}

fn for_loop(rw: &mut Rewriter<'_>, op: OperationRef<'_, '_>) -> Result<()> {
    let operands = rw.operands(op)?;
    let Some(step) = operands.get(2) else {
        return Err(bad(op, "expected bounds and a step"));
    };
    let t = step.ty.text();
    // A step ≤ 0 never ends: report it and run the loop with step 1 instead.
    let site = rw.site(op, SiteKind::ForStep, None);
    let zero = rw.int(0, &t);
    let stuck = rw.fresh();
    rw.line(format!(
        "{stuck} = arith.cmpi sle, {}, {zero} : {t}",
        step.name
    ));
    rw.if_else(
        &stuck,
        |rw| rw.record(site, std::slice::from_ref(step)),
        |_| Ok(()),
    )?;
    let one = rw.int(1, &t);
    let safe = rw.fresh();
    rw.line(format!(
        "{safe} = arith.select {stuck}, {one}, {} : {t}",
        step.name
    ));
    rw.keep(op, &[(2, scalar(safe, &t))])
}

//! Composite ops (`expm1`, `sign`: rows of `kernel_ops::for_each_composite!`) expanded into table ops
//! for the launch's target — the composite table's one column. `build()` runs it right after tracing,
//! so the checks, the optimizer, the lowering and both CPU engines see only table ops: the engines
//! agree bit for bit with what runs on the TPU because they run the same expansion.
//!
//! A recipe may differ per [`Target`] (none does yet: Pallas emits the same ops on every generation
//! for these). The expansion keeps the numbering tracing would have given the same ops in place (its
//! values take the composite's id and the ones after it), so the IR, its printout and the emitted
//! Mosaic are those of the composition written out by hand.

use crate::dtype::{DType, Literal};
use crate::error::SourceLoc;
use crate::ir::{
    BinaryOp, CmpOp, CompositeOp, Func, Kernel, Op, OpKind, Region, Type, UnaryOp, ValueId,
};
use crate::target::Target;

/// Expand every composite op of the kernel body and its index maps for `k.target`.
pub fn run(k: &mut Kernel) {
    let target = k.target;
    expand_func(&mut k.body, target);
    for o in &mut k.operands {
        if let Some(b) = &mut o.block {
            expand_func(&mut b.index_map, target);
        }
    }
}

/// The ops a recipe emits, numbered from the composite's result id.
struct Recipe {
    ops: Vec<Op>,
    types: Vec<Type>,
    first: u32,
    ty: Type,
    loc: SourceLoc,
}

impl Recipe {
    fn push(&mut self, kind: OpKind, operands: Vec<ValueId>, ty: Type) -> ValueId {
        let id = ValueId(self.first + self.types.len() as u32);
        self.types.push(ty);
        self.ops.push(Op {
            kind,
            operands,
            results: vec![id],
            regions: vec![],
            loc: self.loc,
        });
        id
    }
    fn lit(&mut self, v: f64) -> ValueId {
        let ty = self.ty.clone();
        let l = Literal::from_f64(ty.dtype(), v);
        self.push(OpKind::Const(l), vec![], ty)
    }
    fn unary(&mut self, u: UnaryOp, a: ValueId) -> ValueId {
        self.push(OpKind::Unary(u), vec![a], self.ty.clone())
    }
    fn binary(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        self.push(OpKind::Binary(b), vec![x, y], self.ty.clone())
    }
    fn compare(&mut self, c: CmpOp, x: ValueId, y: ValueId) -> ValueId {
        let ty = self.ty.with_dtype(DType::Bool);
        self.push(OpKind::Compare(c), vec![x, y], ty)
    }
    fn select(&mut self, c: ValueId, x: ValueId, y: ValueId) -> ValueId {
        self.push(OpKind::Select, vec![c, x, y], self.ty.clone())
    }
}

/// The recipe of `op` on `x` for `target`: its ops, the last of which gives the result.
fn recipe(r: &mut Recipe, op: CompositeOp, x: ValueId, _target: Target) {
    match op {
        // Kahan's formulation on `exp` and `log` (libtpu cannot legalize `math.expm1`): with `u = e^x`,
        // `u == 1 ? x : u - 1 == -1 ? -1 : u == inf ? inf : (u - 1) * x / ln(u)`. The compares first,
        // outermost first, then the selects innermost first: the order in which jnp evaluates
        // `where(u == 1, x, where(u - 1 == -1, -1, where(u == inf, u, general)))`, as the Pallas twin
        // writes it. libtpu schedules about in the order given: the selects each right after its
        // compare cost one bundle more on v4 and v5p (activations: 305 vs 304 on v5p).
        CompositeOp::Expm1 => {
            let u = r.unary(UnaryOp::Exp, x);
            let one = r.lit(1.0);
            let um1 = r.binary(BinaryOp::Sub, u, one);
            let ln = r.unary(UnaryOp::Log, u);
            let ratio = r.binary(BinaryOp::Div, x, ln);
            let general = r.binary(BinaryOp::Mul, um1, ratio);
            let one = r.lit(1.0);
            let is_one = r.compare(CmpOp::Eq, u, one);
            let minus_one = r.lit(-1.0);
            let is_neg = r.compare(CmpOp::Eq, um1, minus_one);
            let inf = r.lit(f64::INFINITY);
            let is_inf = r.compare(CmpOp::Eq, u, inf);
            let at_inf = r.select(is_inf, u, general);
            let minus_one = r.lit(-1.0);
            let at_neg = r.select(is_neg, minus_one, at_inf);
            r.select(is_one, x, at_neg);
        }
        // `select(x > 0, 1, select(x < 0, -1, x))`, so `±0` and NaN give themselves (no `math.sign`:
        // nothing to ask the chip).
        CompositeOp::Sign => {
            let zero = r.lit(0.0);
            let pos = r.compare(CmpOp::Gt, x, zero);
            let zero = r.lit(0.0);
            let neg = r.compare(CmpOp::Lt, x, zero);
            let minus_one = r.lit(-1.0);
            let inner = r.select(neg, minus_one, x);
            let one = r.lit(1.0);
            r.select(pos, one, inner);
        }
    }
}

fn expand_func(f: &mut Func, target: Target) {
    // One composite at a time, first in program order, until none is left: each expansion renumbers
    // the values after it.
    while let Some(path) = find(&f.body) {
        let op = at(&mut f.body, &path).clone();
        let OpKind::Composite(c) = op.kind else {
            unreachable!("`find` returns composites")
        };
        let res = op.results[0];
        let mut r = Recipe {
            ops: Vec::new(),
            types: Vec::new(),
            first: res.0,
            ty: f.values[res.0 as usize].clone(),
            loc: op.loc,
        };
        recipe(&mut r, c, op.operands[0], target);
        let extra = r.types.len() as u32 - 1;
        // Values from the composite's result on move up by the intermediates' count; the recipe's last
        // value lands on the composite's (shifted) id, so its uses need no other change.
        shift(&mut f.body, res.0, extra);
        let last = r.types.pop().expect("a recipe emits ops");
        debug_assert_eq!(last, f.values[res.0 as usize]);
        f.values.splice(res.0 as usize..res.0 as usize, r.types);
        let (region, i) = region_of(&mut f.body, &path);
        region.ops.splice(i..=i, r.ops);
    }
}

/// The position of the first composite op: op indices through nested regions (op, region, op, ...).
fn find(r: &Region) -> Option<Vec<usize>> {
    for (i, op) in r.ops.iter().enumerate() {
        if matches!(op.kind, OpKind::Composite(_)) {
            return Some(vec![i]);
        }
        for (k, sub) in op.regions.iter().enumerate() {
            if let Some(mut p) = find(sub) {
                p.splice(0..0, [i, k]);
                return Some(p);
            }
        }
    }
    None
}

fn region_of<'r>(r: &'r mut Region, path: &[usize]) -> (&'r mut Region, usize) {
    match path {
        [i] => (r, *i),
        [i, k, rest @ ..] => region_of(&mut r.ops[*i].regions[*k], rest),
        _ => unreachable!("paths have an odd length"),
    }
}

fn at<'r>(r: &'r mut Region, path: &[usize]) -> &'r mut Op {
    let (region, i) = region_of(r, path);
    &mut region.ops[i]
}

/// Every value id `>= from` in `r` (region arguments, operands, results) plus `by`.
fn shift(r: &mut Region, from: u32, by: u32) {
    let bump = |v: &mut ValueId| {
        if v.0 >= from {
            v.0 += by;
        }
    };
    r.args.iter_mut().for_each(bump);
    for op in &mut r.ops {
        op.operands.iter_mut().for_each(bump);
        op.results.iter_mut().for_each(bump);
        for sub in &mut op.regions {
            shift(sub, from, by);
        }
    }
}

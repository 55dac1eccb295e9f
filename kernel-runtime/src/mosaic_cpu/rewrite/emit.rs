//! The [`Rewriter`]'s code-writing helpers that rules build on: constants, buffers (allocated where
//! they stand or hoisted to the function's entry), element loads and stores, index arithmetic
//! (`linear`), plain op lines, and structured control — loop nests over a shape (with or without a
//! carried value) and `scf.if`.
//!
//! May depend on: the [`Rewriter`]'s text and value helpers (`rewrite.rs`) and its types; nothing else.

use super::{Rewriter, Ty, Val};
use crate::error::Result;

/// The body of [`Rewriter::nest_acc`]: induction variables and carried value → next value.
pub(super) type AccBody<'b, 'f> =
    dyn FnMut(&mut Rewriter<'f>, &[String], &str) -> Result<String> + 'b;

impl<'f> Rewriter<'f> {
    // ---- constants, memory, index arithmetic ----

    pub fn index(&mut self, n: usize) -> String {
        let v = self.fresh();
        self.line(format!("{v} = arith.constant {n} : index"));
        v
    }

    /// `arith.constant <value> : ty` for a value attribute's text (`1.0 : f32`, `true`, `3 : i32`).
    pub fn constant(&mut self, value: &str, ty: &str) -> String {
        let v = self.fresh();
        self.line(format!(
            "{v} = \"arith.constant\"() {{value = {value}}} : () -> {ty}"
        ));
        v
    }

    pub fn int(&mut self, n: i64, ty: &str) -> String {
        self.constant(&format!("{n} : {ty}"), ty)
    }

    pub fn alloc(&mut self, ty: &Ty) -> String {
        let v = self.fresh();
        self.line(format!("{v} = memref.alloc() : {}", ty.text()));
        v
    }

    /// A buffer of type `ty` allocated once at the entry of the function being written (from the
    /// per-step arena, like [`Self::alloc`]): one buffer however often the code using it runs, so an
    /// allocation in a loop does not grow the arena per iteration.
    pub fn hoist_alloc(&mut self, ty: &Ty) -> String {
        let v = self.fresh();
        self.hoisted
            .push(format!("{v} = memref.alloc() : {}", ty.text()));
        v
    }

    pub fn load(&mut self, mem: &Val, idx: &str) -> String {
        let v = self.fresh();
        self.line(format!(
            "{v} = memref.load {}[{idx}] : {}",
            mem.name,
            mem.ty.text()
        ));
        v
    }

    pub fn store(&mut self, value: &str, mem: &Val, idx: &str) {
        self.line(format!(
            "memref.store {value}, {}[{idx}] : {}",
            mem.name,
            mem.ty.text()
        ));
    }

    /// `base + Σ index·stride` over `index` values (terms with stride 0 vanish).
    pub fn linear(&mut self, terms: &[(String, usize)], base: Option<String>) -> String {
        let mut acc = base;
        for (i, stride) in terms {
            if *stride == 0 {
                continue;
            }
            let term = if *stride == 1 {
                i.clone()
            } else {
                let s = self.index(*stride);
                let m = self.fresh();
                self.line(format!("{m} = arith.muli {i}, {s} : index"));
                m
            };
            acc = Some(match acc {
                None => term,
                Some(a) => {
                    let r = self.fresh();
                    self.line(format!("{r} = arith.addi {a}, {term} : index"));
                    r
                }
            });
        }
        match acc {
            Some(a) => a,
            None => self.index(0),
        }
    }

    /// A plain op line: `%r = "name"(operands) {attrs} : (types) -> type`.
    pub fn op1(&mut self, name: &str, operands: &[&Val], result: &str, attrs: &str) -> String {
        let r = self.fresh();
        let names = operands
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let types = operands
            .iter()
            .map(|v| v.ty.text())
            .collect::<Vec<_>>()
            .join(", ");
        self.line(format!(
            "{r} = \"{name}\"({names}){attrs} : ({types}) -> {result}"
        ));
        r
    }

    // ---- structured control ----

    /// Loops over `shape` (row-major, innermost last); `body` gets the `index` induction variables.
    pub fn nest(
        &mut self,
        shape: &[usize],
        body: impl FnOnce(&mut Self, &[String]) -> Result<()>,
    ) -> Result<()> {
        let mut ivs = Vec::with_capacity(shape.len());
        for &n in shape {
            let (c0, cn, c1) = (self.index(0), self.index(n), self.index(1));
            let iv = self.fresh();
            self.open(format!("scf.for {iv} = {c0} to {cn} step {c1} {{"));
            ivs.push(iv);
        }
        body(self, &ivs)?;
        for _ in shape {
            self.close("}");
        }
        Ok(())
    }

    /// Loops over extents given as `index` values (run-time sizes); `body` gets the induction
    /// variables.
    pub fn nest_dyn(
        &mut self,
        extents: &[String],
        body: impl FnOnce(&mut Self, &[String]) -> Result<()>,
    ) -> Result<()> {
        let mut ivs = Vec::with_capacity(extents.len());
        for n in extents {
            let (c0, c1) = (self.index(0), self.index(1));
            let iv = self.fresh();
            self.open(format!("scf.for {iv} = {c0} to {n} step {c1} {{"));
            ivs.push(iv);
        }
        body(self, &ivs)?;
        for _ in extents {
            self.close("}");
        }
        Ok(())
    }

    /// Loops over `shape` carrying one scalar of type `ty` from `init`; `body` gets the induction
    /// variables and the carried value and returns its next value. Returns the final value.
    pub fn nest_acc(
        &mut self,
        shape: &[usize],
        init: String,
        ty: &str,
        body: &mut AccBody<'_, 'f>,
    ) -> Result<String> {
        let mut ivs = Vec::with_capacity(shape.len());
        self.nest_acc_from(shape, init, ty, &mut ivs, body)
    }

    fn nest_acc_from(
        &mut self,
        shape: &[usize],
        acc: String,
        ty: &str,
        ivs: &mut Vec<String>,
        body: &mut AccBody<'_, 'f>,
    ) -> Result<String> {
        let Some((&n, rest)) = shape.split_first() else {
            return body(self, ivs, &acc);
        };
        let (c0, cn, c1) = (self.index(0), self.index(n), self.index(1));
        let (r, iv, a) = (self.fresh(), self.fresh(), self.fresh());
        self.open(format!(
            "{r} = scf.for {iv} = {c0} to {cn} step {c1} iter_args({a} = {acc}) -> ({ty}) {{"
        ));
        ivs.push(iv);
        let next = self.nest_acc_from(rest, a, ty, ivs, body)?;
        ivs.pop();
        self.line(format!("scf.yield {next} : {ty}"));
        self.close("}");
        Ok(r)
    }

    /// `scf.if cond { then } else { otherwise }` (no results).
    pub fn if_else(
        &mut self,
        cond: &str,
        then: impl FnOnce(&mut Self) -> Result<()>,
        otherwise: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        self.open(format!("scf.if {cond} {{"));
        then(self)?;
        self.close("} else {");
        self.indent += 1;
        otherwise(self)?;
        self.close("}");
        Ok(())
    }
}

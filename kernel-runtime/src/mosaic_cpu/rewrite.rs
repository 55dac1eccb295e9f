//! The walk over the emitted Mosaic module: every op is read through melior (name, operands, result
//! types, attributes, regions, location) and handed to its rule in [`super::rules`], which writes upstream
//! MLIR text. Values are renamed (`%tN`); vector values and refs become flat row-major buffers
//! (`memref<N x elem>`, a semaphore an `i32` counter), scalars stay scalars; a window of a ref
//! (`tpu.memref_slice`, `tpu.memref_squeeze`) is a [`RefView`] into its ref's buffer (a kernel
//! argument or a `run_scoped` allocation, see `scope.rs`).
//!
//! This file holds the [`Rewriter`] (the text it writes, the values it has bound) and the walk
//! (`block`, `keep`, `function`). Beside it: `rewrite/types.rs` (types, values, refs and memory
//! spaces, and the mapping from MLIR types), `rewrite/emit.rs` (constants, index arithmetic, loop
//! nests), `rewrite/sites.rs` (run-time check sites, source locations), `rewrite/attrs.rs` (an op's
//! name and attributes).
//!
//! May depend on: `rules.rs` (each op's rule), `scope.rs` (the scopes being written), melior and
//! mlir-sys; never on `program.rs`, `jit.rs` or `run.rs`, which build on it.

mod attrs;
mod emit;
mod sites;
mod types;

pub(super) use attrs::{attr, attrs_text, bad, i32_array, i64_array, int_attr, op_name, operand};
pub(super) use sites::{Files, Site, SiteKind, ERR_SLOTS};
pub(super) use types::{
    elem_bits, is_float, map_type, memref_dims, ref_space, row_major, Packed, RefId, RefView,
    Signature, Space, Ty, Val,
};

use super::rules;
use crate::error::{kerr, Result};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::r#type::{FunctionType, TypeLike};
use melior::ir::{BlockRef, RegionLike, ValueLike};
use std::collections::{BTreeSet, HashMap};

/// Writes one upstream module.
pub(super) struct Rewriter<'f> {
    out: String,
    indent: usize,
    next: u32,
    values: HashMap<usize, Val>,
    /// Ref windows (`tpu.memref_slice` / `tpu.memref_squeeze` results), by value key.
    views: HashMap<usize, RefView>,
    pub sites: Vec<Site>,
    /// The error buffer of the function being written.
    pub err: String,
    /// Refs with a name in errors (value key → which ref): the function's ref arguments and scoped
    /// allocations.
    pub refs: HashMap<usize, RefId>,
    /// Whether the function being written is an index map.
    pub index_map: bool,
    /// The `run_scoped` scopes (`tpu.region`s) being written, innermost last.
    pub scopes: Vec<super::scope::Scope>,
    /// Lines written at the entry of the function being written, before its body (see [`Self::hoist_alloc`]).
    hoisted: Vec<String>,
    /// Declarations of the external functions the module calls (the vector math's, `math.rs`).
    decls: BTreeSet<String>,
    pub files: &'f Files,
}

pub(super) fn key<'c>(v: impl ValueLike<'c>) -> usize {
    v.to_raw().ptr as usize
}

impl<'f> Rewriter<'f> {
    pub fn new(files: &'f Files) -> Self {
        Rewriter {
            out: String::new(),
            indent: 0,
            next: 0,
            values: HashMap::new(),
            views: HashMap::new(),
            sites: Vec::new(),
            err: "%err".into(),
            refs: HashMap::new(),
            index_map: false,
            scopes: Vec::new(),
            hoisted: Vec::new(),
            decls: BTreeSet::new(),
            files,
        }
    }

    /// The module's body (its external declarations, then the functions written) and check sites.
    pub fn finish(self) -> (String, Vec<Site>) {
        let decls: String = self.decls.iter().map(|d| format!("  {d}\n")).collect();
        (decls + &self.out, self.sites)
    }

    /// Declare an external function the module calls (once, however often it is called).
    pub fn declare(&mut self, decl: String) {
        self.decls.insert(decl);
    }

    // ---- text ----

    pub fn line(&mut self, s: impl AsRef<str>) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(s.as_ref());
        self.out.push('\n');
    }

    pub fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%t{}", self.next)
    }

    fn open(&mut self, s: impl AsRef<str>) {
        self.line(s);
        self.indent += 1;
    }

    fn close(&mut self, s: impl AsRef<str>) {
        self.indent = self.indent.saturating_sub(1);
        self.line(s);
    }

    // ---- values ----

    pub fn bind<'c>(&mut self, v: impl ValueLike<'c>, val: Val) {
        self.values.insert(key(v), val);
    }

    pub fn val<'c>(&self, v: impl ValueLike<'c>) -> Result<Val> {
        let k = key(v);
        if self.views.contains_key(&k) {
            return Err(kerr!(
                Unsupported,
                "mosaic_cpu: a window of a ref (`tpu.memref_slice`) is used by an op other than DMA and semaphore ops"
            ));
        }
        self.values.get(&k).cloned().ok_or_else(|| {
            kerr!(
                Lowering,
                "mosaic_cpu: a value is used before its definition"
            )
        })
    }

    pub fn bind_view<'c>(&mut self, v: impl ValueLike<'c>, view: RefView) {
        self.views.insert(key(v), view);
    }

    /// The ref window a memref value denotes: a `tpu.memref_slice` / `tpu.memref_squeeze` result, or
    /// a whole kernel ref.
    pub fn view<'c>(&mut self, v: impl ValueLike<'c> + Copy) -> Result<RefView> {
        let k = key(v);
        if let Some(view) = self.views.get(&k) {
            return Ok(view.clone());
        }
        if !v.r#type().is_mem_ref() {
            return Err(kerr!(
                Lowering,
                "mosaic_cpu: expected a ref, got a value of type {}",
                v.r#type()
            ));
        }
        let root = self.val(v)?;
        let shape = root.ty.shape().unwrap_or_default().to_vec();
        let offset = self.index(0);
        Ok(RefView {
            ref_id: self.refs.get(&k).copied(),
            offset,
            strides: row_major(&shape),
            shape,
            root,
            packed: None,
            dynamic: Vec::new(),
        })
    }

    pub fn operands(&self, op: OperationRef<'_, '_>) -> Result<Vec<Val>> {
        op.operands().map(|v| self.val(v)).collect()
    }

    pub fn result_ty(&self, op: OperationRef<'_, '_>, i: usize) -> Result<Ty> {
        let r = op
            .result(i)
            .map_err(|e| kerr!(Lowering, "mosaic_cpu: {}: {e}", op_name(op)))?;
        map_type(r.r#type())
    }

    pub fn bind_result(&mut self, op: OperationRef<'_, '_>, i: usize, val: Val) -> Result<()> {
        let r = op
            .result(i)
            .map_err(|e| kerr!(Lowering, "mosaic_cpu: {}: {e}", op_name(op)))?;
        self.bind(r, val);
        Ok(())
    }

    // ---- the walk ----

    /// Rewrite the ops of `block` in order.
    pub fn block(&mut self, block: BlockRef<'_, '_>) -> Result<()> {
        let mut next = block.first_operation();
        while let Some(op) = next {
            let loc = self.files.loc(op.location());
            let name = op_name(op);
            let rule = rules::rule(&name).ok_or_else(|| {
                kerr!(
                    Unsupported,
                    "mosaic_cpu has no rewrite for `{name}` (add it to the table in mosaic_cpu/rules.rs)"
                )
                .at(loc)
            })?;
            rule(self, op).map_err(|e| e.at(loc))?;
            next = op.next_in_block();
        }
        Ok(())
    }

    /// Write `op` as it is, in generic form, with its operands renamed (`overrides` replace some), its
    /// result and block-argument types mapped, and its regions rewritten.
    pub fn keep(&mut self, op: OperationRef<'_, '_>, overrides: &[(usize, Val)]) -> Result<()> {
        let name = op_name(op);
        let mut operands = self.operands(op)?;
        for (i, v) in overrides {
            if let Some(slot) = operands.get_mut(*i) {
                *slot = v.clone();
            }
        }
        let results: Vec<Ty> = (0..op.result_count())
            .map(|i| self.result_ty(op, i))
            .collect::<Result<_>>()?;
        let base = self.fresh();
        let def = match results.len() {
            0 => String::new(),
            1 => format!("{base} = "),
            n => format!("{base}:{n} = "),
        };
        let names = operands
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let signature = format!(
            "({}) -> ({})",
            operands
                .iter()
                .map(|v| v.ty.text())
                .collect::<Vec<_>>()
                .join(", "),
            results
                .iter()
                .map(|t| t.text())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let attrs = attrs_text(op, &[]);
        if op.region_count() == 0 {
            self.line(format!("{def}\"{name}\"({names}){attrs} : {signature}"));
        } else {
            self.open(format!("{def}\"{name}\"({names}) ({{"));
            for (ri, region) in op.regions().enumerate() {
                if ri > 0 {
                    self.close("}, {");
                    self.indent += 1;
                }
                if let Some(b) = region.first_block() {
                    if b.next_in_region().is_some() {
                        return Err(kerr!(
                            Unsupported,
                            "mosaic_cpu: `{name}` has a region with several blocks"
                        ));
                    }
                    self.block_args(b)?;
                    self.block(b)?;
                }
            }
            self.close(format!("}}){attrs} : {signature}"));
        }
        let several = results.len() > 1;
        for (i, ty) in results.into_iter().enumerate() {
            let name = if several {
                format!("{base}#{i}")
            } else {
                base.clone()
            };
            self.bind_result(op, i, Val { name, ty })?;
        }
        Ok(())
    }

    /// Name and bind a block's arguments and print its label (`^bb0(%a: t, ...):`) if it has any.
    fn block_args(&mut self, b: BlockRef<'_, '_>) -> Result<()> {
        let mut args = Vec::new();
        for i in 0..b.argument_count() {
            let a = b
                .argument(i)
                .map_err(|e| kerr!(Lowering, "mosaic_cpu: block argument {i}: {e}"))?;
            let ty = map_type(a.r#type())?;
            let name = self.fresh();
            args.push(format!("{name}: {}", ty.text()));
            self.bind(a, Val { name, ty });
        }
        if !args.is_empty() {
            self.line(format!("^bb0({}):", args.join(", ")));
        }
        Ok(())
    }

    /// Rewrite a `func.func` as `@new_name`, taking the error buffer as a last argument. Returns the
    /// mapped argument and result types.
    pub fn function(&mut self, f: OperationRef<'_, '_>, new_name: &str) -> Result<Signature> {
        let region = f
            .region(0)
            .map_err(|e| kerr!(Lowering, "mosaic_cpu: func.func without a body: {e}"))?;
        let block = region
            .first_block()
            .ok_or_else(|| kerr!(Lowering, "mosaic_cpu: func.func without a body"))?;
        let mut args = Vec::new();
        let mut tys = Vec::new();
        let mut spaces = Vec::new();
        for i in 0..block.argument_count() {
            let a = block
                .argument(i)
                .map_err(|e| kerr!(Lowering, "mosaic_cpu: argument {i}: {e}"))?;
            let ty = map_type(a.r#type())?;
            spaces.push(ref_space(a.r#type())?);
            let name = format!("%a{i}");
            args.push(format!("{name}: {}", ty.text()));
            tys.push(ty.clone());
            self.bind(a, Val { name, ty });
        }
        let fty = f
            .attribute("function_type")
            .ok()
            .and_then(|a| melior::ir::attribute::TypeAttribute::try_from(a).ok())
            .and_then(|t| FunctionType::try_from(t.value()).ok())
            .ok_or_else(|| kerr!(Lowering, "mosaic_cpu: func.func without a function_type"))?;
        let results = (0..fty.result_count())
            .map(|i| {
                fty.result(i)
                    .map_err(|e| kerr!(Lowering, "mosaic_cpu: result {i}: {e}"))
                    .and_then(map_type)
            })
            .collect::<Result<Vec<_>>>()?;
        self.err = "%err".into();
        args.push(format!("%err: memref<{ERR_SLOTS}xi64>"));
        self.open(format!(
            "func.func @{new_name}({}) -> ({}) {{",
            args.join(", "),
            results.iter().map(Ty::text).collect::<Vec<_>>().join(", ")
        ));
        let entry = self.out.len();
        self.hoisted.clear();
        self.block(block)?;
        let hoisted: String = self.hoisted.drain(..).map(|l| format!("  {l}\n")).collect();
        self.out.insert_str(entry, &hoisted);
        self.close("}");
        Ok(Signature {
            args: tys,
            results,
            spaces,
        })
    }
}

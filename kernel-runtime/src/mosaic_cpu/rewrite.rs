//! The walk over the emitted Mosaic module: every op is read through melior (name, operands, result
//! types, attributes, regions, location) and handed to its rule in [`super::rules`], which writes upstream
//! MLIR text. Values are renamed (`%tN`); vector values and refs become flat row-major buffers
//! (`memref<N x elem>`, a semaphore an `i32` counter), scalars stay scalars; a window of a ref
//! (`tpu.memref_slice`, `tpu.memref_squeeze`) is a [`RefView`] into its ref's buffer (a kernel
//! argument or a `run_scoped` allocation, see `scope.rs`).

use super::rules;
use crate::error::{kerr, Result, SourceLoc};
use melior::ir::attribute::{DenseI32ArrayAttribute, DenseI64ArrayAttribute, IntegerAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::r#type::{FunctionType, TypeLike};
use melior::ir::{Attribute, BlockRef, Location, RegionLike, Type, ValueLike};
use std::collections::HashMap;
use std::fmt::Write;

/// A type of the rewritten module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ty {
    /// `i32`, `f32`, `bf16`, `i1`, `index`, ...
    Scalar(String),
    /// A vector value or a ref: a flat row-major buffer `memref<N x elem>` of this shape.
    Mem { shape: Vec<usize>, elem: String },
}

impl Ty {
    pub fn text(&self) -> String {
        match self {
            Ty::Scalar(t) => t.clone(),
            Ty::Mem { shape, elem } => {
                format!("memref<{}x{elem}>", shape.iter().product::<usize>())
            }
        }
    }
    /// The element type (the type itself for a scalar).
    pub fn elem(&self) -> &str {
        match self {
            Ty::Scalar(t) => t,
            Ty::Mem { elem, .. } => elem,
        }
    }
    pub fn shape(&self) -> Option<&[usize]> {
        match self {
            Ty::Scalar(_) => None,
            Ty::Mem { shape, .. } => Some(shape),
        }
    }
}

/// A rewritten function's argument and result types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Signature {
    pub args: Vec<Ty>,
    pub results: Vec<Ty>,
    /// Per argument: the memory space of a ref (`None` for scalars).
    pub spaces: Vec<Option<Space>>,
}

/// Where a ref lives, as its emitted type says (`#tpu.memory_space<...>`, and for semaphores their
/// kind). On the CPU every space is host memory; the driver checks each against the kernel's operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Space {
    Vmem,
    Smem,
    Any,
    Hbm,
    /// `semaphore_mem` refs of `!tpu.dma_semaphore`.
    DmaSemaphore,
    /// `semaphore_mem` refs of `!tpu.semaphore`.
    Semaphore,
}

impl Space {
    pub fn is_semaphore(self) -> bool {
        matches!(self, Space::DmaSemaphore | Space::Semaphore)
    }
}

/// Which ref a buffer is, for the labels of errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RefId {
    /// A ref argument of the function (its number after the grid indices): a kernel operand, or in an
    /// index map a scalar-prefetch operand.
    Operand(usize),
    /// Allocation `k` of its `run_scoped` scope (`tpu.region`), the interpreter's "scoped buffer k".
    Scoped(usize),
}

/// A window of a ref as a ref (what `tpu.memref_slice` and `tpu.memref_squeeze` make, DMA and
/// semaphore ops take): element `i` (an index per dim of `shape`) is element
/// `offset + Σ i_d · strides[d]` of the flat buffer `root` (a kernel argument or a scoped
/// allocation). A whole ref is the view at offset 0 with row-major strides.
#[derive(Clone, Debug)]
pub(super) struct RefView {
    pub root: Val,
    /// The ref `root` is, for error labels.
    pub ref_id: Option<RefId>,
    /// An `index` value.
    pub offset: String,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

/// A value of the rewritten module: its SSA name and type.
#[derive(Clone, Debug)]
pub(super) struct Val {
    pub name: String,
    pub ty: Ty,
}

/// Whether an element type is a float (`f32`, `bf16`, ...).
pub(super) fn is_float(elem: &str) -> bool {
    elem.starts_with('f') || elem == "bf16"
}

/// A run-time check in the rewritten code; its number (index + 1) is what the code writes into the
/// error slot when the check fails.
#[derive(Clone, Debug)]
pub(super) struct Site {
    pub kind: SiteKind,
    pub loc: SourceLoc,
    /// The ref a load, store, window or semaphore op reads or writes.
    pub ref_id: Option<RefId>,
}

#[derive(Clone, Debug)]
pub(super) enum SiteKind {
    /// A `vector.load` window outside its ref (sizes, ref shape); the starts are reported.
    Load {
        sizes: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A `tpu.vector_store` window (with its strides) outside its ref.
    Store {
        sizes: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A `memref.load` / `memref.store` of one element (an SMEM ref) outside its ref, in the kernel or
    /// (`index_map`) in an index map reading a scalar-prefetch operand; the indices are reported.
    Element {
        store: bool,
        shape: Vec<usize>,
        index_map: bool,
    },
    /// A `tpu.memref_slice` window (of `sizes`) outside its base (of `shape`); the starts are reported.
    Slice {
        sizes: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A `tpu.wait_dma` on a DMA semaphore (of a ref of `shape`) that no copy signalled: it would
    /// never return. The semaphore's element is reported.
    DmaWait { shape: Vec<usize> },
    /// A `tpu.sem_wait` for more than the semaphore (of a ref of `shape`) holds, which nothing else
    /// will signal: the element, the amount and the value are reported.
    SemWait { shape: Vec<usize> },
    /// A semaphore of a `run_scoped` scope (of `shape`; `dma`: a DMA semaphore) not back at zero when
    /// the scope ends: the element and its value are reported.
    ScopeEnd { dma: bool, shape: Vec<usize> },
    /// `tpu.assume_multiple` on a value that is not a multiple (the value is reported).
    AssumeMultiple(i64),
    /// An `scf.for` whose step is not positive (the step is reported).
    ForStep,
}

/// Slots of the error buffer every rewritten function takes last: `[site, detail...]`.
pub(super) const ERR_SLOTS: usize = 8;

/// The emitted module's source files, to turn MLIR locations back into `SourceLoc`s.
pub(super) struct Files {
    pub known: Vec<&'static str>,
    pub fallback: SourceLoc,
}

impl Files {
    /// The `SourceLoc` of an MLIR `file:line:col` location (the fallback for any other kind).
    pub fn loc(&self, loc: Location<'_>) -> SourceLoc {
        let raw = loc.to_raw();
        // SAFETY: `raw` is a live location of the module being rewritten; the filename identifier it
        // returns is owned by the context and read before the call returns.
        let (file, line, col) = unsafe {
            if !mlir_sys::mlirLocationIsAFileLineColRange(raw) {
                return self.fallback;
            }
            let ident = mlir_sys::mlirLocationFileLineColRangeGetFilename(raw);
            let s = mlir_sys::mlirIdentifierStr(ident);
            let bytes = std::slice::from_raw_parts(s.data as *const u8, s.length);
            (
                String::from_utf8_lossy(bytes).into_owned(),
                mlir_sys::mlirLocationFileLineColRangeGetStartLine(raw),
                mlir_sys::mlirLocationFileLineColRangeGetStartColumn(raw),
            )
        };
        match self.known.iter().find(|f| **f == file) {
            Some(f) => SourceLoc {
                file: f,
                line: line.max(0) as u32,
                col: col.max(0) as u32,
            },
            None => self.fallback,
        }
    }
}

/// The body of [`Rewriter::nest_acc`]: induction variables and carried value → next value.
pub(super) type AccBody<'b, 'f> =
    dyn FnMut(&mut Rewriter<'f>, &[String], &str) -> Result<String> + 'b;

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
            files,
        }
    }

    pub fn finish(self) -> (String, Vec<Site>) {
        (self.out, self.sites)
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

    /// Register a run-time check and return its number.
    pub fn site(&mut self, op: OperationRef<'_, '_>, kind: SiteKind, ref_id: Option<RefId>) -> i64 {
        self.sites.push(Site {
            kind,
            loc: self.files.loc(op.location()),
            ref_id,
        });
        self.sites.len() as i64
    }

    /// Record check `site` as failed with `details` (index or i32/i64 scalars), unless an earlier
    /// failure is recorded.
    pub fn record(&mut self, site: i64, details: &[Val]) -> Result<()> {
        let err = Val {
            name: self.err.clone(),
            ty: Ty::Mem {
                shape: vec![ERR_SLOTS],
                elem: "i64".into(),
            },
        };
        let c0 = self.index(0);
        let first = self.load(&err, &c0);
        let zero = self.int(0, "i64");
        let clean = self.fresh();
        self.line(format!("{clean} = arith.cmpi eq, {first}, {zero} : i64"));
        self.if_else(
            &clean,
            |rw| {
                let id = rw.int(site, "i64");
                rw.store(&id, &err, &c0);
                for (slot, d) in details.iter().take(ERR_SLOTS - 1).enumerate() {
                    let v = match d.ty.elem() {
                        "i64" => d.name.clone(),
                        "index" => {
                            let v = rw.fresh();
                            rw.line(format!("{v} = arith.index_cast {} : index to i64", d.name));
                            v
                        }
                        t => {
                            let v = rw.fresh();
                            rw.line(format!("{v} = arith.extsi {} : {t} to i64", d.name));
                            v
                        }
                    };
                    let at = rw.index(slot + 1);
                    rw.store(&v, &err, &at);
                }
                Ok(())
            },
            |_| Ok(()),
        )
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

/// Row-major strides (in elements) of `shape`.
pub(super) fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The name of an op (`arith.addf`, `tpu.matmul`, ...).
pub(super) fn op_name(op: OperationRef<'_, '_>) -> String {
    op.name()
        .as_string_ref()
        .as_str()
        .map(str::to_string)
        .unwrap_or_default()
}

/// ` {name = value, ...}` for an op's attributes (except `skip`), or nothing.
pub(super) fn attrs_text(op: OperationRef<'_, '_>, skip: &[&str]) -> String {
    let mut items = Vec::new();
    for (name, value) in op.attributes() {
        let Ok(name) = name.as_string_ref().as_str().map(str::to_string) else {
            continue;
        };
        if skip.contains(&name.as_str()) {
            continue;
        }
        let mut s = String::new();
        let _ = write!(s, "{name} = {value}");
        items.push(s);
    }
    if items.is_empty() {
        String::new()
    } else {
        format!(" {{{}}}", items.join(", "))
    }
}

fn missing(op: OperationRef<'_, '_>, name: &str) -> crate::error::KernelError {
    kerr!(
        Lowering,
        "mosaic_cpu: `{}` has no valid `{name}` attribute",
        op_name(op)
    )
}

pub(super) fn attr<'c>(op: OperationRef<'c, '_>, name: &str) -> Result<Attribute<'c>> {
    op.attribute(name).map_err(|_| missing(op, name))
}

pub(super) fn i64_array(op: OperationRef<'_, '_>, name: &str) -> Result<Vec<i64>> {
    let a = DenseI64ArrayAttribute::try_from(attr(op, name)?).map_err(|_| missing(op, name))?;
    (0..a.len())
        .map(|i| a.element(i).map_err(|_| missing(op, name)))
        .collect()
}

pub(super) fn i32_array(op: OperationRef<'_, '_>, name: &str) -> Result<Vec<i64>> {
    let a = DenseI32ArrayAttribute::try_from(attr(op, name)?).map_err(|_| missing(op, name))?;
    (0..a.len())
        .map(|i| a.element(i).map(i64::from).map_err(|_| missing(op, name)))
        .collect()
}

pub(super) fn int_attr(op: OperationRef<'_, '_>, name: &str) -> Result<i64> {
    IntegerAttribute::try_from(attr(op, name)?)
        .map(|a| a.value())
        .map_err(|_| missing(op, name))
}

/// The static shape and element type of a shaped type (`vector`, `memref`).
fn static_shape(t: Type<'_>) -> Option<(Vec<usize>, String)> {
    let raw = t.to_raw();
    // SAFETY: `raw` is a live shaped type (checked by the callers with `is_vector`/`is_mem_ref`); the
    // element type returned is owned by the same context.
    unsafe {
        if !mlir_sys::mlirShapedTypeHasRank(raw) || !mlir_sys::mlirShapedTypeHasStaticShape(raw) {
            return None;
        }
        let rank = mlir_sys::mlirShapedTypeGetRank(raw);
        let shape = (0..rank)
            .map(|d| mlir_sys::mlirShapedTypeGetDimSize(raw, d as isize) as usize)
            .collect();
        let elem = Type::from_raw(mlir_sys::mlirShapedTypeGetElementType(raw));
        Some((shape, elem.to_string()))
    }
}

/// Memory spaces a ref may live in: on the CPU all are host memory (a semaphore an `i32` counter).
const MEMORY_SPACES: &[(&str, Space)] = &[
    ("#tpu.memory_space<vmem>", Space::Vmem),
    ("#tpu.memory_space<smem>", Space::Smem),
    ("#tpu.memory_space<any>", Space::Any),
    ("#tpu.memory_space<hbm>", Space::Hbm),
    ("#tpu.memory_space<semaphore_mem>", Space::Semaphore),
];

/// Semaphore element types (only in `semaphore_mem`, which holds nothing else).
const SEMAPHORES: &[(&str, Space)] = &[
    ("!tpu.dma_semaphore", Space::DmaSemaphore),
    ("!tpu.semaphore", Space::Semaphore),
];

/// The memory space of a memref type (`None` for other types and memrefs without one).
pub(super) fn ref_space(t: Type<'_>) -> Result<Option<Space>> {
    if !t.is_mem_ref() {
        return Ok(None);
    }
    let Some(space) = melior::ir::r#type::MemRefType::try_from(t)
        .ok()
        .and_then(|m| m.memory_space())
        .map(|a| a.to_string())
    else {
        return Ok(None);
    };
    let Some(&(_, s)) = MEMORY_SPACES.iter().find(|(n, _)| *n == space) else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: refs in memory space {space} are not supported"
        ));
    };
    let elem = static_shape(t).map(|(_, e)| e).unwrap_or_default();
    let semaphore = SEMAPHORES.iter().find(|(n, _)| *n == elem).map(|(_, k)| *k);
    match (s, semaphore) {
        (Space::Semaphore, Some(kind)) => Ok(Some(kind)),
        (s, None) if !s.is_semaphore() => Ok(Some(s)),
        _ => Err(kerr!(
            Unsupported,
            "mosaic_cpu: a ref of {elem} in {space} (semaphores live in semaphore_mem, which holds only semaphores)"
        )),
    }
}

pub(super) fn map_type(t: Type<'_>) -> Result<Ty> {
    if t.is_vector() || t.is_mem_ref() {
        let semaphore = ref_space(t)?.is_some_and(Space::is_semaphore);
        if t.is_mem_ref() {
            let m = melior::ir::r#type::MemRefType::try_from(t)
                .map_err(|_| kerr!(Lowering, "mosaic_cpu: bad memref type {t}"))?;
            let (strides, offset) = m.strides_and_offset();
            let (shape, _) = static_shape(t)
                .ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: dynamic shape in {t}"))?;
            let want = row_major(&shape);
            if offset != 0 || strides.iter().zip(&want).any(|(a, b)| *a != *b as i64) {
                return Err(kerr!(
                    Unsupported,
                    "mosaic_cpu: a ref with a non-identity layout ({t})"
                ));
            }
        }
        let (shape, elem) = static_shape(t)
            .ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: dynamic shape in {t}"))?;
        // A semaphore is a counter: the interpreter's (and the hardware's) 32-bit value.
        let elem = if semaphore { "i32".to_string() } else { elem };
        return Ok(Ty::Mem { shape, elem });
    }
    if t.is_integer() || t.is_index() || t.is_float() {
        return Ok(Ty::Scalar(t.to_string()));
    }
    Err(kerr!(
        Unsupported,
        "mosaic_cpu: values of type {t} are not supported"
    ))
}

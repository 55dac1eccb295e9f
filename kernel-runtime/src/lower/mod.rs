//! Kernel IR → Mosaic MLIR through melior.
//!
//! The module has the shape Pallas gives it (see `tests/data/pallas/`): `module @name attributes
//! {stable_mosaic.version}`, the kernel `func.func` with arguments (grid i32s, inputs, outputs, scratch) and
//! the Mosaic func attributes, then one `func.func @transform_k` per BlockSpec index map. Ops are lowered by
//! small per-family rules in `rules`. Rust source locations become MLIR `FileLineColLoc`s.
//!
//! Only this module (and later `serialize`) touches melior.

mod context;
mod rules;

use crate::error::{kerr, Result};
use crate::ir::{Func, Kernel, MemSpace, OperandRole, Region, Type, ValueId};
pub use context::with_context;
use melior::ir::attribute::{StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationBuilder, OperationLike, OperationMutLike};
use melior::ir::r#type::{FunctionType, IntegerType, MemRefType};
use melior::ir::{
    Attribute, Block, Identifier, Location, Module, RegionLike, Type as MType, Value, ValueLike,
};
use melior::Context;
use mlir_sys::MlirValue;

/// The `stable_mosaic.version` written on the module (what Pallas's cross-platform lowering writes).
pub const MOSAIC_VERSION: i64 = 15;

/// Lower a kernel to verified Mosaic MLIR text.
pub fn to_mosaic_text(k: &Kernel) -> Result<String> {
    context::with_context(|ctx| {
        let module = build_module(ctx, k)?;
        Ok(module.as_operation().to_string())
    })
}

/// Lower a kernel to verified Mosaic MLIR text with every op's Rust source location (`loc(...)`), e.g. to
/// map a Mosaic diagnostic back to the kernel line that produced the op.
pub fn to_mosaic_text_with_locations(k: &Kernel) -> Result<String> {
    context::with_context(|ctx| {
        let module = build_module(ctx, k)?;
        let flags =
            melior::ir::operation::OperationPrintingFlags::new().enable_debug_info(true, false);
        module
            .as_operation()
            .to_string_with_flags(flags)
            .map_err(|e| kerr!(Lowering, "printing the module: {e}"))
    })
}

/// Build and verify the Mosaic module for a kernel in `ctx`.
pub fn build_module<'c>(ctx: &'c Context, k: &Kernel) -> Result<Module<'c>> {
    let loc = location(ctx, &k.body.loc);
    let mut module = Module::new(loc);
    {
        let mut op = module.as_operation_mut();
        op.set_attribute("sym_name", StringAttribute::new(ctx, &k.name).into());
        op.set_attribute(
            "stable_mosaic.version",
            parse_attr(ctx, &format!("{MOSAIC_VERSION} : i64"))?,
        );
    }
    let kernel_fn = lower_kernel_fn(ctx, k)?;
    module.body().append_operation(kernel_fn);
    for o in &k.operands {
        if let Some(b) = &o.block {
            let f = lower_func(ctx, &b.index_map, vec![])?;
            module.body().append_operation(f);
        }
    }
    if !module.as_operation().verify() {
        return Err(kerr!(
            Lowering,
            "the generated Mosaic module for `{}` does not verify (a tpu-kernel bug); module:\n{}",
            k.name,
            module.as_operation()
        ));
    }
    Ok(module)
}

fn lower_kernel_fn<'c>(ctx: &'c Context, k: &Kernel) -> Result<melior::ir::Operation<'c>> {
    let grid = k
        .grid
        .iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sem = k
        .dimension_semantics
        .iter()
        .map(|s| format!("#tpu.dimension_semantics<{}>", s.mosaic()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut windows = Vec::new();
    let mut n_transform = 0;
    for o in k.operands.iter().filter(|o| o.role != OperandRole::Scratch) {
        match &o.block {
            Some(b) => {
                let bounds = b
                    .block_shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let pipeline =
                    if b.index_map.is_constant_map() && k.grid.iter().product::<usize>() > 1 {
                        "pipeline_mode = #tpu.pipeline_mode<synchronous>, "
                    } else {
                        ""
                    };
                windows.push(format!(
                    "{{{pipeline}transform_indices = @transform_{n_transform}, window_bounds = array<i64: {bounds}>}}"
                ));
                n_transform += 1;
            }
            None => windows.push("{}".into()),
        }
    }
    let n_scratch = k
        .operands
        .iter()
        .filter(|o| o.role == OperandRole::Scratch)
        .count();
    let attrs = [
        ("dimension_semantics", format!("[{sem}]")),
        (
            "iteration_bounds",
            if grid.is_empty() {
                "array<i64>".into()
            } else {
                format!("array<i64: {grid}>")
            },
        ),
        ("scalar_prefetch", "0 : i64".into()),
        ("scratch_operands", format!("{n_scratch} : i64")),
        ("tpu.core_type", "#tpu.core_type<tc>".into()),
        ("window_params", format!("[{}]", windows.join(", "))),
    ];
    let mut parsed = Vec::new();
    for (name, text) in attrs {
        parsed.push((Identifier::new(ctx, name), parse_attr(ctx, &text)?));
    }
    lower_func(ctx, &k.body, parsed)
}

fn lower_func<'c>(
    ctx: &'c Context,
    f: &Func,
    extra_attrs: Vec<(Identifier<'c>, Attribute<'c>)>,
) -> Result<melior::ir::Operation<'c>> {
    let mut lw = Lowerer {
        ctx,
        func: f,
        values: vec![None; f.values.len()],
    };
    let inputs: Vec<MType> = f
        .body
        .args
        .iter()
        .map(|a| lw.ty(f.ty(*a)))
        .collect::<Result<_>>()?;
    let results: Vec<MType> = f
        .result_types
        .iter()
        .map(|t| lw.ty(t))
        .collect::<Result<_>>()?;
    let fty = FunctionType::new(ctx, &inputs, &results);
    let body = lw.region(&f.body)?;
    let region = melior::ir::Region::new();
    region.append_block(body);
    let mut attrs = vec![
        (
            Identifier::new(ctx, "sym_name"),
            StringAttribute::new(ctx, &f.name).into(),
        ),
        (
            Identifier::new(ctx, "function_type"),
            TypeAttribute::new(fty.into()).into(),
        ),
    ];
    attrs.extend(extra_attrs);
    OperationBuilder::new("func.func", location(ctx, &f.loc))
        .add_attributes(&attrs)
        .add_regions([region])
        .build()
        .map_err(|e| kerr!(Lowering, "building func.func @{}: {e}", f.name))
}

/// The attribute `text` in `ctx`, parsed once per context (see `context::memo_attr`).
pub(crate) fn parse_attr<'c>(ctx: &'c Context, text: &str) -> Result<Attribute<'c>> {
    context::memo_attr(ctx, text)
        .ok_or_else(|| kerr!(Lowering, "MLIR could not parse the attribute `{text}`"))
}

pub(crate) fn location<'c>(ctx: &'c Context, loc: &crate::error::SourceLoc) -> Location<'c> {
    Location::new(ctx, loc.file, loc.line as usize, loc.col as usize)
}

/// Lowers the ops of one function; `values` maps IR values to MLIR values.
pub(crate) struct Lowerer<'c, 'f> {
    pub ctx: &'c Context,
    pub func: &'f Func,
    values: Vec<Option<MlirValue>>,
}

impl<'c, 'f> Lowerer<'c, 'f> {
    pub fn ty(&self, t: &Type) -> Result<MType<'c>> {
        match t {
            Type::Scalar(d) => Ok(self.elem(*d)),
            // A 0-d vector prints as its element type in our IR's convention (`vector_type_text`).
            Type::Vector(s, d) if s.is_empty() => Ok(self.elem(*d)),
            Type::Vector(s, d) => {
                let dims: Vec<u64> = s.iter().map(|&x| x as u64).collect();
                Ok(MType::vector(&dims, self.elem(*d)))
            }
            Type::Ref(s, d, space) => {
                let dims: Vec<i64> = s.iter().map(|&x| x as i64).collect();
                let space = match space {
                    MemSpace::Vmem => "#tpu.memory_space<vmem>",
                    MemSpace::Smem => "#tpu.memory_space<smem>",
                    MemSpace::Any => "#tpu.memory_space<any>",
                };
                let space = parse_attr(self.ctx, space)?;
                Ok(MemRefType::new(self.elem(*d), &dims, None, Some(space)).into())
            }
        }
    }

    /// The MLIR element type of a dtype (signless integers; signedness lives in the ops).
    pub fn elem(&self, d: crate::dtype::DType) -> MType<'c> {
        use crate::dtype::DType;
        match d {
            DType::F32 => MType::float32(self.ctx),
            DType::BF16 => MType::bfloat16(self.ctx),
            DType::I32 | DType::U32 => IntegerType::new(self.ctx, 32).into(),
            DType::I8 | DType::U8 => IntegerType::new(self.ctx, 8).into(),
            DType::Bool => IntegerType::new(self.ctx, 1).into(),
        }
    }

    /// The MLIR value for an IR value (must already be lowered).
    pub fn v(&self, id: ValueId) -> Result<Value<'c, '_>> {
        let raw = self.values.get(id.0 as usize).copied().flatten();
        let raw = raw.ok_or_else(|| {
            kerr!(
                Lowering,
                "value %{} used before it was lowered (internal error)",
                id.0
            )
        })?;
        // SAFETY: `raw` was produced by an operation or block argument of the module being built in
        // `self.ctx`; MLIR keeps those objects alive (at a fixed address) until the module is dropped, which
        // outlives this lowerer. Moving the Rust `Block` wrapper into its parent does not move the value.
        Ok(unsafe { Value::from_raw(raw) })
    }

    /// Make `result` the same MLIR value as `operand` (an op that lowers to nothing).
    pub fn alias(&mut self, result: ValueId, operand: ValueId) -> Result<()> {
        let raw = self.values.get(operand.0 as usize).copied().flatten();
        let raw = raw.ok_or_else(|| {
            kerr!(
                Lowering,
                "value %{} aliased before it was lowered",
                operand.0
            )
        })?;
        if let Some(slot) = self.values.get_mut(result.0 as usize) {
            *slot = Some(raw);
        }
        Ok(())
    }

    pub fn bind(&mut self, id: ValueId, v: Value<'c, '_>) {
        if let Some(slot) = self.values.get_mut(id.0 as usize) {
            *slot = Some(v.to_raw());
        }
    }

    /// Lower a region into a new block (its args become block arguments).
    pub fn region(&mut self, r: &Region) -> Result<Block<'c>> {
        let args: Vec<(MType<'c>, Location<'c>)> = r
            .args
            .iter()
            .map(|a| {
                Ok((
                    self.ty(self.func.ty(*a))?,
                    location(self.ctx, &self.func.loc),
                ))
            })
            .collect::<Result<_>>()?;
        let block = Block::new(&args);
        for (i, a) in r.args.iter().enumerate() {
            let arg = block
                .argument(i)
                .map_err(|e| kerr!(Lowering, "block argument {i}: {e}"))?;
            self.bind(*a, arg.into());
        }
        for op in &r.ops {
            rules::lower_op(self, &block, op).map_err(|e| e.at(op.loc))?;
        }
        Ok(block)
    }
}

pub(crate) fn vector_type_text(shape: &[usize], elem: &str) -> String {
    if shape.is_empty() {
        return elem.to_string();
    }
    let dims = shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x");
    format!("vector<{dims}x{elem}>")
}

/// Detach an op result from the borrow of the `OperationRef` it came from.
pub(crate) fn detach<'c>(v: impl ValueLike<'c>) -> Value<'c, 'static> {
    // SAFETY: as in `Lowerer::v`: the value belongs to an op of the module being built, which MLIR keeps
    // alive at a fixed address until the module is dropped, after every use of the returned handle.
    unsafe { Value::from_raw(v.to_raw()) }
}

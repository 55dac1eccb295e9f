//! The Mosaic module as data → an MLIR module through melior (attributes and types parsed from their
//! text, memoized per context; locations kept).

use super::{location, parse_attr, parse_type};
use crate::error::{kerr, Result};
use crate::mosaic::model::{MBlock, MFunc, MModule, MOp, MType};
use crate::mosaic::text::mlir_string;
use melior::ir::attribute::TypeAttribute;
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationBuilder, OperationMutLike};
use melior::ir::r#type::{FunctionType, MemRefType};
use melior::ir::{Block, Identifier, Module, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;
use mlir_sys::MlirValue;

/// Build (not verify) the MLIR module for `m`.
pub(super) fn module<'c>(ctx: &'c Context, m: &MModule) -> Result<Module<'c>> {
    let mut module = Module::new(location(ctx, &m.loc));
    {
        let mut op = module.as_operation_mut();
        op.set_attribute("sym_name", parse_attr(ctx, &mlir_string(&m.name))?);
        op.set_attribute(
            "stable_mosaic.version",
            parse_attr(ctx, &format!("{} : i64", m.version))?,
        );
    }
    for f in &m.funcs {
        module.body().append_operation(func(ctx, f)?);
    }
    Ok(module)
}

fn func<'c>(ctx: &'c Context, f: &MFunc) -> Result<melior::ir::Operation<'c>> {
    let mut values = vec![None; f.num_values as usize];
    let body = block(ctx, &f.body, &mut values)?;
    let region = Region::new();
    region.append_block(body);
    let inputs = f
        .inputs
        .iter()
        .map(|t| ty(ctx, t))
        .collect::<Result<Vec<_>>>()?;
    let results = f
        .results
        .iter()
        .map(|t| ty(ctx, t))
        .collect::<Result<Vec<_>>>()?;
    let mut attrs = vec![
        (
            Identifier::new(ctx, "sym_name"),
            parse_attr(ctx, &mlir_string(&f.name))?,
        ),
        (
            Identifier::new(ctx, "function_type"),
            TypeAttribute::new(FunctionType::new(ctx, &inputs, &results).into()).into(),
        ),
    ];
    for (name, text) in &f.attrs {
        attrs.push((Identifier::new(ctx, name), parse_attr(ctx, text)?));
    }
    OperationBuilder::new("func.func", location(ctx, &f.loc))
        .add_attributes(&attrs)
        .add_regions([region])
        .build()
        .map_err(|e| kerr!(Lowering, "building func.func @{}: {e}", f.name))
}

fn block<'c>(ctx: &'c Context, b: &MBlock, values: &mut [Option<MlirValue>]) -> Result<Block<'c>> {
    let loc = match &b.arg_loc {
        Some(l) => location(ctx, l),
        None => melior::ir::Location::unknown(ctx),
    };
    let args = b
        .args
        .iter()
        .map(|(_, t)| Ok((ty(ctx, t)?, loc)))
        .collect::<Result<Vec<_>>>()?;
    let block = Block::new(&args);
    for (i, (v, _)) in b.args.iter().enumerate() {
        let arg = block
            .argument(i)
            .map_err(|e| kerr!(Lowering, "block argument {i}: {e}"))?;
        values[*v as usize] = Some(Value::from(arg).to_raw());
    }
    for o in &b.ops {
        let built = op(ctx, o, values)?;
        let r = block.append_operation(built);
        for (i, (v, _)) in o.results.iter().enumerate() {
            let res = r
                .result(i)
                .map_err(|e| kerr!(Lowering, "{} result {i}: {e}", o.name))?;
            values[*v as usize] = Some(Value::from(res).to_raw());
        }
    }
    Ok(block)
}

fn op<'c>(
    ctx: &'c Context,
    o: &MOp,
    values: &mut [Option<MlirValue>],
) -> Result<melior::ir::Operation<'c>> {
    let operands =
        o.operands
            .iter()
            .map(|v| {
                let raw =
                    values.get(*v as usize).copied().flatten().ok_or_else(|| {
                        kerr!(Lowering, "{} uses %{v} before its definition", o.name)
                    })?;
                // SAFETY: `raw` is a result or block argument of the module being built in `ctx`, which MLIR
                // keeps at a fixed address until the module is dropped, after this call.
                Ok(unsafe { Value::from_raw(raw) })
            })
            .collect::<Result<Vec<_>>>()?;
    let results = o
        .results
        .iter()
        .map(|(_, t)| ty(ctx, t))
        .collect::<Result<Vec<_>>>()?;
    let attrs = o
        .attrs
        .iter()
        .map(|(k, text)| Ok((Identifier::new(ctx, k), parse_attr(ctx, text)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut regions = Vec::with_capacity(o.regions.len());
    for r in &o.regions {
        let region = Region::new();
        if let Some(b) = r {
            region.append_block(block(ctx, b, values)?);
        }
        regions.push(region);
    }
    OperationBuilder::new(o.name, location(ctx, &o.loc))
        .add_operands(&operands)
        .add_results(&results)
        .add_attributes(&attrs)
        .add_regions_vec(regions)
        .build()
        .map_err(|e| kerr!(Lowering, "building {}: {e}", o.name))
}

/// The MLIR type for `t` (plain types parsed and memoized; memrefs built from their parts).
fn ty<'c>(ctx: &'c Context, t: &MType) -> Result<Type<'c>> {
    match t {
        MType::Plain(text) => parse_type(ctx, text),
        MType::MemRef { shape, elem, space } => {
            let dims: Vec<i64> = shape
                .iter()
                .map(|&d| crate::mosaic::model::dim_i64(d))
                .collect();
            let space = parse_attr(ctx, space)?;
            Ok(MemRefType::new(parse_type(ctx, elem)?, &dims, None, Some(space)).into())
        }
    }
}

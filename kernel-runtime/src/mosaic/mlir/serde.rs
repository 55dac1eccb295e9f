//! The serialized body the long way, through MLIR: the reference the direct writer
//! ([`crate::mosaic::bytecode`]) is held to (`tests/bytecode.rs`), and the reader that prints a body.
//!
//! The rewrite (both paths) is what jaxlib's `mosaic-serde{serialize=true target-version=V}` pass does,
//! done here on our own module: every op except `builtin.module` is rebuilt under the name `stable_mosaic.<op name>`
//! (so it becomes an unregistered op, printed and written in generic form) carrying all its attributes,
//! the inherent ones included; ops newer than the target version are downgraded by the per-op rules in
//! [`downgrade_drops`]; the module gets `stable_mosaic.version = V`.
//!
//! One difference from jaxlib had to be made up for: our context does not register the `tpu` dialect, so
//! `tpu.*` ops carry only the attributes the lowering set, while jaxlib's registered ops also carry their
//! default-valued inherent attributes. [`TPU_DEFAULT_ATTRS`] adds those, so our body equals what jaxlib
//! writes for the same module (the Python suite checks this for every example, at every version).

use super::{parse_attr, with_context};
use crate::error::{kerr, Result};
use crate::mosaic::model::MModule;
use crate::mosaic::serde::{check_version, downgrade_drops, MANGLE_PREFIX, TPU_DEFAULT_ATTRS};
use melior::ir::attribute::AttributeLike;
use melior::ir::attribute::IntegerAttribute;
use melior::ir::bytecode_writer_config::BytecodeWriterConfig;
use melior::ir::operation::{OperationLike, OperationMutLike};
use melior::ir::r#type::IntegerType;
use melior::ir::{Attribute, Module};
use melior::Context;
use mlir_sys::{
    mlirBlockInsertOwnedOperationAfter, mlirIdentifierGet, mlirIdentifierStr,
    mlirNamedAttributeGet, mlirOperationCreate, mlirOperationDestroy, mlirOperationGetAttribute,
    mlirOperationGetBlock, mlirOperationGetLocation, mlirOperationGetName,
    mlirOperationGetNumAttributes, mlirOperationGetNumOperands, mlirOperationGetNumRegions,
    mlirOperationGetNumResults, mlirOperationGetNumSuccessors, mlirOperationGetOperand,
    mlirOperationGetRegion, mlirOperationGetResult, mlirOperationStateAddAttributes,
    mlirOperationStateAddOperands, mlirOperationStateAddOwnedRegions, mlirOperationStateAddResults,
    mlirOperationStateGet, mlirOperationWalk, mlirRegionCreate, mlirRegionTakeBody,
    mlirValueGetType, mlirValueReplaceAllUsesOfWith, MlirNamedAttribute, MlirOperation,
    MlirStringRef, MlirWalkOrder_MlirWalkPostOrder, MlirWalkResult,
    MlirWalkResult_MlirWalkResultAdvance,
};
use std::os::raw::c_void;

/// Parse a serialized body with MLIR and print it (generic form; `with_locations` adds `loc(..)`s).
pub fn read_body(bytes: &[u8], with_locations: bool) -> Result<String> {
    with_context(|ctx| {
        // SAFETY: `bytes` outlives the call; MLIR copies what it keeps. A null module is a parse error.
        let raw = unsafe {
            mlir_sys::mlirModuleCreateParse(
                ctx.to_raw(),
                MlirStringRef {
                    data: bytes.as_ptr() as *const _,
                    length: bytes.len(),
                },
            )
        };
        if raw.ptr.is_null() {
            return Err(kerr!(Lowering, "MLIR cannot read the serialized body"));
        }
        // SAFETY: a valid module just created in `ctx`; the wrapper owns and destroys it.
        let module = unsafe { Module::from_raw(raw) };
        let flags = melior::ir::operation::OperationPrintingFlags::new()
            .enable_debug_info(with_locations, false);
        module
            .as_operation()
            .to_string_with_flags(flags)
            .map_err(|e| kerr!(Lowering, "printing the serialized body: {e}"))
    })
}

/// The reference serializer the direct writer is tested against: build and verify the module with MLIR,
/// rewrite it to the mosaic-serde form in place ([`to_serialized_form`]), and let MLIR's bytecode writer
/// write it. Slower (it builds the module twice over); not used to ship kernels.
pub fn reference_bytecode(m: &MModule, version: i64) -> Result<Vec<u8>> {
    check_version(version)?;
    with_context(|ctx| {
        let mut module = super::build(ctx, m)?;
        to_serialized_form(ctx, &mut module, version)?;
        // Bytecode format version 0, as jax writes it (`write_bytecode(desired_version=0)`).
        let config = BytecodeWriterConfig::new();
        config.set_desired_emit_version(0);
        module
            .as_operation()
            .write_bytecode_with_config(&config)
            .map_err(|e| kerr!(Lowering, "writing the MLIR bytecode of `{}`: {e}", m.name))
    })
}

/// Rewrite `module` in place to the mosaic-serde form at `version`.
pub fn to_serialized_form(ctx: &Context, module: &mut Module<'_>, version: i64) -> Result<()> {
    let module_op = module.as_operation().to_raw();
    // Post-order: children are rebuilt before their parents, whose regions (already rewritten) are then
    // moved as a whole into the rebuilt parent.
    let mut ops: Vec<MlirOperation> = Vec::new();
    unsafe extern "C" fn collect(op: MlirOperation, data: *mut c_void) -> MlirWalkResult {
        // SAFETY: `data` is the `&mut Vec` passed to `mlirOperationWalk` below, alive for the walk.
        let ops = unsafe { &mut *(data as *mut Vec<MlirOperation>) };
        ops.push(op);
        MlirWalkResult_MlirWalkResultAdvance
    }
    // SAFETY: `module_op` is a valid operation owned by `module`; the callback only records handles.
    unsafe {
        mlirOperationWalk(
            module_op,
            Some(collect),
            &mut ops as *mut _ as *mut c_void,
            MlirWalkOrder_MlirWalkPostOrder,
        )
    };
    for op in ops {
        if op.ptr == module_op.ptr {
            continue;
        }
        // SAFETY: each handle was collected from the live module and is rebuilt (and destroyed) exactly
        // once; post-order guarantees no handle still in the list belongs to an op destroyed before it.
        unsafe { mangle_op(ctx, op, version)? };
    }
    let i64_type = IntegerType::new(ctx, 64).into();
    module.as_operation_mut().set_attribute(
        "stable_mosaic.version",
        IntegerAttribute::new(i64_type, version).into(),
    );
    Ok(())
}

fn string_ref(s: &str) -> MlirStringRef {
    MlirStringRef {
        data: s.as_ptr() as *const _,
        length: s.len(),
    }
}

/// The text of an MLIR string ref (owned by the context, so it lives as long as `'a` says).
///
/// # Safety
/// `r` must point at `length` valid bytes for `'a`.
unsafe fn str_of<'a>(r: MlirStringRef) -> &'a str {
    if r.data.is_null() {
        return "";
    }
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { std::slice::from_raw_parts(r.data as *const u8, r.length) };
    std::str::from_utf8(bytes).unwrap_or("")
}

/// The name of a named attribute.
fn attr_name<'a>(a: &MlirNamedAttribute) -> &'a str {
    // SAFETY: identifiers are uniqued in the context and never freed while it lives.
    unsafe { str_of(mlirIdentifierStr(a.name)) }
}

/// Replace `op` by `stable_mosaic.<name>` with the same operands, results, attributes (their
/// identifiers reused) and regions.
unsafe fn mangle_op(context: &Context, op: MlirOperation, version: i64) -> Result<()> {
    // SAFETY: `op` is a live operation of a module in `context` (this function's contract); these calls
    // only read it, and the regions' bodies are moved into fresh regions the new op will own.
    let (name, successors, mut named, operands, old_results, regions) = unsafe {
        let named: Vec<MlirNamedAttribute> = (0..mlirOperationGetNumAttributes(op))
            .map(|i| mlirOperationGetAttribute(op, i))
            .collect();
        let operands: Vec<_> = (0..mlirOperationGetNumOperands(op))
            .map(|i| mlirOperationGetOperand(op, i))
            .collect();
        let results: Vec<_> = (0..mlirOperationGetNumResults(op))
            .map(|i| mlirOperationGetResult(op, i))
            .collect();
        let regions: Vec<_> = (0..mlirOperationGetNumRegions(op))
            .map(|i| {
                let fresh = mlirRegionCreate();
                mlirRegionTakeBody(fresh, mlirOperationGetRegion(op, i));
                fresh
            })
            .collect();
        (
            str_of(mlirIdentifierStr(mlirOperationGetName(op))),
            mlirOperationGetNumSuccessors(op),
            named,
            operands,
            results,
            regions,
        )
    };
    if successors != 0 {
        return Err(kerr!(
            Lowering,
            "cannot serialize `{name}`: ops with successors are not emitted by tpu-kernel"
        ));
    }
    let ctx = context.to_raw();
    for (op_name, attr, value) in TPU_DEFAULT_ATTRS {
        if *op_name == name && !named.iter().any(|a| attr_name(a) == *attr) {
            let parsed = parse_attr(context, value)?;
            // SAFETY: the context and the parsed attribute are live; the identifier is uniqued by MLIR.
            named.push(unsafe {
                mlirNamedAttributeGet(mlirIdentifierGet(ctx, string_ref(attr)), parsed.to_raw())
            });
        }
    }
    downgrade_named(name, &mut named, version)?;

    let new_name = format!("{MANGLE_PREFIX}{name}");
    let result_types: Vec<_> = old_results
        .iter()
        // SAFETY: the results are live values of `op`.
        .map(|v| unsafe { mlirValueGetType(*v) })
        .collect();

    // SAFETY: every handle added to the state is live; `new_name` outlives `mlirOperationCreate`; the
    // fresh regions are owned by the state and then by the new op.
    let new_op = unsafe {
        let mut state = mlirOperationStateGet(string_ref(&new_name), mlirOperationGetLocation(op));
        mlirOperationStateAddOperands(&mut state, operands.len() as isize, operands.as_ptr());
        mlirOperationStateAddResults(
            &mut state,
            result_types.len() as isize,
            result_types.as_ptr(),
        );
        mlirOperationStateAddAttributes(&mut state, named.len() as isize, named.as_ptr());
        mlirOperationStateAddOwnedRegions(&mut state, regions.len() as isize, regions.as_ptr());
        mlirOperationCreate(&mut state)
    };
    if new_op.ptr.is_null() {
        return Err(kerr!(
            Lowering,
            "MLIR could not create `{new_name}` while serializing"
        ));
    }
    // SAFETY: `op` is in a block (every op but the module is); the new op is inserted after it, takes over
    // its uses, and `op` (now without regions or uses) is erased.
    unsafe {
        mlirBlockInsertOwnedOperationAfter(mlirOperationGetBlock(op), op, new_op);
        for (i, old) in old_results.iter().enumerate() {
            mlirValueReplaceAllUsesOfWith(*old, mlirOperationGetResult(new_op, i as isize));
        }
        mlirOperationDestroy(op);
    }
    Ok(())
}

/// [`downgrade_drops`] applied to MLIR named attributes (the reference path).
fn downgrade_named(name: &str, attrs: &mut Vec<MlirNamedAttribute>, version: i64) -> Result<()> {
    let drops = downgrade_drops(
        name,
        |k| {
            attrs.iter().find(|a| attr_name(a) == k).map(|a| {
                // SAFETY: the attribute handle is live (owned by the context).
                unsafe { Attribute::from_raw(a.attribute) }.to_string()
            })
        },
        version,
    )?;
    attrs.retain(|a| !drops.contains(&attr_name(a)));
    Ok(())
}

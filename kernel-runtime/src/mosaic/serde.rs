//! The serialized form libtpu reads (what jaxlib's `mosaic-serde{serialize=true target-version=V}` pass
//! makes of a module), as facts every writer shares: the `stable_mosaic.` op-name prefix, the versions
//! we write and their downgrade rules, and the default-valued inherent attributes a registered op carries
//! (which a writer that builds no MLIR — [`super::bytecode`] — must spell out itself).
//!
//! ## Which `stable_mosaic.version`
//! [`DEFAULT_VERSION`] is **15**: what JAX's Pallas writes when it lowers for TPU without a TPU backend
//! at hand (its forward-compatible version), and accepted by every libtpu from before 0.0.50 on (libtpu
//! 0.0.51 reads 14..=18; 19 is refused). Our ops are built in the newest form; [`downgrade_drops`]
//! holds the rules that change the ops we emit between [`MIN_VERSION`] and [`MAX_VERSION`] (between 14
//! and 18 none of them does: the body at 15 and at 18 differ only in the version attribute, measured
//! with jaxlib 0.12.0.1). `CallOptions::version` picks another.

use crate::error::{kerr, Result};

/// The version written by default (see the module docs), on the module as lowered and in the body.
pub const DEFAULT_VERSION: i64 = 15;
/// The newest version our ops are built in (jaxlib 0.12.0.1 / libtpu 0.0.51).
pub const MAX_VERSION: i64 = 18;
/// The oldest version we can downgrade to (below it, rules we do not implement would apply).
pub const MIN_VERSION: i64 = 10;

/// An error unless `version` is one we can write.
pub fn check_version(version: i64) -> Result<()> {
    if !(MIN_VERSION..=MAX_VERSION).contains(&version) {
        return Err(kerr!(
            Unsupported,
            "stable_mosaic version {version} is not supported; choose one in {MIN_VERSION}..={MAX_VERSION}"
        ));
    }
    Ok(())
}

/// The op-name prefix of the serialized form.
pub const MANGLE_PREFIX: &str = "stable_mosaic.";

/// Default-valued inherent attributes of the `tpu` ops we emit, as jaxlib's registered tpu dialect fills
/// them in (our context leaves `tpu` unregistered and cannot know them). Measured with jaxlib 0.12.0.1's
/// serializer; the Python suite fails if one is missing or wrong.
pub const TPU_DEFAULT_ATTRS: &[(&str, &str, &str)] = &[
    ("tpu.vector_store", "add", "false"),
    ("tpu.matmul", "transpose_lhs", "false"),
    ("tpu.matmul", "transpose_rhs", "false"),
];

/// Inherent attributes that MLIR's registered `arith`/`math` ops carry at their default value and
/// therefore write into the serialized form (jaxlib's serializer copies every attribute of an op). The
/// reference path (feature `mlir`) gets them from MLIR itself; `tests/bytecode.rs` fails if this list and MLIR disagree
/// on any op the lowering emits. ([`TPU_DEFAULT_ATTRS`] are the `tpu` ops' own, added on both paths.)
pub fn mlir_default_attrs(name: &str) -> &'static [(&'static str, &'static str)] {
    const FASTMATH: &[(&str, &str)] = &[("fastmath", "#arith.fastmath<none>")];
    const OVERFLOW: &[(&str, &str)] = &[("overflowFlags", "#arith.overflow<none>")];
    match name {
        // Every float op of `math` (the integer ones excepted) and arith's float arithmetic.
        "math.absi" => &[],
        n if n.starts_with("math.") => FASTMATH,
        "arith.addf" | "arith.subf" | "arith.mulf" | "arith.divf" | "arith.remf"
        | "arith.maximumf" | "arith.minimumf" | "arith.negf" | "arith.cmpf" => FASTMATH,
        "arith.addi" | "arith.subi" | "arith.muli" | "arith.trunci" | "arith.shli" => OVERFLOW,
        _ => &[],
    }
}

/// The per-version downgrade rules of jaxlib's mosaic-serde, for the ops tpu-kernel emits: the attributes
/// of op `name` (`value_of` gives an attribute's text) to drop at `version`, or an error when the op
/// cannot be expressed there. Our ops are built in the newest form ([`MAX_VERSION`]). Rules of older
/// versions than [`MIN_VERSION`] (`tpu.iota` < 6, `vector.multi_reduction` < 3, i1 `arith.constant` < 10)
/// are out of range and deliberately not implemented. (jaxlib's v11 rule on `add` is for `tpu.store`, not
/// the `tpu.vector_store` we emit, which keeps `add` at every version.)
pub fn downgrade_drops(
    name: &str,
    value_of: impl Fn(&str) -> Option<String>,
    version: i64,
) -> Result<&'static [&'static str]> {
    match name {
        // v13 added `transpose_lhs_hint`.
        "tpu.matmul" if version < 13 => {
            if value_of("transpose_lhs_hint").as_deref() == Some("true") {
                return Err(kerr!(
                    Unsupported,
                    "`transpose_lhs_hint = true` needs stable_mosaic version >= 13"
                ));
            }
            Ok(&["transpose_lhs_hint"])
        }
        _ => Ok(&[]),
    }
}

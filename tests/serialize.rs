//! The serialized forms of a kernel, checked without the Python toolchain (which checks them against
//! jaxlib and libtpu in python/tests): body header and op names, backend_config fields, StableHLO text.

mod common;

use tpu_kernel::runtime::serialize::{
    body, CallOptions, CustomCall, FlagValue, SideEffects, DEFAULT_VERSION, MAX_VERSION,
    MIN_VERSION,
};
use tpu_kernel::ErrorKind;

fn matmul() -> tpu_kernel::PallasCall {
    common::matmul::build().expect("matmul builds")
}

#[test]
fn body_is_mlir_bytecode_v0_in_the_stable_mosaic_form() {
    let call = matmul();
    let bytes = CustomCall::new(call.ir()).body().expect("body");
    assert_eq!(&bytes[..4], b"ML\xefR", "MLIR bytecode magic");
    assert_eq!(
        bytes[4], 0x01,
        "bytecode format version 0 (varint), as jax writes it"
    );
    let text = CustomCall::new(call.ir()).body_text().expect("body text");
    assert!(text.contains(&format!("stable_mosaic.version = {DEFAULT_VERSION} : i64")));
    for op in [
        "stable_mosaic.func.func",
        "stable_mosaic.tpu.matmul",
        "stable_mosaic.tpu.vector_store",
        "stable_mosaic.scf.if",
    ] {
        assert!(text.contains(&format!("\"{op}\"")), "{op} missing:\n{text}");
    }
    // Every op but the module is mangled; jaxlib's inherent defaults are written out.
    assert!(!text.contains("\"func.func\"") && !text.contains("\"tpu.matmul\""));
    assert!(text.contains("transpose_lhs = false") && text.contains("add = false"));
}

#[test]
fn versions_outside_the_supported_range_are_errors() {
    let call = matmul();
    for v in [MIN_VERSION - 1, MAX_VERSION + 1] {
        let opts = CallOptions {
            version: v,
            ..CallOptions::default()
        };
        let err = CustomCall::with_options(call.ir(), opts)
            .body()
            .expect_err("out of range");
        assert_eq!(err.kind, ErrorKind::Unsupported);
    }
    // Below 13, tpu.matmul loses `transpose_lhs_hint` (jaxlib's downgrade rule).
    let old = body::body_text(call.ir(), 12).expect("v12");
    assert!(!old.contains("transpose_lhs_hint") && old.contains("stable_mosaic.version = 12"));
    assert!(body::body_text(call.ir(), 13)
        .expect("v13")
        .contains("transpose_lhs_hint = false"));
}

#[test]
fn backend_config_has_the_pallas_fields() {
    let call = matmul();
    let cfg = CustomCall::new(call.ir()).backend_config().expect("config");
    assert!(
        cfg.starts_with("{\"custom_call_config\":{\"body\":\"TUzvUg"),
        "{}",
        &cfg[..80]
    );
    assert!(cfg.contains("\"serialization_format\":1,\"needs_layout_passes\":true}"));
    // The VMEM limit our checks used is always written (16 MiB default).
    assert!(cfg.contains(
        "\"scoped_memory_configs\":[{\"memory_space\":1,\"offset\":0,\"size\":16777216}]"
    ));
    // The matmul example declares a cost estimate; jax writes it with sorted keys.
    assert!(cfg.contains(
        "\"cost_estimate\":{\"bytes_accessed\":1572864,\"flops\":268435456,\"remote_bytes_transferred\":0,\"transcendentals\":0}"
    ), "{cfg}");
    // Optional fields only when set.
    let mut plain = call.ir().clone();
    plain.cost_estimate = None;
    let plain_cfg = CustomCall::new(&plain).backend_config().expect("config");
    assert!(!plain_cfg.contains("cost_estimate"));
    for key in [
        "flag_configs",
        "allow_input_fusion",
        "has_communication",
        "input_memory_space_colors",
    ] {
        assert!(!cfg.contains(key), "{key} written although unset");
    }
    let opts = CallOptions {
        flags: vec![(
            "XLA_TPU_FORCE_LP_LLO_SCHEDULER".into(),
            FlagValue::Bool(true),
        )],
        allow_input_fusion: Some(vec![true, false]),
        ..CallOptions::default()
    };
    let cfg = CustomCall::with_options(call.ir(), opts)
        .backend_config()
        .expect("config");
    assert!(cfg.contains("\"allow_input_fusion\":[true,false]"));
    assert!(cfg.contains("\"flag_configs\":[{\"flag_type\":\"XLA_TPU_FORCE_LP_LLO_SCHEDULER\",\"value\":{\"boolean_value\":true}}]"));
}

#[test]
fn stablehlo_calls_the_kernel() {
    let call = matmul();
    let opts = CallOptions {
        side_effects: SideEffects::SideEffecting,
        ..CallOptions::default()
    };
    let hlo = CustomCall::with_options(call.ir(), opts)
        .stablehlo()
        .expect("stablehlo");
    assert!(hlo.contains("func.func public @main(%arg0: tensor<512x512xbf16>, %arg1: tensor<512x512xbf16>) -> (tensor<512x512xbf16>"));
    assert!(hlo.contains("call_target_name = \"tpu_custom_call\""));
    assert!(hlo.contains("api_version = 1 : i32"));
    assert!(hlo.contains("kernel_name = \"matmul_kernel\""));
    assert!(hlo.contains(
        "operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]"
    ));
    assert!(hlo.contains("has_side_effect = true"));
    // The JSON sits in an MLIR string: its quotes are escaped.
    assert!(hlo.contains("backend_config = \"{\\22custom_call_config\\22:"));
}

#[test]
fn aliases_must_name_matching_operands() {
    let call = common::add::build().expect("add builds");
    let ok = CallOptions {
        input_output_aliases: vec![(0, 0)],
        ..CallOptions::default()
    };
    let hlo = CustomCall::with_options(call.ir(), ok)
        .stablehlo()
        .expect("aliased");
    assert!(hlo.contains("output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0, operand_tuple_indices = []>]"));
    let bad = CallOptions {
        input_output_aliases: vec![(2, 0)],
        ..CallOptions::default()
    };
    let err = CustomCall::with_options(call.ir(), bad)
        .stablehlo()
        .expect_err("no input 2");
    assert_eq!(err.kind, ErrorKind::Signature);
}

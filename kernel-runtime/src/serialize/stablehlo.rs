//! The StableHLO text of a complete program calling the kernel: `func.func public @main` takes the
//! kernel's inputs and returns its outputs through one `stablehlo.custom_call @tpu_custom_call`
//! (api_version 1, row-major operand/result layouts, output-operand aliases, `kernel_name`) — the module
//! `jax.jit(pallas_fn).lower(..)` produces for the same kernel.

use super::{config, CallOptions, SideEffects};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{Kernel, Operand};
use crate::mosaic::text::{mlir_string, symbol};
use std::fmt::Write;

pub fn stablehlo(k: &Kernel, opts: &CallOptions) -> Result<String> {
    let backend_config = config::backend_config(k, opts)?;
    let inputs: Vec<&Operand> = k.inputs().collect();
    let outputs: Vec<&Operand> = k.outputs().collect();
    let in_types: Vec<String> = inputs.iter().map(|o| tensor_type(o)).collect();
    let out_types: Vec<String> = outputs.iter().map(|o| tensor_type(o)).collect();

    let args = in_types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%arg{i}: {t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let results = out_types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let info = if out_types.len() == 1 {
                "result".to_string()
            } else {
                format!("[{i}]")
            };
            format!("{t} {{jax.result_info = \"{info}\"}}")
        })
        .collect::<Vec<_>>()
        .join(", ");

    let mut attrs = vec![
        ("backend_config".to_string(), mlir_string(&backend_config)),
        (
            "call_target_name".to_string(),
            "\"tpu_custom_call\"".to_string(),
        ),
        ("api_version".to_string(), "1 : i32".to_string()),
        ("kernel_name".to_string(), mlir_string(&k.name)),
        ("operand_layouts".to_string(), layouts(&inputs)),
        ("result_layouts".to_string(), layouts(&outputs)),
    ];
    if opts.side_effects != SideEffects::Pure {
        attrs.push(("has_side_effect".into(), "true".into()));
    }
    if opts.side_effects == SideEffects::Dataflow {
        attrs.push((
            "mhlo.frontend_attributes".into(),
            "{xla_allow_dce_side_effecting_op = \"true\"}".into(),
        ));
    }
    if !opts.input_output_aliases.is_empty() {
        let tuple = outputs.len() > 1;
        let aliases = opts
            .input_output_aliases
            .iter()
            .map(|(i, o)| {
                let out_idx = if tuple { format!("[{o}]") } else { "[]".into() };
                format!("#stablehlo.output_operand_alias<output_tuple_indices = {out_idx}, operand_index = {i}, operand_tuple_indices = []>")
            })
            .collect::<Vec<_>>()
            .join(", ");
        attrs.push(("output_operand_aliases".into(), format!("[{aliases}]")));
    }
    let attrs = attrs
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let operands = (0..inputs.len())
        .map(|i| format!("%arg{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let (result_lhs, returned) = match outputs.len() {
        1 => ("%0".to_string(), "%0".to_string()),
        n => (
            format!("%0:{n}"),
            (0..n)
                .map(|i| format!("%0#{i}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
    };
    let fn_results = if out_types.len() == 1 {
        out_types[0].clone()
    } else {
        format!("({})", out_types.join(", "))
    };

    let mut s = String::new();
    let module_name = symbol(&format!("jit_{}", k.name));
    // `write!` to a String cannot fail.
    let _ = writeln!(s, "module @{module_name} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{");
    let _ = writeln!(s, "  func.func public @main({args}) -> ({results}) {{");
    let _ = writeln!(
        s,
        "    {result_lhs} = \"stablehlo.custom_call\"({operands}) {{{attrs}}} : ({}) -> {fn_results}",
        in_types.join(", ")
    );
    let _ = writeln!(
        s,
        "    \"func.return\"({returned}) : ({}) -> ()",
        out_types.join(", ")
    );
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "}}");
    Ok(s)
}

/// The StableHLO element type of an array crossing the kernel boundary (unsigned stays unsigned here;
/// inside the kernel Mosaic uses signless integers).
pub fn element_type(d: DType) -> &'static str {
    d.stablehlo()
}

fn tensor_type(o: &Operand) -> String {
    let dims: String = o.shape.iter().map(|d| format!("{d}x")).collect();
    format!("tensor<{dims}{}>", element_type(o.dtype))
}

/// Row-major (`{n-1, ..., 0}`) layouts, as jax gives the custom call.
fn layouts(ops: &[&Operand]) -> String {
    let each = ops
        .iter()
        .map(|o| {
            let r = o.shape.len();
            let dims = (0..r)
                .rev()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            format!("dense<[{dims}]> : tensor<{r}xindex>")
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("[{each}]")
}

//! The `tpu_custom_call` backend_config JSON, field for field as jax's `CustomCallBackendConfig.to_json`
//! writes it (same keys, same order; optional keys only when set).

use super::{body, CallOptions, FlagValue, MemoryColor};
use crate::error::{kerr, Result};
use crate::ir::{Kernel, MemSpace};
use base64::Engine;
use serde_json::{json, Map, Value};

/// `{"custom_call_config": {...}, "scoped_memory_configs": [...], "flag_configs": [...]}`.
pub fn backend_config(k: &Kernel, opts: &CallOptions) -> Result<String> {
    validate(k, opts)?;
    let body = body::body_bytecode(k, opts.version)?;
    let mut cc = Map::new();
    // The body (base64: nothing to escape) is spliced into the JSON text afterwards rather than passed
    // through serde's per-character string escaping, the slowest step of writing the config.
    cc.insert("body".into(), Value::String(String::new()));
    if opts.has_communication || k.communicates() {
        cc.insert("has_communication".into(), json!(true));
    }
    if let Some(id) = opts.collective_id.or(k.collective_id) {
        cc.insert("collective_id".into(), json!(id));
    }
    if let Some(c) = &k.cost_estimate {
        // jax writes the cost estimate with sorted keys.
        cc.insert(
            "cost_estimate".into(),
            json!({
                "bytes_accessed": c.bytes_accessed,
                "flops": c.flops,
                "remote_bytes_transferred": 0,
                "transcendentals": c.transcendentals,
            }),
        );
    }
    if opts.needs_hlo_passes {
        cc.insert("needs_hlo_passes".into(), json!(true));
    }
    cc.insert("serialization_format".into(), json!(1));
    cc.insert("needs_layout_passes".into(), json!(true));
    if let Some(fusion) = &opts.allow_input_fusion {
        cc.insert("allow_input_fusion".into(), json!(fusion));
    }
    if let Some(bytes) = opts.internal_scratch_in_bytes {
        cc.insert("internal_scratch_in_bytes".into(), json!(bytes));
    }
    let out_colors = output_memory_colors(k);
    if !out_colors.is_empty() {
        let tuple = k.outputs().count() > 1;
        let list: Vec<Value> = out_colors
            .iter()
            .map(|(i, c)| {
                if tuple {
                    json!({"color": *c as u8, "shape_index": [i]})
                } else {
                    json!({"color": *c as u8})
                }
            })
            .collect();
        cc.insert("output_memory_space_colors".into(), Value::Array(list));
    }
    let in_colors = input_memory_colors(k);
    if !in_colors.is_empty() {
        let list: Vec<Value> = in_colors
            .iter()
            .map(|(i, c)| json!({"operand_index": i, "color": *c as u8}))
            .collect();
        cc.insert("input_memory_space_colors".into(), Value::Array(list));
    }
    if opts.disable_bounds_checks {
        cc.insert("disable_bounds_checks".into(), json!(true));
    }
    if opts.disable_semaphore_checks {
        cc.insert("disable_semaphore_checks".into(), json!(true));
    }
    if opts.skip_device_barrier {
        cc.insert("skip_device_barrier".into(), json!(true));
    }

    let mut top = Map::new();
    top.insert("custom_call_config".into(), Value::Object(cc));
    // Always the limit our checks used (`check::vmem_limit`: the launch's, else the kernel's target's
    // default, which is libtpu's own default for that generation — 16 MiB on v5e, 32 MiB on v6e and
    // tpu7x, measured). Written out, libtpu enforces exactly the budget `build()` checked, even when
    // the program is compiled for another generation than the kernel was built for. Pallas writes the
    // key only when `vmem_limit_bytes` is set (and otherwise emits the same config on every
    // generation).
    top.insert(
        "scoped_memory_configs".into(),
        json!([{"memory_space": MemoryColor::Vmem as u8, "offset": 0, "size": crate::check::vmem_limit(k)}]),
    );
    if !opts.flags.is_empty() {
        let flags: Vec<Value> = opts
            .flags
            .iter()
            .map(|(name, v)| {
                let value = match v {
                    FlagValue::Bool(b) => json!({"boolean_value": b}),
                    FlagValue::Int(i) => json!({"integer_value": i}),
                    FlagValue::Double(d) => json!({"double_value": d}),
                };
                json!({"flag_type": name, "value": value})
            })
            .collect();
        top.insert("flag_configs".into(), Value::Array(flags));
    }
    let json = serde_json::to_string(&Value::Object(top))
        .map_err(|e| kerr!(Lowering, "writing the backend_config JSON: {e}"))?;
    const OPEN: &str = r#"{"custom_call_config":{"body":""#;
    let rest = json
        .strip_prefix(OPEN)
        .and_then(|r| r.strip_prefix('"'))
        .ok_or_else(|| kerr!(Lowering, "backend_config JSON does not start with its body"))?;
    let mut out = String::with_capacity(json.len() + body.len() * 4 / 3 + 4);
    out.push_str(OPEN);
    base64::engine::general_purpose::STANDARD.encode_string(body, &mut out);
    out.push('"');
    out.push_str(rest);
    Ok(out)
}

/// Whole-array inputs placed in a memory space other than `ANY` get a color (SMEM is left out, as jax
/// does: XLA does not page SMEM arrays). Blocked inputs are pipelined from HBM and get none.
pub fn input_memory_colors(k: &Kernel) -> Vec<(usize, MemoryColor)> {
    k.inputs()
        .enumerate()
        .filter_map(|(i, o)| {
            whole_array_color(o)
                .filter(|c| *c != MemoryColor::Smem)
                .map(|c| (i, c))
        })
        .collect()
}

pub fn output_memory_colors(k: &Kernel) -> Vec<(usize, MemoryColor)> {
    k.outputs()
        .enumerate()
        .filter_map(|(i, o)| whole_array_color(o).map(|c| (i, c)))
        .collect()
}

fn whole_array_color(o: &crate::ir::Operand) -> Option<MemoryColor> {
    match (&o.block, o.space) {
        (Some(_), _) | (None, MemSpace::Any | MemSpace::Sem(_)) => None,
        (None, MemSpace::Vmem) => Some(MemoryColor::Vmem),
        (None, MemSpace::Smem) => Some(MemoryColor::Smem),
    }
}

/// Options that refer to operands must name existing ones.
pub fn validate(k: &Kernel, opts: &CallOptions) -> Result<()> {
    let inputs: Vec<_> = k.inputs().collect();
    let outputs: Vec<_> = k.outputs().collect();
    if let Some(f) = &opts.allow_input_fusion {
        if f.len() != inputs.len() {
            return Err(kerr!(
                Signature,
                "allow_input_fusion has {} entries but `{}` has {} inputs",
                f.len(),
                k.name,
                inputs.len()
            ));
        }
    }
    let mut seen_out = Vec::new();
    for &(i, o) in &opts.input_output_aliases {
        let (Some(inp), Some(out)) = (inputs.get(i), outputs.get(o)) else {
            return Err(kerr!(
                Signature,
                "input_output_aliases ({i}, {o}): `{}` has {} inputs and {} outputs",
                k.name,
                inputs.len(),
                outputs.len()
            ));
        };
        if inp.shape != out.shape || inp.dtype != out.dtype {
            return Err(kerr!(
                Signature,
                "input {i} ({:?} {}) cannot alias output {o} ({:?} {}): shape and dtype must match",
                inp.shape,
                inp.dtype,
                out.shape,
                out.dtype
            )
            .at(out.loc));
        }
        if seen_out.contains(&o) {
            return Err(kerr!(
                Signature,
                "output {o} is aliased to more than one input"
            ));
        }
        seen_out.push(o);
    }
    Ok(())
}

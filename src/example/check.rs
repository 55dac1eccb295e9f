//! `--check <generation>`: run one kernel through the real toolchain — libtpu's compile of our StableHLO
//! program for a TPU topology (no TPU needed) — and print the verdict, our VMEM estimate beside libtpu's
//! figure, the final LLO op count and the scheduled bundles. On a failure the error is mapped back to
//! the Rust source line (our ops carry `file:line:col` locations).
//!
//! With the `libtpu` feature this is Rust only: `kernel_runtime::libtpu` loads libtpu's shared library
//! (its PJRT C API) in a worker process — this very executable, re-run in worker mode. Without it, the
//! kernel is handed to `python/check_kernel.py` (jax/jaxlib/libtpu in the repo's `.venv`), which also
//! runs jaxlib's strict verify of the Mosaic text.

use crate::{check as rules, KernelError, PallasCall};
use kernel_runtime::error::ErrorKind;
use kernel_runtime::serialize::CustomCall;
use std::path::PathBuf;
#[cfg(all(feature = "mlir", not(feature = "libtpu")))]
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Check `call` for `generation` (as the Python path below does) through libtpu from Rust.
#[cfg(feature = "libtpu")]
pub fn run(call: &PallasCall, generation: &str) -> Result<String, KernelError> {
    use kernel_runtime::libtpu;
    let topology = if generation.contains(':') {
        generation.to_string()
    } else {
        call.target().info().topology.to_string()
    };
    let hlo = CustomCall::new(call.ir()).stablehlo()?;
    let compiler = libtpu::Compiler::new(1)?;
    let r = compiler.compile(&hlo, &topology)?;
    let kib =
        |n: Option<u64>| n.map_or("?".to_string(), |n| format!("{:.1} KiB", n as f64 / 1024.0));
    let mut out = format!(
        "kernel `{}` on {topology} (libtpu {}, through its PJRT C API; no Python)\n",
        call.name(),
        compiler.library().display()
    );
    if r.ok {
        out += &format!("  libtpu compile: ok ({:.0} ms)\n", r.compile_ms);
    } else {
        let what = if r.aborted { "ABORTED" } else { "REJECTED" };
        out += &format!("  libtpu compile: {what} ({:.0} ms)\n", r.compile_ms);
        out += &indent(r.error.as_deref().unwrap_or(""));
        let mut where_: Vec<(String, String)> = r
            .rust_locations()
            .into_iter()
            .map(|(p, l, c)| {
                let loc = format!("{p}:{l}:{c}");
                let line = source_line(&p, l);
                (loc, line)
            })
            .collect();
        let err = r.error.as_deref().unwrap_or("");
        for o in &call.ir().operands {
            let label = o.label();
            if err.contains(&label) {
                where_.push((o.loc.to_string(), format!("({label})")));
            }
        }
        if err.contains("E1001") {
            where_.push((
                call.ir().body.loc.to_string(),
                "(the launch: its blocks and scratch do not fit the VMEM limit)".to_string(),
            ));
        }
        if !where_.is_empty() {
            out += "  in the Rust source:\n";
            for (loc, note) in where_ {
                out += &format!("    {loc}    {note}\n");
            }
        }
    }
    let limit = rules::vmem_limit(call.ir());
    let used = if r.ok {
        r.used_vmem_bytes
    } else {
        oom_bytes(r.error.as_deref().unwrap_or(""))
    };
    out += &format!(
        "  VMEM: estimated {} (tpu-kernel), used {} (libtpu), limit {}\n",
        kib(Some(call.vmem_estimate())),
        kib(used),
        kib(Some(limit as u64))
    );
    match &r.llo_counts {
        Some(counts) => {
            let mut top: Vec<(&String, &u64)> = counts.iter().collect();
            top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let top: Vec<String> = top
                .iter()
                .take(6)
                .map(|(k, v)| format!("{} {v}", k.trim_start_matches("llo.")))
                .collect();
            out += &format!(
                "  LLO ops (post-finalize-llo): {}   [{}]\n",
                r.llo_total().unwrap_or(0),
                top.join(", ")
            );
        }
        None => out += "  LLO ops: - (no post-finalize-llo dump)\n",
    }
    if let Some(b) = r.bundles {
        out += &format!("  scheduled bundles (final schedule of the custom call): {b}\n");
    }
    let out = out.trim_end().to_string();
    if r.ok {
        Ok(out)
    } else {
        Err(KernelError::new(
            ErrorKind::Lowering,
            format!("the real toolchain rejected `{}`\n{out}", call.name()),
        ))
    }
}

/// The scoped VMEM allocation libtpu reports in an E1001 error (`Scoped allocation with size 1.5M`).
#[cfg(feature = "libtpu")]
fn oom_bytes(error: &str) -> Option<u64> {
    let rest = &error[error.find("Scoped allocation with size ")? + 28..];
    let n = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let v: f64 = rest[..n].parse().ok()?;
    let scale = match rest.as_bytes().get(n) {
        Some(b'K') => 1u64 << 10,
        Some(b'M') => 1 << 20,
        Some(b'G') => 1 << 30,
        _ => 1,
    };
    Some((v * scale as f64) as u64)
}

#[cfg(feature = "libtpu")]
fn source_line(path: &str, line: u32) -> String {
    [PathBuf::from(path), PathBuf::from(REPO).join(path)]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| {
            text.lines()
                .nth(line.saturating_sub(1) as usize)
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_default()
}

#[cfg(feature = "libtpu")]
fn indent(s: &str) -> String {
    s.lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("Source Location Trace"))
        .take(40)
        .map(|l| format!("    {l}\n"))
        .collect()
}

#[cfg(all(feature = "mlir", not(feature = "libtpu")))]
/// The Python with jax/jaxlib/libtpu: `$TPU_KERNEL_PYTHON`, else the repo's `.venv`.
fn python() -> Result<PathBuf, KernelError> {
    if let Some(p) = std::env::var_os("TPU_KERNEL_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    let venv = PathBuf::from(REPO).join(".venv/bin/python");
    if venv.exists() {
        Ok(venv)
    } else {
        Err(KernelError::new(
            ErrorKind::Unsupported,
            format!(
                "--check needs the Python toolchain: run `scripts/setup.sh --python` (no {})",
                venv.display()
            ),
        ))
    }
}

#[cfg(all(feature = "mlir", not(feature = "libtpu")))]
fn io_error(what: &str, e: std::io::Error) -> KernelError {
    KernelError::new(ErrorKind::Unsupported, format!("--check: {what}: {e}"))
}

/// Check `call` for `generation` (`v4`, `v5e`, `v5p`, `v6e`, `tpu7x`: the topology of its target row,
/// or a topology such as `v5e:2x2`); the report, or the report as an error when a stage rejects the
/// kernel. The kernel is built for that generation (`Command::target`).
#[cfg(all(feature = "mlir", not(feature = "libtpu")))]
pub fn run_python(call: &PallasCall, generation: &str) -> Result<String, KernelError> {
    let topology = if generation.contains(':') {
        generation.to_string()
    } else {
        call.target().info().topology.to_string()
    };
    let mosaic = call.mosaic_mlir_generic()?;
    let hlo = CustomCall::new(call.ir()).stablehlo()?;
    let dir = std::env::temp_dir().join(format!(
        "tpu-kernel-check-{}-{}",
        call.name(),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| io_error("creating a temporary directory", e))?;
    let (mosaic_path, hlo_path) = (dir.join("kernel.mlir"), dir.join("stablehlo.mlir"));
    std::fs::write(&mosaic_path, &mosaic).map_err(|e| io_error("writing the Mosaic text", e))?;
    std::fs::write(&hlo_path, &hlo).map_err(|e| io_error("writing the StableHLO", e))?;

    let script = PathBuf::from(REPO).join("python/check_kernel.py");
    let output = Command::new(python()?)
        .arg(&script)
        .args(["--generation", &topology, "--name", call.name()])
        .arg("--mosaic")
        .arg(&mosaic_path)
        .arg("--stablehlo")
        .arg(&hlo_path)
        .args(["--vmem-estimate", &call.vmem_estimate().to_string()])
        .args(["--vmem-limit", &rules::vmem_limit(call.ir()).to_string()])
        .args(["--launch", &call.ir().body.loc.to_string()])
        .args(
            call.ir()
                .operands
                .iter()
                .flat_map(|o| ["--operand".to_string(), format!("{}={}", o.label(), o.loc)]),
        )
        .output()
        .map_err(|e| io_error(&format!("running {}", script.display()), e))?;
    let _ = std::fs::remove_dir_all(&dir);
    let report = String::from_utf8_lossy(&output.stdout)
        .trim_end()
        .to_string();
    match output.status.code() {
        Some(0) => Ok(report),
        Some(1) => Err(KernelError::new(
            ErrorKind::Lowering,
            format!("the real toolchain rejected `{}`\n{report}", call.name()),
        )),
        _ => Err(KernelError::new(
            ErrorKind::Unsupported,
            format!(
                "--check could not run the toolchain:\n{report}\n{}",
                String::from_utf8_lossy(&output.stderr).trim_end()
            ),
        )),
    }
}

//! `--check <generation>`: run one kernel through the real toolchain — jaxlib's strict verify of the Mosaic
//! text, then libtpu's compile of our StableHLO program for a TPU topology (no TPU needed) — and print the
//! verdicts, our VMEM estimate beside libtpu's figure, and the final LLO op count. On a failure the
//! Mosaic error is mapped back to the Rust source line (our ops carry `file:line:col` locations).
//!
//! The toolchain is Python (jax/jaxlib/libtpu in the repo's `.venv`, made by `scripts/setup.sh
//! --python`); this file only hands the kernel over to `python/check_kernel.py`.

use crate::{check as rules, KernelError, PallasCall};
use kernel_runtime::error::ErrorKind;
use kernel_runtime::serialize::CustomCall;
use std::path::PathBuf;
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

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

fn io_error(what: &str, e: std::io::Error) -> KernelError {
    KernelError::new(ErrorKind::Unsupported, format!("--check: {what}: {e}"))
}

/// Check `call` for `generation` (`v4`, `v5e`, `v5p`, `v6e`, `tpu7x`: the topology of its target row,
/// or a topology such as `v5e:2x2`); the report, or the report as an error when a stage rejects the
/// kernel. The kernel is built for that generation (`Command::target`).
pub fn run(call: &PallasCall, generation: &str) -> Result<String, KernelError> {
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

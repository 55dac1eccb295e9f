//! The command line shared by the example binaries: a summary by default, `--emit mlir` for the Mosaic
//! module only (the exact contract; `--emit mlir-generic` the same module in MLIR's generic op form, which
//! jaxlib's MLIR parses whatever an op's custom syntax), `--emit ir` for the kernel IR, `--emit stablehlo` for the StableHLO
//! program calling the kernel, `--emit config` for the `tpu_custom_call` backend_config JSON, `--emit body`
//! for the serialized (stable_mosaic) body as generic text, `--emit plan` for the CPU interpreter's
//! execution plan (row bands, parallel axes, fused chains, sunk stores, in-place dots), `--check <v5e|v6e|...>` to run the kernel
//! through the real toolchain (jaxlib verify + libtpu compile, see `check`), and `--run` to execute it on
//! the CPU against the plain-Rust reference (see `run`): in interpret mode, or with `--engine mosaic` the
//! exact Mosaic module that ships, JIT-compiled (`kernel_runtime::mosaic_cpu`).
//!
//! `--target <v4|v5e|v5p|v6e|tpu7x>` builds the kernel for that TPU generation (its launch runs in
//! `Target::scope`); `--check <generation>` builds for the generation it compiles for. Without either,
//! the default target (v5e).

#[cfg(any(feature = "mlir", feature = "libtpu"))]
mod check;
mod run;

use crate::{KernelError, PallasCall, Target};
use kernel_runtime::serialize::CustomCall;
use std::process::ExitCode;

const USAGE: &str = "usage: <example> [--target v4|v5e|v5p|v6e|tpu7x] [--emit mlir|mlir-generic|ir|stablehlo|config|body|plan] [--check v4|v5e|v5p|v6e|tpu7x] [--run [--engine interpret|mosaic]]";

/// What to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Emit {
    Summary,
    Mlir,
    /// The Mosaic module in MLIR's generic op form (version-neutral).
    MlirGeneric,
    Ir,
    StableHlo,
    Config,
    Body,
    /// The CPU interpreter's execution plan.
    Plan,
    /// Check through jaxlib and libtpu for a TPU generation (`v5e`, `v6e`, ...; or a topology of one,
    /// `v5e:2x2`).
    Check(String),
    /// Run on the CPU with random inputs, check against the reference, time it.
    Run(Engine),
}

/// What `--run` executes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// The interpreter (the kernel IR with Pallas semantics).
    #[default]
    Interpret,
    /// The Mosaic module that ships, JIT-compiled for the CPU.
    Mosaic,
}

/// What the command line asks for: what to print, and for which target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub emit: Emit,
    /// `--target`, else the generation `--check` compiles for, else none (the default target).
    pub target: Option<Target>,
}

/// Parse the example command line.
pub fn parse_command(args: &[String]) -> Result<Command, String> {
    let mut target = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--target" {
            let name = it
                .next()
                .ok_or_else(|| format!("--target needs a TPU generation; {USAGE}"))?;
            target = Some(Target::parse(name).map_err(|e| format!("{}; {USAGE}", e.message))?);
        } else {
            rest.push(a.clone());
        }
    }
    let emit = parse_args(&rest)?;
    if let Emit::Check(generation) = &emit {
        let checked = generation.split(':').next().unwrap_or_default();
        let checked =
            Target::parse(checked).map_err(|e| format!("--check: {}; {USAGE}", e.message))?;
        match target {
            Some(t) if t != checked => {
                return Err(format!(
                    "--target {t} but --check {generation}: a kernel is checked for the generation it is built for"
                ))
            }
            _ => target = Some(checked),
        }
    }
    Ok(Command { emit, target })
}

/// Parse the example command line's output choice (everything but `--target`).
pub fn parse_args(args: &[String]) -> Result<Emit, String> {
    let mut emit = Emit::Summary;
    let mut engine = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--emit" => {
                emit = match it.next().map(String::as_str) {
                    Some("mlir") => Emit::Mlir,
                    Some("mlir-generic") => Emit::MlirGeneric,
                    Some("ir") => Emit::Ir,
                    Some("stablehlo") => Emit::StableHlo,
                    Some("config") => Emit::Config,
                    Some("body") => Emit::Body,
                    Some("plan") => Emit::Plan,
                    Some(other) => return Err(format!("unknown --emit kind `{other}`; {USAGE}")),
                    None => return Err(format!("--emit needs a value; {USAGE}")),
                }
            }
            "--check" => match it.next() {
                Some(generation) if !generation.starts_with('-') => {
                    emit = Emit::Check(generation.clone())
                }
                _ => {
                    return Err(format!(
                        "--check needs a TPU generation (v4, v5e, v5p, v6e, tpu7x); {USAGE}"
                    ))
                }
            },
            "--run" => emit = Emit::Run(Engine::default()),
            "--engine" => {
                engine = match it.next().map(String::as_str) {
                    Some("interpret") => Some(Engine::Interpret),
                    Some("mosaic") => Some(Engine::Mosaic),
                    _ => return Err(format!("--engine needs `interpret` or `mosaic`; {USAGE}")),
                }
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument `{other}`; {USAGE}")),
        }
    }
    match (&mut emit, engine) {
        (Emit::Run(e), Some(chosen)) => *e = chosen,
        (_, Some(_)) => return Err(format!("--engine goes with --run; {USAGE}")),
        _ => {}
    }
    Ok(emit)
}

/// Run an example: build the kernel, then print what the command line asks for.
pub fn main(build: impl FnOnce() -> Result<PallasCall, KernelError>) -> ExitCode {
    // `--check` compiles in worker processes that are this executable, re-run in worker mode.
    #[cfg(feature = "libtpu")]
    kernel_runtime::libtpu::serve_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_command(&args) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let result = match command.target {
        Some(t) => t.scope(|| run(build, command.emit)),
        None => run(build, command.emit),
    };
    match result {
        Ok(out) => {
            // Not `println!`: a reader that stops early (`| head`) closes the pipe, which is not an
            // error of the example's and must not panic it.
            use std::io::Write;
            match writeln!(std::io::stdout().lock(), "{out}") {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: writing the output: {e}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    build: impl FnOnce() -> Result<PallasCall, KernelError>,
    emit: Emit,
) -> Result<String, KernelError> {
    let call = build()?;
    Ok(match emit {
        Emit::Mlir => mlir_text(&call, false)?,
        Emit::MlirGeneric => mlir_text(&call, true)?,
        Emit::Ir => call.ir().to_string().trim_end().to_string(),
        Emit::StableHlo => CustomCall::new(call.ir())
            .stablehlo()?
            .trim_end()
            .to_string(),
        Emit::Config => CustomCall::new(call.ir()).backend_config()?,
        Emit::Body => body_text(&call)?,
        Emit::Plan => kernel_runtime::interpret::plan_text(
            call.ir(),
            &kernel_runtime::interpret::InterpretOptions::default(),
        )?
        .trim_end()
        .to_string(),
        #[cfg(feature = "libtpu")]
        Emit::Check(generation) => check::run(&call, &generation)?,
        #[cfg(all(feature = "mlir", not(feature = "libtpu")))]
        Emit::Check(generation) => check::run_python(&call, &generation)?,
        #[cfg(not(any(feature = "mlir", feature = "libtpu")))]
        Emit::Check(_) => return Err(needs_feature("libtpu", "--check")),
        Emit::Run(engine) => run::run(&call, engine)?,
        Emit::Summary => format!("{}\n  {}", call.summary(), module_summary(&call)?),
    })
}

/// The summary's line on the Mosaic module: its size as MLIR text when the `mlir` feature is on
/// (the module verified by MLIR), else its op count as lowered.
#[cfg(feature = "mlir")]
fn module_summary(call: &PallasCall) -> Result<String, KernelError> {
    let mlir = call.mosaic_mlir()?;
    let ops = mlir
        .lines()
        .filter(|l| l.contains(" = ") || l.trim_start().starts_with("\"tpu."))
        .count();
    Ok(format!(
        "Mosaic MLIR: {} lines, {ops} ops (verified); print it with `--emit mlir`",
        mlir.lines().count()
    ))
}

#[cfg(not(feature = "mlir"))]
fn module_summary(call: &PallasCall) -> Result<String, KernelError> {
    fn count(b: &kernel_runtime::mosaic::MBlock) -> usize {
        b.ops
            .iter()
            .map(|o| 1 + o.regions.iter().flatten().map(count).sum::<usize>())
            .sum()
    }
    let m = call.mosaic_module()?;
    let ops: usize = m.funcs.iter().map(|f| count(&f.body)).sum();
    Ok(format!(
        "Mosaic module: {} functions, {ops} ops (not verified: MLIR text and verification need \
         tpu-kernel's `mlir` feature)",
        m.funcs.len()
    ))
}

#[cfg(feature = "mlir")]
fn mlir_text(call: &PallasCall, generic: bool) -> Result<String, KernelError> {
    let text = if generic {
        call.mosaic_mlir_generic()?
    } else {
        call.mosaic_mlir()?
    };
    Ok(text.trim_end().to_string())
}

#[cfg(feature = "mlir")]
fn body_text(call: &PallasCall) -> Result<String, KernelError> {
    Ok(CustomCall::new(call.ir())
        .body_text()?
        .trim_end()
        .to_string())
}

#[cfg(not(feature = "mlir"))]
fn mlir_text(_: &PallasCall, generic: bool) -> Result<String, KernelError> {
    Err(needs_feature(
        "mlir",
        if generic {
            "--emit mlir-generic"
        } else {
            "--emit mlir"
        },
    ))
}

#[cfg(not(feature = "mlir"))]
fn body_text(_: &PallasCall) -> Result<String, KernelError> {
    Err(needs_feature("mlir", "--emit body"))
}

/// The error for a command-line option whose engine or writer this build leaves out.
#[cfg(not(all(feature = "mlir", feature = "mosaic-cpu")))]
pub(crate) fn needs_feature(feature: &str, what: &str) -> KernelError {
    KernelError::new(
        crate::ErrorKind::Unsupported,
        format!(
            "{what} needs tpu-kernel's `{feature}` feature (LLVM/MLIR 22 at build time): build with \
             `--features tpu-kernel/{feature}`, or depend on tpu-kernel with `features = [\"{feature}\"]`"
        ),
    )
}

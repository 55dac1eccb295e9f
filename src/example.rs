//! The command line shared by the example binaries: a summary by default, `--emit mlir` for the Mosaic
//! module only (the exact contract), `--emit ir` for the kernel IR.

use crate::{KernelError, PallasCall};
use std::process::ExitCode;

const USAGE: &str = "usage: <example> [--emit mlir|ir]";

/// What to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    Summary,
    Mlir,
    Ir,
}

/// Parse the example command line.
pub fn parse_args(args: &[String]) -> Result<Emit, String> {
    let mut emit = Emit::Summary;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--emit" => {
                emit = match it.next().map(String::as_str) {
                    Some("mlir") => Emit::Mlir,
                    Some("ir") => Emit::Ir,
                    Some(other) => return Err(format!("unknown --emit kind `{other}`; {USAGE}")),
                    None => return Err(format!("--emit needs a value; {USAGE}")),
                }
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument `{other}`; {USAGE}")),
        }
    }
    Ok(emit)
}

/// Run an example: build the kernel, then print what the command line asks for.
pub fn main(build: impl FnOnce() -> Result<PallasCall, KernelError>) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let emit = match parse_args(&args) {
        Ok(e) => e,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    match run(build, emit) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
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
        Emit::Mlir => call.mosaic_mlir()?.trim_end().to_string(),
        Emit::Ir => call.ir().to_string().trim_end().to_string(),
        Emit::Summary => {
            let mlir = call.mosaic_mlir()?;
            let ops = mlir
                .lines()
                .filter(|l| l.contains(" = ") || l.trim_start().starts_with("\"tpu."))
                .count();
            format!(
                "{}\n  Mosaic MLIR: {} lines, {ops} ops (verified); print it with `--emit mlir`",
                call.summary(),
                mlir.lines().count()
            )
        }
    })
}

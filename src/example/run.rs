//! `--run`: execute the kernel on the CPU with random inputs — in interpret mode, or (`--engine mosaic`)
//! its Mosaic module JIT-compiled — check the outputs against the plain-Rust reference for the kernel
//! (see [`crate::reference`]), and report the worst error and the time per run.

use super::Engine;
use crate::reference;
use crate::runtime::interpret::{HostArray, InterpretOptions};
#[cfg(feature = "mosaic-cpu")]
use crate::runtime::mosaic_cpu;
use crate::{ErrorKind, KernelError, PallasCall};
use std::time::Instant;

/// A kernel that talks across devices: every device of its mesh on random inputs of its own
/// (`interpret_spmd`), each device's outputs checked against the reference.
fn run_spmd(call: &PallasCall, engine: Engine) -> Result<String, KernelError> {
    use crate::runtime::interpret::interpret_spmd;
    if !matches!(engine, Engine::Interpret) {
        return Err(KernelError::new(
            ErrorKind::Unsupported,
            "Mosaic-on-CPU runs one device, and this kernel talks to the other devices of its mesh: run it in interpret mode (`--run`), which runs every device",
        ));
    }
    let mesh = call.ir().mesh.clone().ok_or_else(|| {
        KernelError::new(
            ErrorKind::Grid,
            "a kernel that talks across devices without a mesh",
        )
    })?;
    let inputs: Vec<Vec<HostArray>> = (0..mesh.devices())
        .map(|d| reference::random_inputs(call, d as u64))
        .collect();
    let outputs = interpret_spmd(call.ir(), &mesh, &inputs, &InterpretOptions::poisoned())?;
    let (ms, runs) = median_ms(20, || {
        interpret_spmd(call.ir(), &mesh, &inputs, &InterpretOptions::default()).map(drop)
    })?;
    let mut out = format!(
        "kernel `{}` on CPU (interpret mode, every device of the mesh {}, random inputs)\n",
        call.name(),
        mesh.describe()
    );
    let Some(expected) = reference::expected_spmd(call.name(), &inputs) else {
        out +=
            &format!("  no plain-Rust reference for this kernel; not checked\n  time: {ms:.3} ms");
        return Ok(out);
    };
    let (want, tol) = expected?;
    let mut ok = true;
    for (d, (got, want)) in outputs.iter().zip(&want).enumerate() {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            ok &= compared(&mut out, &format!("device {d} output {i}"), (g, w), tol);
        }
    }
    out += &format!("  time: {ms:.3} ms for the whole mesh (median of {runs} runs)");
    if ok {
        Ok(out)
    } else {
        Err(KernelError::new(
            ErrorKind::Shape,
            format!("interpret mode: results differ from the reference\n{out}"),
        ))
    }
}

/// The median time of `f` in ms over at least 3 and at most `max_runs` runs (stopping after 0.5 s),
/// and the number of runs.
fn median_ms(
    max_runs: usize,
    mut f: impl FnMut() -> Result<(), KernelError>,
) -> Result<(f64, usize), KernelError> {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (times.len() < max_runs && start.elapsed().as_secs_f64() < 0.5) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times.len()))
}

/// Compare an output with its reference, adding a line to `out`; whether it is within `tol`.
fn compared(
    out: &mut String,
    label: &str,
    (g, w): (&HostArray, &HostArray),
    tol: reference::Tolerance,
) -> bool {
    let c = reference::compare(g, w, tol);
    *out += &format!(
        "  {label} {:?} {}: max |error| {:.3e} vs reference (tolerance atol {:.0e} + rtol {:.0e}) {}\n",
        g.shape(),
        g.dtype(),
        c.max_abs_error,
        tol.atol,
        tol.rtol,
        if c.ok { "ok" } else { "MISMATCH" }
    );
    c.ok
}

/// One timed run of the chosen engine.
type RunOnce<'a> = dyn Fn(&[HostArray]) -> Result<Vec<HostArray>, KernelError> + 'a;

/// Run `call` on random inputs; an error if it fails or disagrees with its reference.
pub fn run(call: &PallasCall, engine: Engine) -> Result<String, KernelError> {
    if call.ir().communicates() {
        return run_spmd(call, engine);
    }
    let inputs = reference::random_inputs(call, 0);
    let (outputs, how, once): (_, _, Box<RunOnce<'_>>) = match engine {
        Engine::Interpret => (
            // Poisoned first run: a read of never-written memory shows up as a mismatch.
            call.interpret_with(&inputs, &InterpretOptions::poisoned())?,
            "interpret mode".to_string(),
            Box::new(|x| call.interpret(x)),
        ),
        #[cfg(not(feature = "mosaic-cpu"))]
        Engine::Mosaic => return Err(super::needs_feature("mosaic-cpu", "--engine mosaic")),
        #[cfg(feature = "mosaic-cpu")]
        Engine::Mosaic => {
            let compiled = mosaic_cpu::compile(call.ir())?;
            let how = format!(
                "its Mosaic module JIT-compiled in {:.1} ms",
                compiled.compile_time().as_secs_f64() * 1e3
            );
            (
                compiled.run(&inputs)?,
                how,
                Box::new(move |x| compiled.run(x)),
            )
        }
    };
    let (ms, runs) = median_ms(50, || once(&inputs).map(drop))?;
    let mut out = format!("kernel `{}` on CPU ({how}, random inputs)\n", call.name());
    let Some(expected) = reference::expected(call.name(), &inputs) else {
        out += &format!("  no plain-Rust reference for this kernel; not checked\n  time: {ms:.3} ms (median of {runs} runs)");
        return Ok(out);
    };
    let (want, tol) = expected?;
    let mut ok = true;
    for (i, (g, w)) in outputs.iter().zip(&want).enumerate() {
        ok &= compared(&mut out, &format!("output {i}"), (g, w), tol);
    }
    out += &format!("  time: {ms:.3} ms (median of {runs} runs)");
    if ok && outputs.len() == want.len() {
        Ok(out)
    } else {
        Err(KernelError::new(
            ErrorKind::Shape,
            format!("{how}: results differ from the reference\n{out}"),
        ))
    }
}

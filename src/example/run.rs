//! `--run`: execute the kernel on the CPU in interpret mode with random inputs, check the outputs
//! against the plain-Rust reference for the kernel (see [`crate::reference`]), and report the worst error
//! and the time per run.

use crate::reference;
use crate::runtime::interpret::InterpretOptions;
use crate::{ErrorKind, KernelError, PallasCall};
use std::time::Instant;

/// Run `call` on random inputs; an error if it fails or disagrees with its reference.
pub fn run(call: &PallasCall) -> Result<String, KernelError> {
    let inputs = reference::random_inputs(call, 0);
    // Poisoned first run: a read of never-written memory shows up as a mismatch.
    let outputs = call.interpret_with(&inputs, &InterpretOptions::poisoned())?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (times.len() < 50 && start.elapsed().as_secs_f64() < 0.5) {
        let t = Instant::now();
        call.interpret(&inputs)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let ms = times[times.len() / 2];
    let mut out = format!(
        "kernel `{}` on CPU (interpret mode, random inputs)\n",
        call.name()
    );
    let Some(expected) = reference::expected(call.name(), &inputs) else {
        out += &format!("  no plain-Rust reference for this kernel; not checked\n  time: {ms:.3} ms (median of {} runs)", times.len());
        return Ok(out);
    };
    let (want, tol) = expected?;
    let mut ok = true;
    for (i, (g, w)) in outputs.iter().zip(&want).enumerate() {
        let c = reference::compare(g, w, tol);
        ok &= c.ok;
        out += &format!(
            "  output {i} {:?} {}: max |error| {:.3e} vs reference (tolerance atol {:.0e} + rtol {:.0e}) {}\n",
            g.shape(),
            g.dtype(),
            c.max_abs_error,
            tol.atol,
            tol.rtol,
            if c.ok { "ok" } else { "MISMATCH" }
        );
    }
    out += &format!("  time: {ms:.3} ms (median of {} runs)", times.len());
    if ok && outputs.len() == want.len() {
        Ok(out)
    } else {
        Err(KernelError::new(
            ErrorKind::Shape,
            format!("interpret results differ from the reference\n{out}"),
        ))
    }
}

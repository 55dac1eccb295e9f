//! P1, lowering latency, side by side in one run: for each example kernel, ours — build (trace +
//! checks) + lowering to Mosaic + serialization (the stable_mosaic bytecode written straight from the
//! lowered module, base64, the `tpu_custom_call` backend_config), through the same `Library` calls
//! the C ABI answers — vs
//! Pallas trace + lower for TPU of the same kernel (`python/tests/pallas_kernels.py`), with a new
//! signature for every sample on both sides (no cache hit), medians of ≥ 7 samples, and the ratio.
//!
//! ```text
//! cargo bench --bench lowering               # 15 samples per kernel and side
//! cargo bench --bench lowering -- --quick    # 7
//! cargo bench --bench lowering -- --phases   # also ours split into build / backend_config, and
//!                                            # (off the path) the MLIR module + verify the tests run
//! cargo bench --bench lowering -- --loop matmul  # one kernel, warm, phase by phase (for a profiler)
//! ```
//! Pallas runs in `.venv/bin/python benches/pallas_lowering.py` (override with `TPU_KERNEL_PYTHON`; the
//! Pallas twins need the `tpu_kernel` package or the examples library built,
//! `cargo build --release -p tpu-kernel-examples`).
//! Per kernel, two rounds of (our samples, then Pallas's samples), each side keeping its better
//! round: the sides alternate in time, but neither is timed right after the other trashed the caches.
//!
//! **Adding a kernel** is one entry in [`cases`]: its `#[export]` descriptor (the library the bench
//! builds is made of these), its inputs at the example's shapes (`python/tests/pallas_kernels.py`'s
//! `KERNELS` names the same kernel and holds its Pallas twin), and which inputs grow by how many rows
//! per sample so that every sample is a new signature on both sides.

// The example files, as the tests include them.
#[path = "../tests/common/mod.rs"]
mod common;

use common::{
    add, causal_mask, colsum, flash_attention, fori_rowsum, grouped_matmul, matmul, ops_tour,
    paged_attention, quantized_matmul, quantized_matmul_w8a8, rmsnorm, softmax, transpose,
};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;
use tpu_kernel::__private::export::{KernelExport, Library, Request};
use tpu_kernel::runtime::lower;
use tpu_kernel::runtime::mosaic::mlir;
use tpu_kernel::{ArrayType, DType};

/// A kernel at its example's inputs; sample `i` makes the first dimension of each input in `grow`
/// `(i + 1) · step` longer (its own step per input, e.g. rows and the visit tables that follow
/// them), so no sample repeats an earlier signature.
struct Case {
    export: fn() -> KernelExport,
    name: &'static str,
    inputs: Vec<(Vec<usize>, &'static str)>,
    grow: &'static [(usize, usize)],
}

fn cases() -> Vec<Case> {
    let c = |export: fn() -> KernelExport,
             inputs: &[(&[usize], &'static str)],
             grow: &'static [(usize, usize)]| Case {
        export,
        name: export().name,
        inputs: inputs.iter().map(|(s, d)| (s.to_vec(), *d)).collect(),
        grow,
    };
    vec![
        c(
            add::__tpu_kernel_export_add,
            &[(&[1024, 1024], "f32"), (&[1024, 1024], "f32")],
            &[(0, 256), (1, 256)],
        ),
        c(
            matmul::__tpu_kernel_export_matmul,
            &[(&[512, 512], "bf16"), (&[512, 512], "bf16")],
            &[(0, 128)],
        ),
        c(
            softmax::__tpu_kernel_export_softmax,
            &[(&[1024, 1024], "f32")],
            &[(0, 8)],
        ),
        c(
            rmsnorm::__tpu_kernel_export_rmsnorm,
            &[(&[1024, 1024], "bf16"), (&[1, 1024], "f32")],
            &[(0, 16)],
        ),
        c(
            causal_mask::__tpu_kernel_export_causal_mask,
            &[(&[512, 512], "f32")],
            &[(0, 128)],
        ),
        c(
            fori_rowsum::__tpu_kernel_export_fori_rowsum,
            &[(&[256, 1024], "f32")],
            &[(0, 8)],
        ),
        c(
            transpose::__tpu_kernel_export_transpose,
            &[(&[512, 512], "f32")],
            &[(0, 128)],
        ),
        c(
            colsum::__tpu_kernel_export_colsum,
            &[(&[1024, 256], "f32")],
            &[(0, 128)],
        ),
        c(
            ops_tour::__tpu_kernel_export_ops_tour,
            &[(&[256, 128], "f32"), (&[128, 128], "f32")],
            &[(0, 64)],
        ),
        c(
            quantized_matmul::__tpu_kernel_export_quantized_matmul,
            &[
                (&[256, 512], "bf16"),
                (&[512, 512], "i8"),
                (&[1, 512], "f32"),
            ],
            &[(0, 128)],
        ),
        c(
            quantized_matmul_w8a8::__tpu_kernel_export_quantized_matmul_w8a8,
            &[
                (&[256, 512], "i8"),
                (&[256, 1], "f32"),
                (&[512, 512], "i8"),
                (&[1, 512], "f32"),
            ],
            &[(0, 128), (1, 128)],
        ),
        // One more 128-row tile of tokens is one more visit in each table.
        c(
            grouped_matmul::__tpu_kernel_export_grouped_matmul,
            &[
                (&[5], "i32"),
                (&[7], "i32"),
                (&[7], "i32"),
                (&[512, 512], "bf16"),
                (&[4, 512, 512], "bf16"),
            ],
            &[(1, 1), (2, 1), (3, 128)],
        ),
        c(
            flash_attention::__tpu_kernel_export_flash_attention,
            &[
                (&[2, 1024, 128], "bf16"),
                (&[2, 1024, 128], "bf16"),
                (&[2, 1024, 128], "bf16"),
            ],
            &[(0, 1), (1, 1), (2, 1)],
        ),
        // One more sequence: a length, a block-table row and a query.
        c(
            paged_attention::__tpu_kernel_export_paged_attention,
            &[
                (&[8], "i32"),
                (&[8, 32], "i32"),
                (&[8, 16, 128], "bf16"),
                (&[2, 256, 16, 128], "bf16"),
                (&[2, 256, 16, 128], "bf16"),
            ],
            &[(0, 1), (1, 1), (2, 1)],
        ),
    ]
}

impl Case {
    fn shapes(&self, i: usize) -> Vec<(Vec<usize>, &'static str)> {
        let mut s = self.inputs.clone();
        for &(g, step) in self.grow {
            s[g].0[0] += step * (i + 1);
        }
        s
    }
    /// Sample `i`'s input types.
    fn arrays(&self, i: usize) -> Vec<ArrayType> {
        self.shapes(i)
            .iter()
            .map(|(s, d)| ArrayType::new(s, DType::from_name(d).expect("dtype")))
            .collect()
    }
    fn request(&self, i: usize) -> Request {
        Request {
            kernel: self.name.to_string(),
            inputs: self.arrays(i),
            params: Default::default(),
            batch: Vec::new(),
            target: Default::default(),
            executor: Default::default(),
            mesh: None,
        }
    }
}

/// The library of every case's kernel.
fn library() -> Library {
    Library::new("examples", cases().iter().map(|c| (c.export)()).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let samples = if args.iter().any(|a| a == "--quick") {
        7
    } else {
        15
    };
    let phases = args.iter().any(|a| a == "--phases");
    let lib = library();
    if let Some(i) = args.iter().position(|a| a == "--loop") {
        // Profiling aid: each step of one kernel's path over and over, then the whole path.
        let name = args.get(i + 1).map(String::as_str).unwrap_or("add");
        let case = cases().into_iter().find(|c| c.name == name).expect("case");
        let built = lib.build(&case.request(0)).expect("build");
        let k = built.call.ir();
        let time = |what: &str, f: &mut dyn FnMut()| {
            let t = Instant::now();
            for _ in 0..2000 {
                f();
            }
            println!("{name}: {what} {:?} each", t.elapsed() / 2000);
        };
        let export = lib.kernel(name).expect("kernel");
        time("launch fn (trace + checks)", &mut || {
            (export.launch)(&case.arrays(0), &built.params).expect("launch");
        });
        time("lowering to Mosaic as data", &mut || {
            lower::lower_module(k).expect("lower");
        });
        let m = lower::lower_module(k).expect("lower");
        time("body bytecode from the data", &mut || {
            tpu_kernel::runtime::mosaic::bytecode::body(&m, 15).expect("body");
        });
        time(
            "backend_config (all of the above but the launch)",
            &mut || {
                tpu_kernel::runtime::serialize::CustomCall::new(k)
                    .backend_config()
                    .expect("config");
            },
        );
        time("(off the path) MLIR module + verify", &mut || {
            mlir::with_context(|ctx| mlir::build(ctx, &lower::lower_module(k)?).map(|_| ()))
                .expect("mosaic");
        });
        // The whole path on a new signature each time (what the comparison times), back to back, in
        // fresh libraries so that no signature repeats.
        let t = Instant::now();
        for _ in 0..20 {
            let lib = library();
            for i in 0..100 {
                let built = lib.build(&case.request(i + 1)).expect("build");
                built.backend_config(&lib.stats).expect("lower");
            }
        }
        println!(
            "{name}: build + backend_config, new shapes {:?} each",
            t.elapsed() / 2000
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("TPU_KERNEL_PYTHON")
        .unwrap_or_else(|_| root.join(".venv/bin/python").display().to_string());
    let mut child = Command::new(&python)
        .arg(root.join("benches/pallas_lowering.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} (scripts/setup.sh --python makes it): {e}")
        });
    let mut to_py = child.stdin.take().expect("stdin");
    let mut from_py = BufReader::new(child.stdout.take().expect("stdout"));
    let mut pallas = |case: &Case, i: usize| -> Result<f64, String> {
        let shapes: Vec<String> = case
            .shapes(i)
            .iter()
            .map(|(s, d)| format!("[{s:?}, \"{d}\"]"))
            .collect();
        writeln!(to_py, "{} [{}]", case.name, shapes.join(", ")).map_err(|e| e.to_string())?;
        to_py.flush().map_err(|e| e.to_string())?;
        let mut line = String::new();
        from_py.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.is_empty() {
            return Err(
                "the Python side exited (run benches/pallas_lowering.py by hand to see why)".into(),
            );
        }
        line.trim()
            .parse::<f64>()
            .map_err(|_| line.trim().to_string())
    };

    println!(
        "P1 lowering latency: ours (build + lower + serialize) vs Pallas (trace + lower for TPU); \
         new shapes every sample, median of {samples}"
    );
    println!(
        "{:<22} {:>10} {:>12} {:>9}",
        "kernel", "ours µs", "Pallas µs", "Pallas/ours"
    );
    let mut ratios = Vec::new();
    for case in cases() {
        // Warm both sides (first calls load dialects, jax's tracing machinery, ...).
        for i in 1000..1003 {
            let b = lib.build(&case.request(i)).expect("build");
            b.backend_config(&lib.stats).expect("lower");
            let _ = pallas(&case, i);
        }
        // Two rounds, each: our samples back to back, then Pallas's (so neither runs with the other's
        // working set in the caches); each side keeps its better round's median.
        let (mut ours, mut theirs) = (f64::INFINITY, f64::INFINITY);
        let (mut t_build, mut t_mosaic, mut t_config) = (Vec::new(), Vec::new(), Vec::new());
        let mut failed = None;
        for round in 0..2 {
            let first = round * samples;
            let mut o = Vec::new();
            for i in first..first + samples {
                let req = case.request(i);
                let t = Instant::now();
                let built = lib.build(&req).expect("build");
                let tb = Instant::now();
                let cfg = built.backend_config(&lib.stats).expect("lower");
                o.push(t.elapsed().as_secs_f64() * 1e6);
                t_build.push((tb - t).as_secs_f64() * 1e6);
                t_config.push(tb.elapsed().as_secs_f64() * 1e6);
                std::hint::black_box(cfg);
                if phases {
                    // Off the path, for scale: what building and verifying the same kernel's MLIR
                    // module costs (the tests do it; shipping a kernel does not).
                    let t = Instant::now();
                    mlir::with_context(|ctx| {
                        mlir::build(ctx, &lower::lower_module(built.call.ir())?).map(|_| ())
                    })
                    .expect("mosaic");
                    t_mosaic.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            ours = ours.min(median(o));
            let mut p = Vec::new();
            for i in first..first + samples {
                match pallas(&case, i) {
                    Ok(ms) => p.push(ms * 1e3),
                    Err(e) => failed = Some(e),
                }
            }
            if !p.is_empty() {
                theirs = theirs.min(median(p));
            }
        }
        if let Some(e) = failed {
            println!("  Pallas failed on {}: {e}", case.name);
        }
        let (o, p) = (ours, theirs);
        if !p.is_finite() {
            println!("{:<22} {:>10.1} {:>12} {:>9}", case.name, o, "-", "-");
            continue;
        }
        ratios.push(p / o);
        println!("{:<22} {:>10.1} {:>12.1} {:>8.0}×", case.name, o, p, p / o);
        if phases {
            println!(
                "{:<22} build (trace + checks) {:.1} µs | backend_config (lower + bytecode + JSON) {:.1} µs | off the path: MLIR module + verify {:.1} µs",
                "",
                median(t_build),
                median(t_config),
                median(t_mosaic)
            );
        }
    }
    let g = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len().max(1) as f64).exp();
    let worst = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    println!("geomean Pallas/ours {g:.0}×, worst {worst:.0}× (target ≥ 100× on every kernel)");
    drop(to_py);
    let _ = child.wait();
}

//! Interpret-mode speed, side by side in one run: our CPU execution of the example kernels vs XLA:CPU
//! (`jax.jit` of the same jnp computation) vs Pallas `interpret=True`, with ratios and geometric means.
//!
//! ```text
//! cargo bench --bench interpret              # full run (~1 s per case and engine)
//! cargo bench --bench interpret -- --quick   # shorter timing budgets
//! ```
//! The baselines run in `.venv/bin/python` (override with `TPU_KERNEL_PYTHON`; `scripts/setup.sh --python`
//! installs it) from `benches/xla_baselines.py --serve`, interleaved with ours case by case (XLA, ours,
//! Pallas, ours, XLA; each engine keeps its better round) so load from other processes hits both alike;
//! without Python only our column is printed. Each figure is the median of repeated warm runs, and our
//! output is checked against the plain-Rust reference. `--ab` compares fused vs unfused interpretation.

#[path = "../examples/add.rs"]
#[allow(dead_code)]
mod add;
#[path = "../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../examples/rmsnorm.rs"]
#[allow(dead_code)]
mod rmsnorm;
#[path = "../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use tpu_kernel::dtype::{BF16, F32};
use tpu_kernel::reference;
use tpu_kernel::runtime::interpret::InterpretOptions;
use tpu_kernel::{ArrayType, DType, KernelError, PallasCall};

type Build = Box<dyn Fn() -> Result<PallasCall, KernelError>>;

fn at<const R: usize>(shape: [usize; R], dtype: DType) -> ArrayType {
    ArrayType::new(shape, dtype)
}

fn cases() -> Vec<(&'static str, Build)> {
    vec![
        (
            "matmul_bf16_256",
            Box::new(|| {
                matmul::matmul(at([256, 256], BF16), at([256, 256], BF16), (128, 128, 128))
            }),
        ),
        (
            "matmul_bf16_512",
            Box::new(|| {
                matmul::matmul(at([512, 512], BF16), at([512, 512], BF16), (128, 128, 128))
            }),
        ),
        (
            "matmul_bf16_1024",
            Box::new(|| {
                matmul::matmul(
                    at([1024, 1024], BF16),
                    at([1024, 1024], BF16),
                    (128, 128, 128),
                )
            }),
        ),
        (
            "softmax_f32_1024",
            Box::new(|| softmax::softmax(at([1024, 1024], F32), 8)),
        ),
        (
            "rmsnorm_bf16_1024",
            Box::new(|| rmsnorm::rmsnorm(at([1024, 1024], BF16), at([1, 1024], F32), 1e-6, 16)),
        ),
        (
            "add_f32_1024",
            Box::new(|| add::add(at([1024, 1024], F32), at([1024, 1024], F32), (256, 256))),
        ),
    ]
}

/// (median, min) ms of warm runs.
fn times_ms(mut f: impl FnMut(), budget: Duration) -> (f64, f64) {
    f();
    f();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 200) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0])
}

/// The Python baselines as a server (`xla_baselines.py --serve`), so each case's XLA runs sit right
/// next to ours in time.
struct Baselines {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Baselines {
    fn start(quick: bool) -> Result<Self, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = std::env::var("TPU_KERNEL_PYTHON")
            .unwrap_or_else(|_| root.join(".venv/bin/python").display().to_string());
        let mut cmd = Command::new(&python);
        cmd.arg(root.join("benches/xla_baselines.py"))
            .arg("--serve")
            .env("JAX_PLATFORMS", "cpu")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if quick {
            cmd.arg("--quick");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Baselines {
            _child: child,
            stdin,
            stdout,
        })
    }

    /// (median, min) ms of `engine` (`xla` or `pallas`) on `case`.
    fn ask(&mut self, engine: &str, case: &str) -> Option<(f64, f64)> {
        writeln!(self.stdin, "{engine} {case}").ok()?;
        self.stdin.flush().ok()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).ok()?;
        let mut it = line.split_whitespace().map(|x| x.parse::<f64>());
        match (it.next(), it.next()) {
            (Some(Ok(med)), Some(Ok(min))) => Some((med, min)),
            _ => None,
        }
    }
}

/// Of two (median, min) measurements, the round with the lower median (and the lower min).
fn best(a: Option<(f64, f64)>, b: Option<(f64, f64)>) -> Option<(f64, f64)> {
    match (a, b) {
        (Some(x), Some(y)) => Some((x.0.min(y.0), x.1.min(y.1))),
        (x, y) => x.or(y),
    }
}

/// `--ab`: fused vs unfused, interleaved run by run so machine noise hits both alike; min and median.
fn ab_fusion(only: Option<&str>) {
    for (name, build) in cases() {
        if only.is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let Ok(call) = build() else { continue };
        let inputs = reference::random_inputs(&call, 1);
        let opts = |fuse| InterpretOptions {
            fuse,
            ..InterpretOptions::default()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..400 {
            let fuse = i % 2 == 0;
            let o = opts(fuse);
            let t = Instant::now();
            let _ = std::hint::black_box(call.interpret_with(&inputs, &o));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if fuse {
                a.push(ms)
            } else {
                b.push(ms)
            }
        }
        for v in [&mut a, &mut b] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "{name:<19} fused min {:.3} med {:.3} | unfused min {:.3} med {:.3}",
            a[0],
            a[a.len() / 2],
            b[0],
            b[b.len() / 2]
        );
    }
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len().max(1) as f64).exp()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--case NAME` (substring) runs only matching cases; `--ours-only` skips the Python baselines.
    let only = args
        .iter()
        .position(|a| a == "--case")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let ours_only = args.iter().any(|a| a == "--ours-only");
    // `--no-fuse` / `--sequential`: switch interpreter optimizations off (to measure what they buy).
    let opts = InterpretOptions {
        fuse: !args.iter().any(|a| a == "--no-fuse"),
        parallel: !args.iter().any(|a| a == "--sequential"),
        ..InterpretOptions::default()
    };
    let budget = Duration::from_millis(if quick { 300 } else { 1000 });
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if args.iter().any(|a| a == "--ab") {
        ab_fusion(only.as_deref());
        return;
    }
    let mut base = if ours_only {
        Err("--ours-only".to_string())
    } else {
        Baselines::start(quick)
    };
    if let Err(e) = &base {
        eprintln!("baselines unavailable: {e}");
    }
    let mut baseline = HashMap::new();
    let mut rows = Vec::new();
    for (name, build) in cases() {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let call = match build() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{name}: build failed: {e}");
                continue;
            }
        };
        let inputs = reference::random_inputs(&call, 1);
        let out = match call.interpret_with(&inputs, &opts) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("{name}: interpret failed: {e}");
                continue;
            }
        };
        let check = match reference::expected(call.name(), &inputs) {
            Some(Ok((want, tol))) => {
                let c = out
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| reference::compare(g, w, tol));
                c.fold((0.0f64, true), |(e, ok), c| {
                    (e.max(c.max_abs_error), ok && c.ok)
                })
            }
            _ => (f64::NAN, false),
        };
        // Two interleaved rounds (XLA, ours, Pallas, ours, XLA); each engine keeps its better round.
        eprintln!("measuring {name}...");
        let ours_run = || {
            times_ms(
                || {
                    let _ = std::hint::black_box(call.interpret_with(&inputs, &opts));
                },
                budget,
            )
        };
        let mut ask = |engine: &str| base.as_mut().ok().and_then(|b| b.ask(engine, name));
        let xla1 = ask("xla");
        let ours1 = ours_run();
        let pallas = ask("pallas");
        let ours2 = ours_run();
        let xla2 = ask("xla");
        let (ours, ours_min) = best(Some(ours1), Some(ours2)).unwrap_or(ours1);
        if let (Some(x), Some(p)) = (best(xla1, xla2), pallas) {
            baseline.insert(name, (x.0, p.0, x.1));
        }
        rows.push((name, ours, ours_min, check));
    }

    println!(
        "\ninterpret mode on CPU ({threads} threads); ms = median of warm runs, better of two rounds \
         interleaved with XLA's; ratio = time / XLA time (min/min: fastest single runs)"
    );
    println!(
        "{:<19} {:>9} {:>9} {:>10} {:>9} {:>8} {:>10} {:>11} {:>9}",
        "case",
        "ours ms",
        "XLA ms",
        "Pallas ms",
        "ours/XLA",
        "min/min",
        "Pallas/XLA",
        "Pallas/ours",
        "max err"
    );
    let (mut ours_r, mut min_r, mut pallas_r, mut speedup) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, ours, ours_min, (err, ok)) in &rows {
        let b = baseline.get(name).copied();
        let err = format!("{err:.2e}{}", if *ok { "" } else { " FAIL" });
        match b {
            Some((xla, pallas, xla_min)) => {
                ours_r.push(ours / xla);
                min_r.push(ours_min / xla_min);
                pallas_r.push(pallas / xla);
                speedup.push(pallas / ours);
                println!(
                    "{name:<19} {ours:>9.3} {xla:>9.3} {pallas:>10.3} {:>9.2} {:>8.2} {:>10.2} {:>11.1} {err:>9}",
                    ours / xla,
                    ours_min / xla_min,
                    pallas / xla,
                    pallas / ours
                );
            }
            None => println!(
                "{name:<19} {ours:>9.3} {:>9} {:>10} {:>9} {:>8} {:>10} {:>11} {err:>9}",
                "-", "-", "-", "-", "-", "-"
            ),
        }
    }
    if !ours_r.is_empty() {
        println!(
            "{:<19} {:>9} {:>9} {:>10} {:>9.2} {:>8.2} {:>10.2} {:>11.1}",
            "geomean",
            "",
            "",
            "",
            geomean(&ours_r),
            geomean(&min_r),
            geomean(&pallas_r),
            geomean(&speedup)
        );
        let worst = ours_r.iter().copied().fold(0.0, f64::max);
        println!(
            "targets: ours/XLA <= 1.5 on every case ({}, worst {worst:.2}), geomean <= 1.0 ({})",
            if worst <= 1.5 { "met" } else { "NOT met" },
            if geomean(&ours_r) <= 1.0 {
                "met"
            } else {
                "NOT met"
            }
        );
    }
}

//! Interpret-mode speed, side by side in one run: our CPU execution of the example kernels vs XLA:CPU
//! (`jax.jit` of the same jnp computation) vs Pallas `interpret=True`, with ratios and geometric means.
//!
//! ```text
//! cargo bench --bench interpret              # full run (~1 s per case and engine)
//! cargo bench --bench interpret -- --quick   # shorter timing budgets
//! cargo bench --bench interpret -- --case quantized   # only the cases whose name contains `quantized`
//! cargo bench --bench interpret -- --rounds 4         # more interleaved rounds (a loaded machine)
//! ```
//! The baselines run in `.venv/bin/python` (override with `TPU_KERNEL_PYTHON`; `scripts/setup.sh --python`
//! installs it; the Pallas twins also need the `tpu_kernel` package or the examples library built,
//! `cargo build --release -p tpu-kernel-examples`) from `benches/xla_baselines.py --serve`, interleaved with ours case by case (XLA, ours,
//! Pallas, ours, XLA; each engine keeps its better round) so load from other processes hits both alike;
//! without Python only our column is printed. Each figure is the median of repeated warm runs, and our
//! output is checked against the plain-Rust reference. `--ab` compares fused vs unfused interpretation.
//!
//! **Adding a production kernel** (an example with a Pallas twin) at its example's shapes is one entry
//! on each side: its example name in [`EXAMPLE_CASES`] here (the example's `build()` from
//! `tests/common/mod.rs`'s `EXAMPLES`, inputs from `reference::random_inputs`, checked against
//! `reference::expected`), and its name with its jnp program in `EXAMPLE_CASES` of
//! `benches/xla_baselines.py` (the Pallas side is the twin of `python/tests/pallas_kernels.py`, run with
//! `interpret=True`, on that file's shapes and `valid_inputs`).
//!
//! Ragged paged attention (`ragged_paged_attention_decode`, `_mixed`: a vLLM decode step and a mixed
//! batch, `interpret/rpa.rs` and `benches/rpa_cpu.py`) has two XLA programs, tpu-inference's own
//! reference and the best jnp formulation, printed side by side in a table of their own, and no Pallas
//! run (jax's CPU interpreters cannot run the kernel).

// The example files, as the tests include them.
#[path = "../tests/common/mod.rs"]
mod common;

use common::{activations, add, flash_attention, matmul, quantized_matmul, rmsnorm, softmax};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use tpu_kernel::dtype::{BF16, F32};
use tpu_kernel::reference;
use tpu_kernel::runtime::interpret::{HostArray, InterpretOptions};
use tpu_kernel::{ArrayType, DType, KernelError, PallasCall};

// ---------------------------------------------------------------------------------------------- kernels
// Kernels that lean on one transcendental each (the examples cover the rest).
mod transcendental {
    use tpu_kernel::prelude::*;

    /// GELU with erf (`jax.nn.gelu(x, approximate=False)`).
    #[tpu_kernel]
    pub fn gelu_erf_kernel(x: Ref<f32>, o: RefMut<f32>) {
        let x = x.load();
        o.store(0.5 * x * (1.0 + (x * 0.707_106_77).erf()));
    }

    /// SwiGLU's gating: `silu(g) * x` with `silu(g) = g * logistic(g)`.
    #[tpu_kernel]
    pub fn swiglu_kernel(x: Ref<f32>, g: Ref<f32>, o: RefMut<f32>) {
        let g = g.load();
        o.store(g * g.logistic() * x.load());
    }

    /// Soft-capped logits (Gemma 2's final layer): `cap * tanh(x / cap)`, cap 30.
    #[tpu_kernel]
    pub fn softcap_kernel(x: Ref<f32>, o: RefMut<f32>) {
        o.store((x.load() * (1.0 / 30.0)).tanh() * 30.0);
    }

    /// Rotary position embedding of the two halves of each row: angle = position · frequency.
    #[tpu_kernel]
    pub fn rotary_kernel(
        x1: Ref<f32>,
        x2: Ref<f32>,
        pos: Ref<f32>,
        freq: Ref<f32>,
        o1: RefMut<f32>,
        o2: RefMut<f32>,
    ) {
        let theta = pos.load() * freq.load();
        let (c, s) = (theta.cos(), theta.sin());
        let (a, b) = (x1.load(), x2.load());
        o1.store(a * c - b * s);
        o2.store(b * c + a * s);
    }

    /// The per-step cost (issue 22 item 2): a copy over many small blocks that reads its grid index
    /// (each block scaled by its step number + 1), so the steps cannot be merged into larger bands.
    #[tpu_kernel]
    pub fn step_copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
        let k = program_id(0) + 1;
        o.store(x.load() * k.cast::<f32>());
    }

    /// `step_copy_kernel` on f32 `[m, n]`, `bm` rows a step.
    pub fn step_copy(m: usize, n: usize, bm: usize) -> Result<PallasCall, KernelError> {
        pallas_call(step_copy_kernel)
            .grid([m / bm])
            .input(a(m, n), rows(bm, n))
            .output(a(m, n), rows(bm, n))
            .dimension_semantics([Parallel])
            .build()
    }

    fn rows(bm: usize, n: usize) -> BlockSpec<'static> {
        BlockSpec::new([bm, n], |[i]| (i, 0))
    }

    fn a(m: usize, n: usize) -> ArrayType {
        ArrayType::new([m, n], F32)
    }

    /// `gelu_erf_kernel` on f32 `[m, n]`, `bm` rows a step.
    pub fn gelu(m: usize, n: usize, bm: usize) -> Result<PallasCall, KernelError> {
        pallas_call(gelu_erf_kernel)
            .grid([m / bm])
            .input(a(m, n), rows(bm, n))
            .output(a(m, n), rows(bm, n))
            .dimension_semantics([Parallel])
            .build()
    }

    /// `softcap_kernel` on f32 `[m, n]`, `bm` rows a step.
    pub fn softcap(m: usize, n: usize, bm: usize) -> Result<PallasCall, KernelError> {
        pallas_call(softcap_kernel)
            .grid([m / bm])
            .input(a(m, n), rows(bm, n))
            .output(a(m, n), rows(bm, n))
            .dimension_semantics([Parallel])
            .build()
    }

    /// `swiglu_kernel` on f32 `[m, n]` `x` and gate, `bm` rows a step.
    pub fn swiglu(m: usize, n: usize, bm: usize) -> Result<PallasCall, KernelError> {
        pallas_call(swiglu_kernel)
            .grid([m / bm])
            .input(a(m, n), rows(bm, n))
            .input(a(m, n), rows(bm, n))
            .output(a(m, n), rows(bm, n))
            .dimension_semantics([Parallel])
            .build()
    }

    /// `x1, x2: [m, h]`, positions `[m, 1]`, frequencies `[1, h]`.
    pub fn rotary(m: usize, h: usize, bm: usize) -> Result<PallasCall, KernelError> {
        pallas_call(rotary_kernel)
            .grid([m / bm])
            .input(a(m, h), rows(bm, h))
            .input(a(m, h), rows(bm, h))
            .input(ArrayType::new([m, 1], F32), rows(bm, 1))
            .input(
                ArrayType::new([1, h], F32),
                BlockSpec::new([1, h], |[_]| (0, 0)),
            )
            .output(a(m, h), rows(bm, h))
            .output(a(m, h), rows(bm, h))
            .dimension_semantics([Parallel])
            .build()
    }
}

type Build = Box<dyn Fn() -> Result<PallasCall, KernelError>>;

#[path = "interpret/paged_once.rs"]
mod paged_once;
#[path = "interpret/peak.rs"]
mod peak;
#[path = "interpret/rpa.rs"]
mod rpa;

/// `--ops`: every float op of the op table alone on an f32 `[1024, 1024]` array (inputs in (0.5, 4.5)).
mod ops {
    use super::Build;
    use tpu_kernel::prelude::*;

    macro_rules! op_cases {
        (unary { $($u:ident => |$x:ident| $e:expr;)* } binary { $($b:ident => |$p:ident, $q:ident| $f:expr;)* }) => {
            $(
                #[tpu_kernel]
                fn $u(x: Ref<f32>, o: RefMut<f32>) {
                    let $x = x.load();
                    o.store($e);
                }
            )*
            $(
                #[tpu_kernel]
                fn $b(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
                    let ($p, $q) = (x.load(), y.load());
                    o.store($f);
                }
            )*
            pub fn cases() -> Vec<(&'static str, Build)> {
                let a = || ArrayType::new([1024, 1024], F32);
                let spec = || BlockSpec::new([64, 1024], |[i]| (i, 0));
                vec![
                    $((concat!("op_", stringify!($u)), Box::new(move || {
                        pallas_call($u).grid([16]).input(a(), spec()).output(a(), spec())
                            .dimension_semantics([Parallel]).build()
                    }) as Build),)*
                    $((concat!("op_", stringify!($b)), Box::new(move || {
                        pallas_call($b).grid([16]).input(a(), spec()).input(a(), spec())
                            .output(a(), spec()).dimension_semantics([Parallel]).build()
                    }) as Build),)*
                ]
            }
        };
    }
    op_cases! {
        unary {
            neg => |x| -x;
            abs => |x| x.abs();
            sqrt => |x| x.sqrt();
            rsqrt => |x| x.rsqrt();
            exp => |x| x.exp();
            log => |x| x.log();
            tanh => |x| x.tanh();
            sin => |x| x.sin();
            cos => |x| x.cos();
            erf => |x| x.erf();
            log1p => |x| x.log1p();
            logistic => |x| x.logistic();
            floor => |x| x.floor();
            ceil => |x| x.ceil();
            round => |x| x.round();
        }
        binary {
            add => |x, y| x + y;
            sub => |x, y| x - y;
            mul => |x, y| x * y;
            div => |x, y| x / y;
            rem => |x, y| x % y;
            max => |x, y| maximum(x, y);
            min => |x, y| minimum(x, y);
            pow => |x, y| tpu_kernel::prelude::pow(x, y);
        }
    }
}

fn at<const R: usize>(shape: [usize; R], dtype: DType) -> ArrayType {
    ArrayType::new(shape, dtype)
}

fn cases() -> Vec<(&'static str, Build)> {
    let mut cases: Vec<(&'static str, Build)> = vec![
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
        (
            "gelu_erf_f32_1024",
            Box::new(|| transcendental::gelu(1024, 1024, 32)),
        ),
        (
            "swiglu_f32_1024",
            Box::new(|| transcendental::swiglu(1024, 1024, 32)),
        ),
        (
            "softcap_f32_1024",
            Box::new(|| transcendental::softcap(1024, 1024, 32)),
        ),
        (
            "rotary_f32_4096",
            Box::new(|| transcendental::rotary(4096, 128, 256)),
        ),
        ("activations_f32_256", Box::new(activations::build)),
        // Where users are (issue 22): a small matmul, flash attention at [4, 512, 128] with 128-blocks,
        // an int8-weight dequant matmul at 256x512x256, rows 8 lanes wide.
        (
            "matmul_bf16_128",
            Box::new(|| {
                matmul::matmul(at([128, 128], BF16), at([128, 128], BF16), (128, 128, 128))
            }),
        ),
        (
            "flash_attention_4x512",
            Box::new(|| {
                let a = at([4, 512, 128], BF16);
                flash_attention::flash_attention(a.clone(), a.clone(), a, false, (128, 128))
            }),
        ),
        (
            "quantized_matmul_256x512x256",
            Box::new(|| {
                quantized_matmul::quantized_matmul(
                    at([256, 512], BF16),
                    at([512, 256], tpu_kernel::dtype::I8),
                    at([1, 256], F32),
                    (128, 128, 128),
                )
            }),
        ),
        (
            "softmax_lanes8",
            Box::new(|| softmax::softmax(at([8192, 8], F32), 256)),
        ),
        ("paged_decode_wait_once", Box::new(paged_once::build)),
        (
            "step_copy_1024x8x128",
            Box::new(|| transcendental::step_copy(1024 * 8, 128, 8)),
        ),
    ];
    // Ragged paged attention on a vLLM decode step and a mixed batch (issue 23 item 4).
    for name in rpa::CASES {
        cases.push((name, Box::new(move || rpa::build(name))));
    }
    for &name in EXAMPLE_CASES {
        let (_, build) = common::EXAMPLES
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("EXAMPLE_CASES: no example `{name}` in tests/common/mod.rs"));
        cases.push((name, Box::new(*build)));
    }
    cases
}

/// The production kernels benchmarked at their examples' shapes, by example name (see the header).
const EXAMPLE_CASES: &[&str] = &[
    "quantized_matmul",
    "quantized_matmul_w8a8",
    "grouped_matmul",
    "flash_attention",
    "paged_attention",
];

/// The inputs of a case: uniform in [-1, 1) scaled to the range the kernel sees in a model (the same
/// scales as `xla_baselines.py`); rotary gets positions `0..m` and frequencies `10000^(-j/h)`.
fn case_inputs(name: &str, call: &PallasCall) -> Vec<HostArray> {
    if rpa::CASES.contains(&name) {
        return rpa::inputs(name, call);
    }
    let mut inputs = reference::random_inputs(call, 1);
    let scale = |a: &HostArray, k: f32| {
        let v = a.as_slice::<f32>().expect("f32").iter().map(|x| x * k);
        HostArray::from_vec(a.shape(), v.collect::<Vec<f32>>()).expect("shape")
    };
    if name.starts_with("op_") {
        return inputs
            .iter()
            .map(|a| {
                let v = a
                    .as_slice::<f32>()
                    .expect("f32")
                    .iter()
                    .map(|x| x * 2.0 + 2.5);
                HostArray::from_vec(a.shape(), v.collect::<Vec<f32>>()).expect("shape")
            })
            .collect();
    }
    match name {
        "gelu_erf_f32_1024" => inputs[0] = scale(&inputs[0], 3.0),
        "swiglu_f32_1024" => inputs[1] = scale(&inputs[1], 4.0),
        "softcap_f32_1024" => inputs[0] = scale(&inputs[0], 40.0),
        "rotary_f32_4096" => {
            let (m, h) = (inputs[0].shape()[0], inputs[0].shape()[1]);
            let pos = (0..m).map(|i| i as f32).collect::<Vec<f32>>();
            let freq = (0..h).map(|j| 10000f32.powf(-(j as f32) / h as f32));
            inputs[2] = HostArray::from_vec([m, 1], pos).expect("shape");
            inputs[3] = HostArray::from_vec([1, h], freq.collect::<Vec<f32>>()).expect("shape");
        }
        _ => {}
    }
    inputs
}

/// The expected outputs of a bench-only kernel, in f64 from the same f32 inputs (the examples' come from
/// `tpu_kernel::reference`).
fn bench_reference(name: &str, inputs: &[HostArray]) -> Option<Vec<HostArray>> {
    let f = |i: usize| inputs[i].to_f64_vec();
    let out = |shape: &[usize], v: Vec<f64>| {
        HostArray::from_vec(shape, v.into_iter().map(|x| x as f32).collect::<Vec<f32>>())
            .expect("shape")
    };
    let shape = inputs[0].shape();
    let map = |v: Vec<f64>, g: &dyn Fn(f64) -> f64| v.into_iter().map(g).collect::<Vec<_>>();
    Some(match name {
        "gelu_erf_kernel" => vec![out(
            shape,
            map(f(0), &|x| {
                0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
            }),
        )],
        "softcap_kernel" => vec![out(shape, map(f(0), &|x| (x / 30.0).tanh() * 30.0))],
        "step_copy_kernel" => {
            // Block i (8 rows) scaled by i + 1.
            let n = shape[1];
            let v = f(0).into_iter().enumerate();
            vec![out(
                shape,
                v.map(|(t, x)| x * (t / n / 8 + 1) as f64).collect(),
            )]
        }
        "swiglu_kernel" => {
            let (x, g) = (f(0), f(1));
            let v = x.iter().zip(&g).map(|(x, g)| g / (1.0 + (-g).exp()) * x);
            vec![out(shape, v.collect())]
        }
        "rotary_kernel" => {
            let (x1, x2, pos, freq) = (f(0), f(1), f(2), f(3));
            let h = shape[1];
            let (mut o1, mut o2) = (Vec::new(), Vec::new());
            for (i, (a, b)) in x1.iter().zip(&x2).enumerate() {
                // The angle as the kernel rounds it (f32), then sin and cos in f64.
                let t = f64::from((pos[i / h] as f32) * (freq[i % h] as f32));
                o1.push(a * t.cos() - b * t.sin());
                o2.push(b * t.cos() + a * t.sin());
            }
            vec![out(shape, o1), out(shape, o2)]
        }
        _ => return None,
    })
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

/// The baselines' `XLA_FLAGS` when this run is capped (`TPU_KERNEL_CPU=avx2` or `scalar`): XLA:CPU held
/// to the same ISA (`--xla_cpu_max_isa=AVX2`), so both sides stand in for a CPU without AVX-512.
fn baseline_xla_flags() -> Option<String> {
    use tpu_kernel::runtime::math::cpu::{level, Level};
    (level() < Level::Native).then(|| {
        let old = std::env::var("XLA_FLAGS").unwrap_or_default();
        format!("{old} --xla_cpu_max_isa=AVX2").trim().to_string()
    })
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
        if let Some(flags) = baseline_xla_flags() {
            cmd.env("XLA_FLAGS", flags);
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
            _ if line.is_empty() => {
                eprintln!(
                    "{engine} {case}: the baselines exited (run `benches/xla_baselines.py --serve` \
                     by hand to see why)"
                );
                None
            }
            _ => {
                eprintln!("{engine} {case}: {}", line.trim());
                None
            }
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
        let inputs = case_inputs(name, &call);
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
            "{name:<22} fused min {:.3} med {:.3} | unfused min {:.3} med {:.3}",
            a[0],
            a[a.len() / 2],
            b[0],
            b[b.len() / 2]
        );
    }
}

/// A measured case: name, ours (median, min) ms, (max error, within tolerance), grid steps.
type Row = (&'static str, f64, f64, (f64, bool), usize);

/// A ragged paged attention case: name, ours, tpu-inference's reference under XLA, the best jnp under
/// XLA — each (median, min) ms.
type RpaRow = (&'static str, (f64, f64), (f64, f64), (f64, f64));

/// Ragged paged attention beside both XLA programs (`benches/rpa_cpu.py`): tpu-inference's own jnp
/// reference, jitted with the batch's metadata as constants, and the best jnp formulation found, jitted
/// over the metadata.
fn print_rpa(rows: &[RpaRow]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\nragged paged attention (benches/rpa_cpu.py): XLA ref = tpu-inference's ref_ragged_paged_attention \
         under jax.jit (metadata as constants), XLA jnp = the best jnp formulation (metadata as arrays)"
    );
    println!(
        "{:<30} {:>9} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10}",
        "case",
        "ours ms",
        "XLA ref ms",
        "XLA jnp ms",
        "ours/ref",
        "ours/jnp",
        "min/min r",
        "min/min j"
    );
    for (name, (o, o_min), (r, r_min), (j, j_min)) in rows {
        println!(
            "{name:<30} {o:>9.3} {r:>11.3} {j:>11.3} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            o / r,
            o / j,
            o_min / r_min,
            o_min / j_min
        );
    }
}

/// The machine's multiply-add peak per dot dtype as this run dispatches ([`peak`]), and the fraction of
/// the bf16 peak each `matmul_bf16_N` case reaches (2N³ flops in its time).
fn print_peaks(threads: usize, rows: &[Row]) {
    let peaks = peak::peaks(threads);
    let line: Vec<String> = peaks
        .iter()
        .map(|(d, instr, g)| format!("{d} {g:.0} ({instr})"))
        .collect();
    println!(
        "peak GFLOP/s (i8: GOP/s) on {threads} threads: {}",
        line.join(", ")
    );
    let Some(&(_, _, bf16)) = peaks.iter().find(|p| p.0 == "bf16") else {
        return;
    };
    for (name, ours, ..) in rows {
        if let Some(n) = name
            .strip_prefix("matmul_bf16_")
            .and_then(|n| n.parse::<f64>().ok())
        {
            let gflops = 2.0 * n * n * n / (ours * 1e-3) / 1e9;
            println!(
                "  {name}: {gflops:.0} GFLOP/s, {:.0}% of the bf16 peak (target: >= 60% at 1024)",
                100.0 * gflops / bf16
            );
        }
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
    // `--rounds N`: interleaved rounds per case and engine (2 by default; more on a loaded machine).
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(2)
        .max(1);
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
    let mut rows: Vec<Row> = Vec::new();
    let mut rpa_rows: Vec<RpaRow> = Vec::new();
    // `--ops`: each float op of the table alone (no reference check) instead of the kernels.
    let list = if args.iter().any(|a| a == "--ops") {
        ops::cases()
    } else {
        cases()
    };
    for (name, build) in list {
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
        let inputs = case_inputs(name, &call);
        let out = match call.interpret_with(&inputs, &opts) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("{name}: interpret failed: {e}");
                continue;
            }
        };
        let local = bench_reference(call.name(), &inputs).map(|w| {
            let tol = reference::Tolerance {
                atol: 1e-5,
                rtol: 1e-5,
            };
            Ok((w, tol))
        });
        let want = local
            .or_else(|| rpa::expected(name, &inputs))
            .or_else(|| reference::expected(call.name(), &inputs));
        let check = match want {
            Some(Ok((want, tol))) => {
                let c = out
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| reference::compare(g, w, tol));
                c.fold((0.0f64, true), |(e, ok), c| {
                    (e.max(c.max_abs_error), ok && c.ok)
                })
            }
            _ => (f64::NAN, name.starts_with("op_")),
        };
        // Interleaved rounds (two: XLA, ours, Pallas, ours, XLA; more: XLA, ours, ours, XLA, XLA, ...
        // with Pallas once after the first of ours); each engine keeps its best round.
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
        // Ragged paged attention has no Pallas interpret=True run (see interpret/rpa.rs) and a second
        // XLA program, the best jnp formulation (`best`), timed in the same rounds as XLA's.
        let rpa_case = rpa::CASES.contains(&name);
        let (mut xla, mut ours, mut pallas, mut jnp) = (None, None, None, None);
        for round in 0..rounds {
            if round % 2 == 0 {
                xla = best(xla, ask("xla"));
            }
            ours = best(ours, Some(ours_run()));
            if round == 0 && !rpa_case {
                pallas = ask("pallas");
            }
            if rpa_case {
                jnp = best(jnp, ask("best"));
            }
            if round % 2 == 1 {
                xla = best(xla, ask("xla"));
            }
        }
        let (ours, ours_min) = ours.expect("at least one round");
        if let Some(x) = xla {
            baseline.insert(name, (x.0, pallas.map(|p| p.0), x.1));
        }
        if let (Some(x), Some(j)) = (xla, jnp) {
            rpa_rows.push((name, (ours, ours_min), x, j));
        }
        let steps: usize = call.ir().grid.iter().product::<usize>().max(1);
        rows.push((name, ours, ours_min, check, steps));
    }

    println!(
        "\ninterpret mode on CPU ({threads} threads; dispatched to: {}); ms = median of warm runs, best of \
         {rounds} rounds interleaved with XLA's; ratio = time / XLA time (min/min: fastest single runs); \
         us/step = ours per grid step",
        tpu_kernel::runtime::math::cpu::describe()
    );
    if let Some(flags) = baseline_xla_flags() {
        println!("baselines capped alike: XLA_FLAGS={flags}");
    }
    println!(
        "{:<28} {:>9} {:>8} {:>9} {:>10} {:>9} {:>8} {:>10} {:>11} {:>9}",
        "case",
        "ours ms",
        "us/step",
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
    for (name, ours, ours_min, (err, ok), steps) in &rows {
        let per_step = ours * 1e3 / *steps as f64;
        let b = baseline.get(name).copied();
        let err = format!("{err:.2e}{}", if *ok { "" } else { " FAIL" });
        match b {
            Some((xla, Some(pallas), xla_min)) => {
                ours_r.push(ours / xla);
                min_r.push(ours_min / xla_min);
                pallas_r.push(pallas / xla);
                speedup.push(pallas / ours);
                println!(
                    "{name:<28} {ours:>9.3} {per_step:>8.1} {xla:>9.3} {pallas:>10.3} {:>9.2} {:>8.2} {:>10.2} {:>11.1} {err:>9}",
                    ours / xla,
                    ours_min / xla_min,
                    pallas / xla,
                    pallas / ours
                );
            }
            Some((xla, None, xla_min)) => {
                ours_r.push(ours / xla);
                min_r.push(ours_min / xla_min);
                println!(
                    "{name:<28} {ours:>9.3} {per_step:>8.1} {xla:>9.3} {:>10} {:>9.2} {:>8.2} {:>10} {:>11} {err:>9}",
                    "-",
                    ours / xla,
                    ours_min / xla_min,
                    "-",
                    "-"
                );
            }
            None => println!(
                "{name:<28} {ours:>9.3} {per_step:>8.1} {:>9} {:>10} {:>9} {:>8} {:>10} {:>11} {err:>9}",
                "-", "-", "-", "-", "-", "-"
            ),
        }
    }
    print_rpa(&rpa_rows);
    print_peaks(threads, &rows);
    if !ours_r.is_empty() {
        // (Cases without a Pallas run have no Pallas ratios.)
        let or_dash = |v: &[f64], digits: usize| match v.is_empty() {
            true => "-".to_string(),
            false => format!("{:.digits$}", geomean(v)),
        };
        println!(
            "{:<28} {:>9} {:>8} {:>9} {:>10} {:>9.2} {:>8.2} {:>10} {:>11}",
            "geomean",
            "",
            "",
            "",
            "",
            geomean(&ours_r),
            geomean(&min_r),
            or_dash(&pallas_r, 2),
            or_dash(&speedup, 1)
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

//! The TPU generation a kernel is built for (`Target`): the VMEM check at each generation's limits,
//! `.target(..)` and `Target::scope` reaching the IR and the backend_config, the export path
//! building for the request's target, and a launch function picking its blocks per generation.
//! (libtpu's side of the same figures: `python/tests/test_agreement.py` and `test_examples.py`.)

use serde_json::{json, Value};
use tpu_kernel::__private::export::{Library, Request};
use tpu_kernel::prelude::*;
use tpu_kernel::{CustomCall, ErrorKind};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

/// `o = x` in `[rows, 128]` f32 blocks over 4 steps: 2 operands × 2 buffers × `rows` × 512 bytes of
/// VMEM (`rows` × 2 KiB), built for `target` (else for the target in scope).
fn copy(
    rows: usize,
    limit: Option<usize>,
    target: Option<Target>,
) -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([rows, 128], |[i]| (i, 0));
    let mut b = pallas_call(copy_kernel)
        .grid([4])
        .input(ArrayType::new([4 * rows, 128], F32), spec())
        .output(ArrayType::new([4 * rows, 128], F32), spec())
        .dimension_semantics([Parallel]);
    if let Some(l) = limit {
        b = b.vmem_limit_bytes(l as u64);
    }
    if let Some(t) = target {
        b = b.target(t);
    }
    b.build()
}

/// Rows of the copy whose blocks need exactly `bytes` of VMEM.
fn rows_for(bytes: usize) -> usize {
    bytes / (2 * KIB)
}

fn build_for(target: Target, rows: usize, limit: Option<usize>) -> Result<PallasCall, KernelError> {
    copy(rows, limit, Some(target))
}

#[test]
fn the_default_scoped_limit_is_the_generations() {
    // 16 MiB on v4, v5e and v5p; 32 MiB on v6e and tpu7x (libtpu's defaults, measured).
    let at_16 = rows_for(16 * MIB);
    let over_16 = at_16 + 8;
    for &t in Target::ALL {
        assert!(build_for(t, at_16, None).is_ok(), "16 MiB fits {t}");
        let over = build_for(t, over_16, None);
        if t.info().default_scoped_vmem_bytes == 16 * MIB as u64 {
            let e = over.expect_err("16 MiB + 16 KiB is over the default");
            assert_eq!(e.kind, ErrorKind::Vmem);
            // (v4's 16 MiB are all its VMEM: the message says so rather than suggest a raise.)
            let why = match t {
                Target::V4 => "a v4 TensorCore has 16.00 MiB".to_string(),
                _ => format!("16.00 MiB (libtpu's default on {t})"),
            };
            assert!(e.message.contains(&why), "{t}: {}", e.message);
        } else {
            assert!(over.is_ok(), "{t}: 16.02 MiB fits 32 MiB");
            let e = build_for(t, rows_for(32 * MIB) + 8, None).expect_err("over 32 MiB");
            assert!(
                e.message.contains(&format!("default on {t}")),
                "{}",
                e.message
            );
        }
    }
}

#[test]
fn the_hint_raises_the_limit_within_the_generations_vmem() {
    let rows = rows_for(16 * MIB) + 8;
    let e = build_for(Target::V5e, rows, None).unwrap_err();
    assert!(
        e.message
            .contains("raise `.vmem_limit_bytes(..)` (up to 128.00 MiB on v5e)"),
        "{}",
        e.message
    );
    // Following the hint builds.
    assert!(build_for(Target::V5e, rows, Some(17 * MIB)).is_ok());
}

#[test]
fn a_kernel_that_fits_v5e_does_not_fit_a_smaller_vmem() {
    // 80 MiB of blocks with a 100 MiB limit: v5e and v6e have 128 MiB per core; v5p and tpu7x 64, v4 16.
    let rows = rows_for(80 * MIB);
    for &t in Target::ALL {
        let r = build_for(t, rows, Some(100 * MIB));
        if t.info().vmem_usable_bytes >= 80 * MIB as u64 {
            assert!(r.is_ok(), "{t}: {:?}", r.err());
        } else {
            let e = r.expect_err("more than the core's VMEM");
            assert_eq!(e.kind, ErrorKind::Vmem);
            assert!(
                e.message.contains(&format!("a {t} TensorCore has")),
                "{t}: {}",
                e.message
            );
            assert!(
                !e.message.contains("raise"),
                "no hint that cannot help: {}",
                e.message
            );
        }
    }
}

#[test]
fn usable_vmem_is_exact() {
    // libtpu keeps 64 KiB of tpu7x's 64 MiB (and of v5p's, v6e's): the blocks may use the rest.
    let usable = Target::Tpu7x.info().vmem_usable_bytes as usize;
    assert_eq!(usable, 64 * MIB - 64 * KIB);
    let limit = Some(128 * MIB);
    assert!(build_for(Target::Tpu7x, rows_for(usable), limit).is_ok());
    assert!(build_for(Target::Tpu7x, rows_for(usable) + 8, limit).is_err());
    assert!(build_for(Target::V5e, rows_for(128 * MIB), limit).is_ok());
    assert!(build_for(Target::V5e, rows_for(128 * MIB) + 8, Some(256 * MIB)).is_err());
}

#[tpu_kernel]
fn dot_i8_kernel(x: Ref<i8>, y: Ref<i8>, o: RefMut<i32>) {
    o.store(dot(x.load(), y.load()));
}

#[tpu_kernel]
fn dot_i8_as_bf16_kernel(x: Ref<i8>, y: Ref<i8>, o: RefMut<f32>) {
    o.store(dot(x.load().cast::<bf16>(), y.load().cast::<bf16>()));
}

fn dot_launch<K, A>(kernel: K, out: DType, target: Target) -> Result<PallasCall, KernelError>
where
    K: tpu_kernel::launch::KernelFn<A>,
{
    let spec = || BlockSpec::new([128, 128], |[_]| (0, 0));
    pallas_call(kernel)
        .target(target)
        .grid([1])
        .input(ArrayType::new([128, 128], I8), spec())
        .input(ArrayType::new([128, 128], I8), spec())
        .output(ArrayType::new([128, 128], out), spec())
        .build()
}

#[test]
fn v4_does_not_multiply_i8_blocks() {
    // libtpu on v4: "E2001: Unsupported matmul RHS type on target: vector<128x128xi8>" (Pallas's too).
    let e = dot_launch(dot_i8_kernel, I32, Target::V4).unwrap_err();
    assert_eq!(e.kind, ErrorKind::DType);
    assert!(
        e.message.starts_with("v4 does not multiply i8 blocks"),
        "{}",
        e.message
    );
    let at = e.location.expect("located");
    assert!(at.file.ends_with("tests/target.rs"));
    let line = include_str!("target.rs")
        .lines()
        .nth(at.line as usize - 1)
        .unwrap();
    assert!(line.contains("dot(x.load(), y.load())"), "{line}");
    for &t in &Target::ALL[1..] {
        assert!(dot_launch(dot_i8_kernel, I32, t).is_ok(), "{t}");
    }
    // Following the hint builds.
    assert!(dot_launch(dot_i8_as_bf16_kernel, F32, Target::V4).is_ok());
}

fn scoped_vmem(call: &PallasCall) -> u64 {
    let config: Value = serde_json::from_str(
        &CustomCall::new(call.ir())
            .backend_config()
            .expect("backend_config"),
    )
    .expect("JSON");
    config["scoped_memory_configs"][0]["size"]
        .as_u64()
        .expect("a scoped VMEM size")
}

#[test]
fn the_target_reaches_the_ir_and_the_config() {
    let rows = 64;
    let default = copy(rows, None, None).unwrap();
    assert_eq!(default.target(), Target::DEFAULT);
    assert_eq!(Target::DEFAULT, Target::V5e);
    assert_eq!(scoped_vmem(&default), 16 * MIB as u64);

    let v6e = copy(rows, None, Some(Target::V6e)).unwrap();
    assert_eq!(v6e.ir().target, Target::V6e);
    assert!(v6e
        .ir()
        .to_string()
        .lines()
        .next()
        .unwrap()
        .ends_with("target=v6e"));
    assert_eq!(scoped_vmem(&v6e), 32 * MIB as u64);
    assert!(v6e.summary().contains("on v6e"), "{}", v6e.summary());

    // A scope sets the target of launches that name none; `.target(..)` wins over it.
    let scoped = Target::Tpu7x.scope(|| copy(rows, None, None).unwrap());
    assert_eq!(scoped.target(), Target::Tpu7x);
    let named = Target::Tpu7x.scope(|| copy(rows, None, Some(Target::V4)).unwrap());
    assert_eq!(named.target(), Target::V4);
    // An explicit limit is written as given, on every target.
    let limited = copy(rows, Some(20 * MIB), Some(Target::V6e)).unwrap();
    assert_eq!(scoped_vmem(&limited), 20 * MIB as u64);
    // The module itself is the same for every generation (as Pallas's is).
    assert_eq!(
        CustomCall::new(default.ir()).body().unwrap(),
        CustomCall::new(v6e.ir()).body().unwrap()
    );
}

#[test]
fn batching_keeps_the_target() {
    let call = copy(8, None, Some(Target::V6e)).unwrap();
    let batched = call.batched(3, &[true]).unwrap();
    assert_eq!(batched.target(), Target::V6e);
}

// ------------------------------------------------------------------------------------------- export

/// The user crate's `by_target`: blocks of the MXU's size in rows, the kernel named `copy_<target>`.
#[path = "user-crate/src/lib.rs"]
mod user_crate;

/// `o = x` in one block, built for the target in scope, or pinned to `pin`.
fn whole_copy(x: ArrayType, pin: Option<Target>) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let spec = || BlockSpec::new([m, n], |[_]| (0, 0));
    let mut b = pallas_call(copy_kernel)
        .grid([1])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec());
    if let Some(t) = pin {
        b = b.target(t);
    }
    b.build()
}

/// Names no target: builds for the request's.
#[export]
pub fn plain(x: ArrayType) -> Result<PallasCall, KernelError> {
    whole_copy(x, None)
}

/// Always builds for v5e, whatever the request says.
#[export]
pub fn pinned(x: ArrayType) -> Result<PallasCall, KernelError> {
    whole_copy(x, Some(Target::V5e))
}

/// The executor each build of `by_executor` saw, in order.
static EXECUTORS: std::sync::Mutex<Vec<Executor>> = std::sync::Mutex::new(Vec::new());

/// Names no target; records the executor it is built for and names its kernel after it.
#[export]
pub fn by_executor(x: ArrayType) -> Result<PallasCall, KernelError> {
    let e = Executor::current();
    EXECUTORS.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    let [m, n] = x.dims()?;
    let spec = || BlockSpec::new([m, n], |[_]| (0, 0));
    pallas_call(copy_kernel)
        .name(format!("copy_{}", e.name()))
        .grid([1])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .build()
}

fn library() -> Library {
    Library::new(
        "targets",
        vec![
            user_crate::__tpu_kernel_export_by_target(),
            __tpu_kernel_export_plain(),
            __tpu_kernel_export_pinned(),
            __tpu_kernel_export_by_executor(),
        ],
    )
}

fn request(kernel: &str, target: Option<&str>) -> Request {
    let mut v = json!({"kernel": kernel, "inputs": [{"shape": [1024, 128], "dtype": "f32"}]});
    if let Some(t) = target {
        v["target"] = json!(t);
    }
    Request::from_json(&v).expect("request")
}

#[test]
fn an_export_reading_its_target_picks_its_blocks_per_generation() {
    let lib = library();
    for &t in Target::ALL {
        let built = lib.build(&request("by_target", Some(t.name()))).unwrap();
        assert_eq!(built.call.target(), t);
        assert_eq!(built.call.name(), format!("copy_{t}"));
        let block = &built.call.ir().operands[0]
            .block
            .as_ref()
            .unwrap()
            .block_shape;
        assert_eq!(block[0], t.info().mxu_size, "{t}");
    }
    // One build per target: the cache keys on it.
    assert_eq!(
        lib.stats.builds.load(std::sync::atomic::Ordering::Relaxed),
        Target::ALL.len() as u64
    );
}

#[test]
fn the_export_path_applies_the_requests_target() {
    let lib = library();
    let default = lib.build(&request("plain", None)).unwrap();
    assert_eq!(default.call.target(), Target::DEFAULT);
    let v6e = lib.build(&request("plain", Some("v6e"))).unwrap();
    assert_eq!(v6e.call.target(), Target::V6e);
    assert!(
        v6e.ffi_request.contains(r#""target":"v6e""#),
        "{}",
        v6e.ffi_request
    );
    // A jax device kind names the same target, and hits the same cache entry.
    let kind = lib.build(&request("plain", Some("TPU v6 lite"))).unwrap();
    assert!(std::sync::Arc::ptr_eq(&v6e, &kind));
    // The FFI request rebuilds for the same target.
    let again = Request::from_json(&serde_json::from_str(&v6e.ffi_request).unwrap()).unwrap();
    assert_eq!(again.target, Target::V6e);

    let answer: Value = lib.dispatch(
        "build",
        &json!({"kernel": "plain", "inputs": [{"shape": [1024, 128], "dtype": "f32"}], "target": "tpu7x"})
            .to_string(),
    );
    assert_eq!(answer["target"], "tpu7x", "{answer}");
}

#[test]
fn a_bad_target_is_an_error_naming_the_targets() {
    let lib = library();
    let answer = lib.dispatch(
        "build",
        &json!({"kernel": "plain", "inputs": [{"shape": [8, 128], "dtype": "f32"}], "target": "v7x"})
            .to_string(),
    );
    assert_eq!(answer["ok"], false);
    let text = answer["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("unknown TPU target `v7x`") && text.contains("v4, v5e, v5p, v6e, tpu7x"),
        "{text}"
    );
    let answer = lib.dispatch(
        "build",
        &json!({"kernel": "plain", "inputs": [{"shape": [8, 128], "dtype": "f32"}], "target": 6})
            .to_string(),
    );
    assert_eq!(answer["ok"], false, "{answer}");
}

#[test]
fn a_launch_pinned_to_another_target_is_refused() {
    let lib = library();
    assert!(lib.build(&request("pinned", Some("v5e"))).is_ok());
    let e = lib.build(&request("pinned", Some("v6e"))).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Signature);
    assert!(
        e.message
            .contains("builds for v5e (`.target(..)`) but the request is for v6e"),
        "{}",
        e.message
    );
    assert!(e.location.unwrap().file.ends_with("tests/target.rs"));
}

#[test]
fn the_description_lists_the_targets() {
    let lib = library();
    let d: Value = serde_json::from_str(lib.description().to_str().unwrap()).unwrap();
    assert_eq!(d["default_target"], "v5e");
    let names: Vec<&str> = d["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, Target::names());
    assert_eq!(d["targets"][4]["topology"], "tpu7x:1x1x1");
    // The target is not a static parameter: Python sees only `x`.
    let k = &d["kernels"][0];
    assert_eq!(k["name"], "by_target");
    assert_eq!(k["params"], json!([]));
}

/// v4 cannot mask 8-bit elements within a word: a rank-1 i8/u8 block equal to its whole array must be
/// a multiple of 512 elements there (libtpu: "8-bit subelement masking is only supported for TPU v5+",
/// measured for 128, 640 and 2000; 512 and 1536 compile), at the operand's declaration; the hints —
/// 512-element blocks, or the array as rows of 128 — build, and libtpu compiles both on v4.
#[test]
fn v4_refuses_rank_1_8_bit_blocks_it_cannot_mask() {
    fn copy(x: Ref<i8>, o: RefMut<i8>) {
        o.store(x.load());
    }
    let launch = |n: usize, b: usize, target: Target| {
        pallas_call(copy)
            .target(target)
            .grid([n.div_ceil(b)])
            .input(ArrayType::new([n], I8), BlockSpec::new([b], |[i]| [i]))
            .output(ArrayType::new([n], I8), BlockSpec::new([b], |[i]| [i]))
            .build()
    };
    let line = line!() - 4;
    for n in [128usize, 640, 2000] {
        let e = launch(n, n, Target::V4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Tiling, "{e}");
        assert!(e.message.contains("8-bit subelement masking"), "{e}");
        assert_eq!(e.location.map(|l| l.line), Some(line), "{e}");
        for &t in &Target::ALL[1..] {
            assert!(launch(n, n, t).is_ok(), "{t} {n}");
        }
    }
    for n in [512usize, 1536] {
        assert!(launch(n, n, Target::V4).is_ok(), "{n}");
    }
    // The hints: 512-element blocks of a longer array; rows of 128.
    let e = launch(2000, 2000, Target::V4).unwrap_err();
    assert!(e.message.contains("use blocks of 512 elements"), "{e}");
    assert!(launch(2000, 512, Target::V4).is_ok());
    let e = launch(128, 128, Target::V4).unwrap_err();
    assert!(e.message.contains("reshape the array to [1, 128]"), "{e}");
    let rows = pallas_call(copy)
        .target(Target::V4)
        .grid([1])
        .input(
            ArrayType::new([1, 128], I8),
            BlockSpec::new([1, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([1, 128], I8),
            BlockSpec::new([1, 128], |[_]| (0, 0)),
        )
        .build();
    assert!(rows.is_ok());
}

#[path = "../examples/quantized_matmul_w8a8.rs"]
#[allow(dead_code)]
mod quantized_matmul_w8a8;

/// tpu-inference's largest v6 int8 qmm entry (batch 16384, out 37888, in 3584; blocks 2048 × 1024 ×
/// 3584) needs more VMEM than v6e's default scoped limit: refused with the hint, and built once
/// `vmem_limit_bytes` (the example's argument) raises it to tpu-inference's v6 ceiling of 96 MiB.
#[test]
fn the_w8a8_example_takes_a_vmem_limit() {
    let build = |limit| {
        Target::V6e.scope(|| {
            quantized_matmul_w8a8::quantized_matmul_w8a8(
                ArrayType::new([16384, 3584], I8),
                ArrayType::new([16384, 1], F32),
                ArrayType::new([3584, 37888], I8),
                ArrayType::new([1, 37888], F32),
                (2048, 1024, 3584),
                limit,
            )
        })
    };
    takes_a_vmem_limit(build, 96 << 20);
}

#[path = "../examples/grouped_matmul.rs"]
#[allow(dead_code)]
mod grouped_matmul;

/// megablox gmm's table choice for 128 tokens, k = n = 6144, 20 groups (blocks 128 × 2048 × 6144)
/// with bf16 weights needs 55 MiB of VMEM, over tpu7x's default scoped 32 MiB: refused with the hint,
/// built once `vmem_limit_bytes` (the example's argument, as the quantized matmul's) raises it.
#[test]
fn the_grouped_matmul_example_takes_a_vmem_limit() {
    let (m, k, n, groups, tm) = (128, 6144, 6144, 20, 128);
    let build = |limit| {
        Target::Tpu7x.scope(|| {
            grouped_matmul::grouped_matmul(
                ArrayType::new([groups + 1], I32),
                ArrayType::new([m / tm + groups - 1], I32),
                ArrayType::new([m / tm + groups - 1], I32),
                ArrayType::new([m, k], BF16),
                ArrayType::new([groups, k, n], BF16),
                (tm, 2048, 6144),
                limit,
            )
        })
    };
    takes_a_vmem_limit(build, 60 << 20);
}

/// What an example's `vmem_limit_bytes` argument does, on blocks over the target's default scoped
/// limit: without it, refused with the hint naming it; with `limit`, built with that scoped limit; a
/// limit that is not positive (0, -1), refused naming the argument.
fn takes_a_vmem_limit(build: impl Fn(Option<i64>) -> Result<PallasCall, KernelError>, limit: i64) {
    let e = build(None).expect_err("over the default limit").to_string();
    assert!(
        e.contains("scoped VMEM limit") && e.contains("vmem_limit_bytes"),
        "{e}"
    );
    let call = build(Some(limit)).expect("within the raised limit");
    assert_eq!(scoped_vmem(&call), limit as u64);
    for bad in [0, -1] {
        let e = build(Some(bad)).expect_err("not positive").to_string();
        assert!(
            e.contains("vmem_limit_bytes") && e.contains("must be positive"),
            "{e}"
        );
    }
}

#[path = "common/xla.rs"]
mod xla;

/// A request builds for a TPU unless it says `"executor": "cpu"`; the XLA FFI handler (which runs
/// the kernel on the CPU) builds its launch for the CPU, whatever the request it was given says.
#[test]
fn the_ffi_handler_builds_its_launch_for_the_cpu() {
    let lib = library();
    let tpu = lib.build(&request("by_executor", None)).unwrap();
    assert_eq!(tpu.call.name(), "copy_tpu");
    assert!(
        !tpu.ffi_request.contains(r#""executor""#),
        "{}",
        tpu.ffi_request
    );
    let mut cpu_request = request("by_executor", None);
    cpu_request.executor = Executor::Cpu;
    let cpu = lib.build(&cpu_request).unwrap();
    assert_eq!(cpu.call.name(), "copy_cpu");
    assert!(
        cpu.ffi_request.contains(r#""executor":"cpu""#),
        "{}",
        cpu.ffi_request
    );
    let again = Request::from_json(&serde_json::from_str(&cpu.ffi_request).unwrap()).unwrap();
    assert_eq!(again.executor, Executor::Cpu);
    let bad = json!({"kernel": "by_executor", "executor": "gpu"});
    let e = Request::from_json(&bad).expect_err("not an executor");
    assert!(
        e.message.contains(r#"must be "tpu" or "cpu""#),
        "{}",
        e.message
    );

    // The handler of a fresh library (nothing cached), given the TPU build's request (what the CPU
    // lowering passes it).
    let lib = library();
    EXECUTORS.lock().unwrap().clear();
    let x = HostArray::random([1024, 128], F32, 3).unwrap();
    let (input, out) = (
        xla::XlaBuffer::of(&x),
        xla::XlaBuffer::zeros(&[1024, 128], F32),
    );
    xla::call(&lib, &tpu.ffi_request, &[&input], &[&out]).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(out.bytes(), input.bytes());
    assert_eq!(*EXECUTORS.lock().unwrap(), [Executor::Cpu]);
    // Outside any scope, a launch builds for a TPU.
    assert_eq!(Executor::current(), Executor::Tpu);
}

//! The XLA FFI handler under concurrency, called as XLA:CPU calls it (a typed-FFI call frame per call,
//! `tests/common/xla.rs`): 8 threads, each making `TPU_KERNEL_FFI_STRESS_CALLS` calls (default 1,000)
//! that start together on a cold cache — a kernel every thread shares (one signature, so one cached
//! build run by all threads at once), kernels of their own (other kernels, another signature of the
//! shared one), a donated input aliased with its output, and bad calls mixed in (a result buffer of
//! the wrong shape or dtype, an input of the wrong rank, a request that is not JSON or names no
//! kernel). Every result must be the owned interpreter's bits for that thread's data; every bad call
//! an error through `XLA_FFI_Error_Create` that leaves the output untouched.
//!
//! `scripts/helgrind.sh` runs `warm_threads_for_helgrind` under valgrind's helgrind (see there for
//! what helgrind can and cannot judge in Rust). `TPU_KERNEL_FFI_STRESS_CALLS=10000 cargo test --release
//! --test ffi_concurrency` is the long run.

mod common;
#[path = "common/xla.rs"]
mod xla;

use common::{add, inplace_scale, matmul, rmsnorm, softmax};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use tpu_kernel::__private::export::{Built, Library, Request};
use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;
use xla::XlaBuffer;

const THREADS: usize = 8;

fn calls_per_thread() -> usize {
    std::env::var("TPU_KERNEL_FFI_STRESS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn library() -> Library {
    Library::new(
        "stress",
        vec![
            softmax::__tpu_kernel_export_softmax(),
            rmsnorm::__tpu_kernel_export_rmsnorm(),
            matmul::__tpu_kernel_export_matmul(),
            add::__tpu_kernel_export_add(),
            inplace_scale::__tpu_kernel_export_inplace_scale(),
        ],
    )
}

/// One kind of call: its FFI request (as Python gets it from `build`) and input arrays.
struct Op {
    name: &'static str,
    request: String,
    inputs: Vec<HostArray>,
    /// Owned-interpreter results for `inputs`: what the handler must write (their shapes, dtypes
    /// and bytes: the threads compare bytes, making no host arrays).
    want: Vec<(Vec<usize>, DType, Vec<u8>)>,
    /// Input 0 is donated: XLA passes one buffer as input 0 and output 0.
    aliased: bool,
}

fn op(lib: &Library, name: &'static str, req: serde_json::Value, seed: u64, aliased: bool) -> Op {
    let built: Arc<Built> = lib
        .build(&Request::from_json(&req).expect("request"))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let inputs: Vec<HostArray> = built
        .call
        .ir()
        .inputs()
        .enumerate()
        .map(|(i, o)| HostArray::random(&o.shape, o.dtype, seed * 16 + i as u64).unwrap())
        .collect();
    let want = built
        .call
        .interpret(&inputs)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .iter()
        .map(|a| (a.shape().to_vec(), a.dtype(), xla::bytes_of(a.data())))
        .collect();
    Op {
        name,
        request: built.ffi_request.clone(),
        inputs,
        want,
        aliased,
    }
}

/// The calls of thread `t`: the shared softmax first, then its own kernels.
fn ops_of(lib: &Library, t: usize) -> Vec<Op> {
    let seed = t as u64 + 1;
    let shared = op(
        lib,
        "softmax (shared)",
        json!({"kernel": "softmax", "inputs": [{"shape": [64, 256], "dtype": "f32"}]}),
        seed,
        false,
    );
    let own = match t % 4 {
        0 => op(
            lib,
            "rmsnorm",
            json!({"kernel": "rmsnorm", "inputs": [{"shape": [64, 256], "dtype": "bf16"}, {"shape": [1, 256], "dtype": "f32"}], "params": {"block_rows": 16}}),
            seed,
            false,
        ),
        1 => op(
            lib,
            "matmul",
            json!({"kernel": "matmul", "inputs": [{"shape": [128, 256], "dtype": "bf16"}, {"shape": [256, 128], "dtype": "bf16"}]}),
            seed,
            false,
        ),
        2 => op(
            lib,
            "add",
            json!({"kernel": "add", "inputs": [{"shape": [256, 256], "dtype": "f32"}, {"shape": [256, 256], "dtype": "f32"}], "params": {"block": [128, 128]}}),
            seed,
            false,
        ),
        _ => op(
            lib,
            "softmax block_rows=16",
            json!({"kernel": "softmax", "inputs": [{"shape": [64, 256], "dtype": "f32"}], "params": {"block_rows": 16}}),
            seed,
            false,
        ),
    };
    let donated = op(
        lib,
        "inplace_scale (donated)",
        json!({"kernel": "inplace_scale", "inputs": [{"shape": [256, 128], "dtype": "f32"}]}),
        seed,
        true,
    );
    vec![shared, own, donated]
}

/// One good call of `op`: fresh output buffers (or the donated input itself), checked bit for bit.
fn good_call(lib: &Library, op: &Op, inputs: &[XlaBuffer]) {
    if op.aliased {
        let buf = XlaBuffer::of(&op.inputs[0]);
        let ins: Vec<&XlaBuffer> = std::iter::once(&buf).chain(&inputs[1..]).collect();
        xla::call(lib, &op.request, &ins, &[&buf]).unwrap_or_else(|e| panic!("{}: {e:?}", op.name));
        assert!(buf.bytes() == op.want[0].2, "{}: other bits", op.name);
        return;
    }
    let outs: Vec<XlaBuffer> = op
        .want
        .iter()
        .map(|(shape, dtype, _)| XlaBuffer::zeros(shape, *dtype))
        .collect();
    let ins: Vec<&XlaBuffer> = inputs.iter().collect();
    let out_refs: Vec<&XlaBuffer> = outs.iter().collect();
    xla::call(lib, &op.request, &ins, &out_refs).unwrap_or_else(|e| panic!("{}: {e:?}", op.name));
    for (o, (_, _, want)) in outs.iter().zip(&op.want) {
        assert!(o.bytes() == want, "{}: other bits", op.name);
    }
}

/// One bad call (kind `k`): an error naming the problem, the output buffer left as it was.
fn bad_call(lib: &Library, op: &Op, inputs: &[XlaBuffer], k: usize) {
    let ins: Vec<&XlaBuffer> = inputs.iter().collect();
    let (shape, dtype) = (&op.want[0].0, op.want[0].1);
    let (request, out, expect): (&str, XlaBuffer, &str) = match k % 5 {
        0 => (
            &op.request,
            XlaBuffer::zeros(&[shape[0] / 2, shape[1]], dtype),
            "output 0",
        ),
        1 => (
            &op.request,
            XlaBuffer::zeros(shape, if dtype == I32 { F32 } else { I32 }),
            "output 0",
        ),
        2 => ("{not json", XlaBuffer::zeros(shape, dtype), "not JSON"),
        3 => (
            r#"{"kernel": "no_such_kernel", "params": {}, "batch": []}"#,
            XlaBuffer::zeros(shape, dtype),
            "no_such_kernel",
        ),
        _ => {
            // Input 0 of another rank: rebuilt (and refused) by the handler's own path.
            let flat = XlaBuffer::zeros(&[op.inputs[0].len()], op.inputs[0].dtype());
            let ins: Vec<&XlaBuffer> = std::iter::once(&flat).chain(&inputs[1..]).collect();
            let out = XlaBuffer::zeros(shape, dtype);
            let e = xla::call(lib, &op.request, &ins, &[&out]).expect_err("wrong rank");
            assert!(
                e.message.contains("rank") || e.message.contains("dims"),
                "{}: {}",
                op.name,
                e.message
            );
            assert!(
                out.bytes().iter().all(|&b| b == 0),
                "a failed call wrote its output"
            );
            return;
        }
    };
    let before = out.bytes().to_vec();
    let e = xla::call(lib, request, &ins, &[&out]).expect_err("a bad call");
    assert!(
        e.message.contains(expect),
        "{} (bad call {k}): {}",
        op.name,
        e.message
    );
    assert_eq!(e.code, 3, "INVALID_ARGUMENT: {}", e.message);
    assert!(
        out.bytes() == before,
        "{}: a failed call wrote its output",
        op.name
    );
}

/// `calls` calls on each of `THREADS` threads, all starting at once; the handler's builds counted.
fn stress(lib: &Library, ops: &[Vec<Op>], calls: usize) -> u64 {
    let start = Barrier::new(THREADS);
    let t0 = std::time::Instant::now();
    let builds_before = lib.stats.ffi_builds.load(Ordering::Relaxed);
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for (t, ops) in ops.iter().enumerate() {
            let start = &start;
            threads.push(s.spawn(move || {
                let inputs: Vec<Vec<XlaBuffer>> = ops
                    .iter()
                    .map(|op| op.inputs.iter().map(XlaBuffer::of).collect())
                    .collect();
                start.wait();
                for i in 0..calls {
                    // Mostly the shared kernel and the thread's own, a donated call every 8th, a
                    // bad call every 8th.
                    let which = match i % 8 {
                        3 => 2,
                        1 | 5 => 1,
                        _ => 0,
                    };
                    if i % 8 == 7 {
                        bad_call(lib, &ops[i % 2], &inputs[i % 2], i / 8 + t);
                    } else {
                        good_call(lib, &ops[which], &inputs[which]);
                    }
                }
            }));
        }
        // Joined explicitly (pthread_join, which helgrind sees), not only at the end of the scope.
        for t in threads {
            if let Err(p) = t.join() {
                std::panic::resume_unwind(p);
            }
        }
    });
    let builds = lib.stats.ffi_builds.load(Ordering::Relaxed) - builds_before;
    eprintln!(
        "{THREADS} threads x {calls} calls in {:.2} s; the handler built {builds} kernels",
        t0.elapsed().as_secs_f64()
    );
    builds
}

/// Signatures the threads' good calls use (shared softmax, four of their own, the donated one).
const SIGNATURES: u64 = 6;

#[test]
fn eight_threads_call_the_handler_on_shared_and_own_kernels() {
    let lib = library();
    // Reference results first (builds into the library's build cache, not the handler's index).
    let ops: Vec<Vec<Op>> = (0..THREADS).map(|t| ops_of(&lib, t)).collect();
    // A cold handler index: threads racing on a signature's first call may each build it.
    let builds = stress(&lib, &ops, calls_per_thread());
    assert!(
        (SIGNATURES..=SIGNATURES * THREADS as u64).contains(&builds),
        "{builds} handler builds for {SIGNATURES} signatures"
    );
}

/// The driver of `scripts/helgrind.sh`: the same calls on a warm handler index (each signature called
/// once on this thread first), so the threads share only what the handler shares on every call —
/// the library, its built kernels, XLA's frames and buffers — and not the first insertion into the
/// caches, whose `std::sync::Mutex` (a futex) helgrind cannot see. Run natively it is a smaller
/// version of the test above.
#[test]
fn warm_threads_for_helgrind() {
    let lib = library();
    let ops: Vec<Vec<Op>> = (0..THREADS).map(|t| ops_of(&lib, t)).collect();
    for op in ops.iter().flatten() {
        let inputs: Vec<XlaBuffer> = op.inputs.iter().map(XlaBuffer::of).collect();
        good_call(&lib, op, &inputs);
    }
    assert_eq!(lib.stats.ffi_builds.load(Ordering::Relaxed), SIGNATURES);
    let calls = calls_per_thread().min(50);
    assert_eq!(stress(&lib, &ops, calls), 0, "a warm index builds nothing");
    // Each built kernel was planned at its first call, and only then.
    assert_eq!(lib.stats.plans.load(Ordering::Relaxed), SIGNATURES);
}

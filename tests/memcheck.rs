//! The interpreter's unsafe code at shapes small enough for valgrind: `scripts/memcheck.sh` runs this
//! file (with a few unit tests of `kernel-runtime`) under memcheck, where any read of uninitialized
//! memory, any access outside an allocation, any overlapping `memcpy` and any leak of a definitely
//! lost block is an error. Natively it is a quick agreement test.
//!
//! What it reaches: every example at small shapes (one to a few blocks per axis) in every mode —
//! fused (elementwise chains, results written straight into the output array through `RawDest`,
//! row bands), plain, sequential and `parallel` (chunks on the worker pool, raw writes from several
//! threads), poisoned, seeded DMA timing —, the vectorized loops (AVX2 under valgrind, which does not
//! emulate AVX-512: the AVX-512 and AVX-512 BF16 paths are not reached there), the `gemm` calls of
//! f32 and bf16 `dot`, the interpreter on borrowed arrays (inputs read in place or copied when
//! misaligned, outputs written in place, an aliased input that is its output's own buffer), the
//! XLA FFI handler on a call frame as XLA builds it, and the SPMD examples on every device of their
//! mesh (a thread per device, copies between their refs).

mod common;
#[path = "common/xla.rs"]
mod xla;

use common::*;
use tpu_kernel::__private::export::{Library, Request};
use tpu_kernel::prelude::*;
use tpu_kernel::reference;
use tpu_kernel::runtime::interpret::{
    interpret_into, ArrayView, ArrayViewMut, HostArray, InterpretOptions,
};
use xla::XlaBuffer;

type Case = (&'static str, Result<PallasCall, KernelError>);

/// Every example at small shapes.
fn cases() -> Vec<Case> {
    let f32s = |s: &[usize]| ArrayType::new(s, F32);
    let bf16s = |s: &[usize]| ArrayType::new(s, BF16);
    let i32s = |s: &[usize]| ArrayType::new(s, I32);
    let i8s = |s: &[usize]| ArrayType::new(s, I8);
    let (m, k, n, groups, tm) = (256, 128, 128, 2, 128);
    vec![
        (
            "add",
            add::add(f32s(&[256, 256]), f32s(&[256, 256]), (128, 128)),
        ),
        (
            "inplace_scale",
            inplace_scale::inplace_scale(f32s(&[256, 128]), 128),
        ),
        ("dma_double", dma_double::dma_double(f32s(&[256, 128]), 128)),
        (
            "gather_prefetch",
            gather_prefetch::gather_prefetch(i32s(&[4]), f32s(&[64, 128]), 8),
        ),
        (
            "causal_mask",
            causal_mask::causal_mask(f32s(&[256, 256]), (128, 128), 0.125),
        ),
        ("colsum", colsum::colsum(f32s(&[256, 128]), (128, 128))),
        (
            "fori_rowsum",
            fori_rowsum::fori_rowsum(f32s(&[128, 256]), 128),
        ),
        (
            "matmul",
            matmul::matmul(bf16s(&[256, 256]), bf16s(&[256, 256]), (128, 128, 128)),
        ),
        (
            "grouped_matmul",
            grouped_matmul::grouped_matmul(
                i32s(&[groups + 1]),
                i32s(&[m / tm + groups - 1]),
                i32s(&[m / tm + groups - 1]),
                bf16s(&[m, k]),
                bf16s(&[groups, k, n]),
                (tm, 128, 128),
                None,
            ),
        ),
        (
            "ops_tour",
            ops_tour::ops_tour(f32s(&[128, 128]), f32s(&[128, 128]), 64),
        ),
        (
            "paged_gather",
            paged_gather::paged_gather(i32s(&[4, 4]), f32s(&[16, 16, 128])),
        ),
        (
            "paged_attention",
            paged_attention::paged_attention(
                i32s(&[2]),
                i32s(&[2, 4]),
                bf16s(&[2, 4, 128]),
                bf16s(&[1, 16, 16, 128]),
                bf16s(&[1, 16, 16, 128]),
                2,
            ),
        ),
        (
            "quantized_matmul",
            quantized_matmul::quantized_matmul(
                bf16s(&[128, 256]),
                i8s(&[256, 256]),
                f32s(&[1, 256]),
                (128, 128, 128),
            ),
        ),
        (
            "quantized_matmul_w8a8",
            quantized_matmul_w8a8::quantized_matmul_w8a8(
                i8s(&[128, 256]),
                f32s(&[128, 1]),
                i8s(&[256, 256]),
                f32s(&[1, 256]),
                (128, 128, 128),
                None,
            ),
        ),
        (
            "rmsnorm",
            rmsnorm::rmsnorm(bf16s(&[64, 256]), f32s(&[1, 256]), 1e-6, 16),
        ),
        ("softmax", softmax::softmax(f32s(&[64, 256]), 8)),
        // Rows 5 lanes wide: the fused chain's narrow pass (`fused/narrow.rs`).
        ("softmax narrow", softmax::softmax(f32s(&[48, 5]), 16)),
        (
            "transpose",
            transpose::transpose(f32s(&[256, 256]), (128, 128)),
        ),
        (
            "flash_attention",
            flash_attention::flash_attention(
                bf16s(&[1, 256, 128]),
                bf16s(&[1, 256, 128]),
                bf16s(&[1, 256, 128]),
                false,
                (128, 128),
            ),
        ),
        // (The reference is non-causal: this one is held to its other modes only.)
        (
            "flash_attention causal",
            flash_attention::flash_attention(
                bf16s(&[1, 256, 128]),
                bf16s(&[1, 256, 128]),
                bf16s(&[1, 256, 128]),
                true,
                (128, 128),
            ),
        ),
        (
            "activations",
            activations::activations(f32s(&[64, 256]), f32s(&[64, 256]), i32s(&[64, 256]), 8),
        ),
        // (Held to its other modes only: its reference is tests/ragged_paged_attention.rs's.)
        ("ragged_paged_attention", ragged_paged_attention_small()),
    ]
}

/// The examples whose reference is elsewhere: held to their other modes here.
const NO_REFERENCE: &[&str] = &["flash_attention causal", "ragged_paged_attention"];

/// Ragged paged attention (tpu-inference's kernel operands, every operand in HBM, two aliased
/// outputs) at a tiny config: 3 sequences (one decoding) of up to 2 pages of 16 tokens in a pool of 8,
/// 16 query tokens, 4 query heads over 2 kv heads, bf16; mixed blocks of 8 query tokens and 16 KV
/// tokens (a sequence of more than 16 tokens takes both slots of the double buffer).
fn ragged_paged_attention_small() -> Result<PallasCall, KernelError> {
    let (seqs, pps, ps, pages, tokens, kv_heads) = (3, 2, 16, 8, 16, 2);
    ragged_paged_attention::ragged_paged_attention_launch(
        ArrayType::new([seqs], I32),
        ArrayType::new([seqs * pps], I32),
        ArrayType::new([seqs + 1], I32),
        ArrayType::new([3], I32),
        ArrayType::new([kv_heads, tokens, 1, 2, 128], BF16),
        ArrayType::new([tokens, kv_heads, 2, 128], BF16),
        ArrayType::new([pages, ps, kv_heads, 2, 128], BF16),
        true,
        true,
        false,
        0.125,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        Some([8, 16, 8, 16]),
        None,
        Some(4),
        None,
        Target::DEFAULT,
    )
}

fn modes() -> Vec<(&'static str, InterpretOptions)> {
    let d = InterpretOptions::default;
    vec![
        ("plain", InterpretOptions { fuse: false, ..d() }),
        (
            "sequential",
            InterpretOptions {
                parallel: false,
                ..d()
            },
        ),
        ("poisoned", InterpretOptions::poisoned()),
        (
            "dma seed",
            InterpretOptions {
                dma_seed: Some(5),
                ..d()
            },
        ),
    ]
}

/// Default mode against the plain-Rust reference, every other mode bit for bit against it.
#[test]
fn every_example_in_every_mode_at_small_shapes() {
    for (name, call) in cases() {
        let call = call.unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = reference::random_inputs(&call, 3);
        let got = call
            .interpret(&inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if !NO_REFERENCE.contains(&name) {
            let (want, tol) = reference::expected(call.name(), &inputs)
                .unwrap_or_else(|| panic!("no reference for {name}"))
                .unwrap_or_else(|e| panic!("reference for {name}: {e}"));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let c = reference::compare(g, w, tol);
                assert!(c.ok, "{name} output {i}: max error {}", c.max_abs_error);
            }
        }
        for (mode, opts) in modes() {
            let again = call
                .interpret_with(&inputs, &opts)
                .unwrap_or_else(|e| panic!("{name} ({mode}): {e}"));
            assert_eq!(again, got, "{name} ({mode})");
        }
    }
}

/// The FFI path's memory: inputs read in place (aligned) or copied (misaligned by one byte), outputs
/// written in place into buffers of exactly their size — the owned run's bits either way.
#[test]
fn every_example_on_borrowed_buffers() {
    for (name, call) in cases() {
        let call = call.unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = reference::random_inputs(&call, 5);
        let want = call
            .interpret(&inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for offset in [0, 1] {
            let ins: Vec<XlaBuffer> = inputs
                .iter()
                .map(|a| XlaBuffer::with_offset(a, offset))
                .collect();
            let outs: Vec<XlaBuffer> = want
                .iter()
                .map(|a| XlaBuffer::zeros(a.shape(), a.dtype()))
                .collect();
            run_borrowed(&call, &ins, &outs).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got: Vec<HostArray> = outs.iter().map(XlaBuffer::to_host).collect();
            assert_eq!(got, want, "{name}, inputs offset by {offset} bytes");
        }
    }
}

fn run_borrowed(
    call: &PallasCall,
    ins: &[XlaBuffer],
    outs: &[XlaBuffer],
) -> Result<(), KernelError> {
    // SAFETY: each buffer holds its array's bytes (or room for them) and outlives the call; outputs
    // are distinct allocations nobody else touches.
    let (views, mut out_views): (Vec<ArrayView<'_>>, Vec<ArrayViewMut<'_>>) = unsafe {
        (
            ins.iter()
                .map(|b| ArrayView::from_raw(&b.shape, b.dtype, b.ptr()))
                .collect(),
            outs.iter()
                .map(|b| ArrayViewMut::from_raw(&b.shape, b.dtype, b.ptr()))
                .collect(),
        )
    };
    interpret_into(
        call.ir(),
        &views,
        &mut out_views,
        &InterpretOptions::default(),
    )
}

/// XLA aliases a donated input with its output: one buffer is both. The kernel reads the input as
/// it was and writes the buffer (no overlapping copy, no read of a half-written block).
#[test]
fn an_aliased_input_that_is_its_outputs_buffer() {
    let call = inplace_scale::inplace_scale(ArrayType::new([256, 128], F32), 128).expect("build");
    let x = HostArray::random([256, 128], F32, 9).unwrap();
    let want = call.interpret(std::slice::from_ref(&x)).expect("run");
    let buf = XlaBuffer::of(&x);
    // SAFETY: one live buffer of 256·128 f32 seen as both the input and the output, as XLA passes an
    // aliased pair; the interpreter reads a snapshot of the input in that case.
    let (view, mut out) = unsafe {
        (
            ArrayView::from_raw(&buf.shape, F32, buf.ptr()),
            ArrayViewMut::from_raw(&buf.shape, F32, buf.ptr()),
        )
    };
    interpret_into(
        call.ir(),
        &[view],
        std::slice::from_mut(&mut out),
        &InterpretOptions::default(),
    )
    .expect("run");
    assert_eq!(buf.to_host(), want[0]);
}

/// Ragged paged attention with its queries and its cache donated, as vLLM calls it under `jax.jit`:
/// each aliased pair (queries → output, cache → updated cache) is one buffer, read as it was and
/// written in place — the owned run's bits.
#[test]
fn ragged_paged_attention_on_its_donated_buffers() {
    let call = ragged_paged_attention_small().expect("build");
    let inputs = reference::random_inputs(&call, 7);
    let want = call.interpret(&inputs).expect("run");
    let bufs: Vec<XlaBuffer> = inputs.iter().map(XlaBuffer::of).collect();
    // SAFETY: each buffer holds its input's bytes and outlives the call; the outputs are inputs 4
    // (q) and 6 (the cache), the pairs the launch aliases, seen twice as XLA passes a donated pair.
    let (views, mut outs) = unsafe {
        (
            bufs.iter()
                .map(|b| ArrayView::from_raw(&b.shape, b.dtype, b.ptr()))
                .collect::<Vec<_>>(),
            Vec::from(
                [4, 6]
                    .map(|i| ArrayViewMut::from_raw(&bufs[i].shape, bufs[i].dtype, bufs[i].ptr())),
            ),
        )
    };
    interpret_into(call.ir(), &views, &mut outs, &InterpretOptions::default()).expect("run");
    assert_eq!(bufs[4].to_host(), want[0], "the output");
    assert_eq!(bufs[6].to_host(), want[1], "the updated cache");
}

/// The handler entry on XLA-shaped call frames: the metadata query, successful calls (outputs
/// written in place, bits of the owned run), and failures reported through `XLA_FFI_Error_Create`
/// — from two threads at once.
#[test]
fn the_ffi_handler_on_xla_call_frames() {
    let lib = Library::new(
        "memcheck",
        vec![
            softmax::__tpu_kernel_export_softmax(),
            rmsnorm::__tpu_kernel_export_rmsnorm(),
            matmul::__tpu_kernel_export_matmul(),
        ],
    );
    assert_eq!(xla::metadata(&lib), (0, 5));
    let build = |v: serde_json::Value| {
        lib.build(&Request::from_json(&v).expect("request"))
            .expect("build")
    };
    let sm = build(
        serde_json::json!({"kernel": "softmax", "inputs": [{"shape": [64, 256], "dtype": "f32"}]}),
    );
    let mm = build(
        serde_json::json!({"kernel": "matmul", "inputs": [{"shape": [128, 256], "dtype": "bf16"}, {"shape": [256, 128], "dtype": "bf16"}]}),
    );
    let x = HostArray::random([64, 256], F32, 1).unwrap();
    let a = HostArray::random([128, 256], BF16, 2).unwrap();
    let b = HostArray::random([256, 128], BF16, 3).unwrap();
    let want_sm = sm.call.interpret(std::slice::from_ref(&x)).expect("run");
    let want_mm = mm.call.interpret(&[a.clone(), b.clone()]).expect("run");
    std::thread::scope(|s| {
        for t in 0..2 {
            let (lib, sm, mm) = (&lib, &sm, &mm);
            let (x, a, b, want_sm, want_mm) = (&x, &a, &b, &want_sm, &want_mm);
            s.spawn(move || {
                for _ in 0..2 {
                    let xb = XlaBuffer::with_offset(x, t);
                    let out = XlaBuffer::zeros(&[64, 256], F32);
                    xla::call(lib, &sm.ffi_request, &[&xb], &[&out]).expect("softmax");
                    assert_eq!(out.to_host(), want_sm[0]);
                    let (ab, bb) = (XlaBuffer::of(a), XlaBuffer::of(b));
                    let out = XlaBuffer::zeros(&[128, 128], BF16);
                    xla::call(lib, &mm.ffi_request, &[&ab, &bb], &[&out]).expect("matmul");
                    assert_eq!(out.to_host(), want_mm[0]);
                    // A result buffer of the wrong shape: an error, nothing written.
                    let small = XlaBuffer::zeros(&[8, 128], BF16);
                    let e = xla::call(lib, &mm.ffi_request, &[&ab, &bb], &[&small])
                        .expect_err("wrong result shape");
                    assert!(e.message.contains("output 0"), "{}", e.message);
                    assert_eq!(small.to_host(), HostArray::zeros([8, 128], BF16).unwrap());
                }
            });
        }
    });
}

/// The SPMD examples at small shapes: the rings as built, the all-gather matmul on two devices.
fn spmd_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = SPMD_EXAMPLES
        .iter()
        .filter(|(name, _)| *name != "all_gather_matmul")
        .map(|(name, build)| (*name, build()))
        .collect();
    let small = Mesh::new([("x", 2)]).unwrap().scope(|| {
        all_gather_matmul::all_gather_matmul_launch(
            ArrayType::new([16, 128], BF16),
            ArrayType::new([128, 128], BF16),
            "x".into(),
            0,
            None,
            None,
            false,
            Target::V6e,
        )
    });
    cases.push(("all_gather_matmul", small));
    assert_eq!(cases.len(), SPMD_EXAMPLES.len());
    cases
}

/// The SPMD examples on every device of a mesh (a thread per device, one running at a time; copies
/// between the devices' refs): against the reference, and the same bits poisoned and seeded.
#[test]
fn every_spmd_example_on_its_mesh() {
    use tpu_kernel::runtime::interpret::interpret_spmd;
    for (name, call) in spmd_cases() {
        let call = call.unwrap_or_else(|e| panic!("{name}: {e}"));
        let mesh = call.ir().mesh.clone().expect("a mesh");
        let devices = mesh.devices();
        let inputs: Vec<Vec<HostArray>> = (0..devices)
            .map(|d| reference::random_inputs(&call, d as u64))
            .collect();
        let got = call
            .interpret_spmd(&mesh, &inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (want, tol) = reference::expected_spmd(call.name(), &inputs)
            .unwrap_or_else(|| panic!("no reference for {name}"))
            .unwrap_or_else(|e| panic!("reference for {name}: {e}"));
        for (d, (g, w)) in got.iter().zip(&want).enumerate() {
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                let c = reference::compare(g, w, tol);
                assert!(
                    c.ok,
                    "{name} device {d} output {i}: max error {}",
                    c.max_abs_error
                );
            }
        }
        for (mode, opts) in modes() {
            let again = interpret_spmd(call.ir(), &mesh, &inputs, &opts)
                .unwrap_or_else(|e| panic!("{name} ({mode}): {e}"));
            assert_eq!(again, got, "{name} ({mode})");
        }
    }
}

/// A kernel that talks across devices through the FFI handler, as XLA runs a `jax.shard_map` on a
/// CPU mesh: one call per device, each on its own thread, meeting the others' in one launch; the mesh
/// numbers XLA's devices in another order than their ordinals.
#[test]
fn the_ffi_handler_runs_an_spmd_kernel_across_device_threads() {
    let lib = Library::new(
        "memcheck",
        vec![ring_all_gather::__tpu_kernel_export_ring_all_gather()],
    );
    let order = [3i64, 1, 0, 2];
    let mut request = serde_json::json!({"kernel": "ring_all_gather",
        "inputs": [{"shape": [8, 128], "dtype": "f32"}], "mesh": [["x", 4]]});
    let built = lib
        .build(&Request::from_json(&request).expect("request"))
        .expect("build");
    let mut ffi: serde_json::Value = serde_json::from_str(&built.ffi_request).unwrap();
    ffi["mesh_devices"] = serde_json::json!(order);
    let ffi = ffi.to_string();
    let shards: Vec<HostArray> = (0..4)
        .map(|d| HostArray::random([8, 128], F32, d).unwrap())
        .collect();
    let outs: Vec<HostArray> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|pos| {
                let (lib, ffi, shard) = (&lib, &ffi, &shards[pos]);
                s.spawn(move || {
                    xla::set_device(order[pos] as i32);
                    let x = XlaBuffer::of(shard);
                    let out = XlaBuffer::zeros(&[32, 128], F32);
                    xla::call(lib, ffi, &[&x], &[&out]).expect("ring_all_gather");
                    out.to_host()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<f32> = shards
        .iter()
        .flat_map(|a| a.as_slice::<f32>().unwrap().to_vec())
        .collect();
    for (pos, out) in outs.iter().enumerate() {
        assert_eq!(
            out.as_slice::<f32>().unwrap(),
            &want[..],
            "mesh position {pos}"
        );
    }
    // A device outside the mesh: an error naming it, no hang.
    request["mesh"] = serde_json::json!([["x", 1]]);
    let one = lib
        .build(&Request::from_json(&request).expect("request"))
        .expect("build");
    let mut ffi: serde_json::Value = serde_json::from_str(&one.ffi_request).unwrap();
    ffi["mesh_devices"] = serde_json::json!([5]);
    xla::set_device(0);
    let x = XlaBuffer::of(&shards[0]);
    let out = XlaBuffer::zeros(&[8, 128], F32);
    let e = xla::call(&lib, &ffi.to_string(), &[&x], &[&out]).unwrap_err();
    assert!(
        e.message
            .contains("device 0, which is not in the kernel's mesh"),
        "{}",
        e.message
    );
}

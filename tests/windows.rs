//! Windows real kernels use (issue 21, items 2 and 3): strided windows `ds(s, n).stride(k)` on VMEM
//! loads and stores (`tpu.strided_load` / `tpu.strided_store`, as Pallas lowers `pl.ds(s, n, k)`),
//! and run-time-sized DMA windows `ds(s, n)` with a traced `n` (`tpu.memref_slice` with dynamic
//! sizes, as Pallas lowers `pl.ds(s, traced_size)`).
//! Each construct: what it lowers to, the interpreter's numbers against a plain-Rust reference, the
//! Mosaic module run on the CPU agreeing bit for bit (run-time sizes included), run-time faults as the same error in both
//! engines at the user's line, and every trace-time mistake as a `KernelError` at its marked line
//! (`// E:<tag>`). The real toolchain's verdict is `python/tests/test_examples.py` (the `strided`
//! example against its Pallas twin).

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::{HostArray, InterpretOptions};
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::{ErrorKind, KernelError};

#[path = "common/marks.rs"]
mod marks;

#[path = "common/engines.rs"]
mod engines;
use engines::{engines_agree, f32_bits, one_block};

#[path = "../examples/strided.rs"]
#[allow(dead_code)]
mod strided;

const HERE: marks::Marked = marks::Marked {
    file: "windows.rs",
    src: include_str!("windows.rs"),
};

#[track_caller]
fn expect_err(r: Result<PallasCall, KernelError>, kind: ErrorKind, tag: &str, needles: &[&str]) {
    match r {
        Ok(_) => panic!("{tag}: expected a {kind:?} error, but build() succeeded"),
        Err(e) => HERE.check(&e, kind, tag, needles),
    }
}

/// Both engines fail; their errors.
fn both_errors(call: &PallasCall, inputs: &[HostArray]) -> [KernelError; 2] {
    let sequential = InterpretOptions {
        parallel: false,
        ..InterpretOptions::default()
    };
    let theirs = call
        .interpret_with(inputs, &sequential)
        .expect_err("the interpreter fails");
    let ours = mosaic_cpu::run(call.ir(), inputs).expect_err("mosaic_cpu fails");
    [theirs, ours]
}

fn rows(n: usize, seed: u64) -> HostArray {
    HostArray::random([n, 128], F32, seed).unwrap()
}

// ---------------------------------------------------------------------------------------------- strided

#[test]
fn the_strided_example_lowers_as_pallas_and_both_engines_give_the_reference() {
    let call = strided::build().expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    // Pallas's forms: one stride per ref dimension, the indices as `index` values.
    assert_eq!(mosaic.matches("tpu.strided_load").count(), 2, "{mosaic}");
    assert_eq!(mosaic.matches("tpu.strided_store").count(), 2, "{mosaic}");
    assert!(
        mosaic.contains(
            "{strides = array<i32: 2, 1>} : (memref<64x128xf32, #tpu.memory_space<vmem>>, index, index) -> vector<32x128xf32>"
        ),
        "{mosaic}"
    );
    assert!(!mosaic.contains("vector.load"), "{mosaic}");
    assert!(!mosaic.contains("tpu.vector_store"), "{mosaic}");
    let x = HostArray::random([512, 128], F32, 7).unwrap();
    let out = engines_agree(&call, std::slice::from_ref(&x));
    let want = tpu_kernel::reference::butterfly(&[x]).unwrap();
    assert_eq!(f32_bits(&out[0]), f32_bits(&want[0]));
}

/// A squeezed dimension beside a strided one, a traced start, a stride larger than the rows it
/// takes, and a strided store over part of a block that other stores fill.
#[tpu_kernel]
fn strided_mixed_kernel(x: Ref<f32>, o: RefMut<f32>, buf: RefMut<f32>) {
    let i = program_id(0);
    buf.at(0).store(x.load());
    buf.at(1).store(x.load() * 2.0);
    // Rows i, i + 3, i + 6, i + 9 of the doubled copy.
    let picked = buf.at((1, ds(i, 4).stride(3), ..)).load();
    o.store(zeros());
    o.at((ds(8 - 2 * i, 4).stride(2), ..)).store(picked);
}

#[test]
fn strided_windows_with_squeezed_dims_and_traced_starts_agree_with_the_reference() {
    let call = pallas_call(strided_mixed_kernel)
        .grid([3])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([48, 128], F32),
            BlockSpec::new([16, 128], |[i]| (i, 0)),
        )
        .scratch(Vmem::new([2, 16, 128], F32))
        .build()
        .expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert!(
        mosaic.contains("{strides = array<i32: 1, 3, 1>}"),
        "{mosaic}"
    );
    assert!(mosaic.contains("{strides = array<i32: 2, 1>}"), "{mosaic}");
    let x = rows(16, 3);
    let out = engines_agree(&call, std::slice::from_ref(&x));
    let xs = x.as_slice::<f32>().unwrap();
    let mut want = vec![0.0f32; 48 * 128];
    for i in 0..3 {
        for k in 0..4 {
            let (src, dst) = (i + 3 * k, 16 * i + 8 - 2 * i + 2 * k);
            for c in 0..128 {
                want[dst * 128 + c] = xs[src * 128 + c] * 2.0;
            }
        }
    }
    let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    assert_eq!(f32_bits(&out[0]), want);
}

#[tpu_kernel]
fn strided_oob_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    o.store(x.at((ds(i * 2, 8).stride(2), ..)).load()); // E:strided_oob
}

/// Step 1 reads rows 2, 4, .., 16 of a 16-row block: one past the end, though `2 + 8` rows fit.
#[test]
fn a_strided_window_past_the_ref_is_the_same_error_in_both_engines() {
    let call = pallas_call(strided_oob_kernel)
        .grid([2])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
        .expect("builds");
    let [theirs, ours] = both_errors(&call, &[rows(16, 1)]);
    HERE.check(&theirs, ErrorKind::OutOfBounds, "strided_oob", &["2..17"]);
    assert_eq!(ours.to_string(), theirs.to_string());
}

#[tpu_kernel]
fn stride_zero_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((ds(0, 8).stride(0), ..)).load()); // E:stride_zero
}

#[tpu_kernel]
fn stride_too_far_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((ds(0, 8).stride(3), ..)).load()); // E:stride_too_far
}

#[tpu_kernel]
fn stride_start_too_far_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((ds(2, 8).stride(2), ..)).load()); // E:stride_start_too_far
}

#[tpu_kernel]
fn stride_lanes_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.at((.., ds(0, 64)))
        .store(x.at((ds(0, 8), ds(0, 64).stride(2))).load()); // E:stride_lanes
}

#[tpu_kernel]
fn stride_wide_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((ds(0, 8).stride(2), ds(0, 128))).load()); // E:stride_wide
}

#[tpu_kernel]
fn stride_masked_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.at((ds(0, 8).stride(2), ..)).load();
    o.at((ds(0, 8).stride(2), ..)).store_masked(v, v > 0.0); // E:stride_masked
}

#[tpu_kernel]
fn stride_value_slice_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((ds(0, 8).stride(2), ..))); // E:stride_value_slice
}

#[tpu_kernel]
fn stride_dma_kernel(x: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    sync_copy(x.at((ds(0, 8).stride(2), ..)), buf, sem); // E:stride_dma
    o.store(buf.load());
}

#[test]
fn strided_window_mistakes_name_the_line() {
    let build = |k: fn(Ref<f32>, RefMut<f32>)| one_block(k, [16, 128], [8, 128]);
    expect_err(
        build(stride_zero_kernel),
        ErrorKind::OutOfBounds,
        "stride_zero",
        &["stride must be at least 1"],
    );
    expect_err(
        build(stride_too_far_kernel),
        ErrorKind::OutOfBounds,
        "stride_too_far",
        &["8 elements 3 apart spans 22 elements", "[16, 128]"],
    );
    expect_err(
        build(stride_start_too_far_kernel),
        ErrorKind::OutOfBounds,
        "stride_start_too_far",
        &["slice 2..17 (stride 2) along dimension 0"],
    );
    expect_err(
        build(stride_lanes_kernel),
        ErrorKind::Unsupported,
        "stride_lanes",
        &["last (lane) dimension", "Stride on last dim is not 1"],
    );
    expect_err(
        one_block(stride_wide_kernel, [16, 256], [8, 128]),
        ErrorKind::Unsupported,
        "stride_wide",
        &["128 lanes", "[16, 256]", "The last dim size is not 128"],
    );
    let masked = pallas_call(stride_masked_kernel)
        .grid([1])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .build();
    expect_err(
        masked,
        ErrorKind::Unsupported,
        "stride_masked",
        &["masked store into a strided window", "select"],
    );
    expect_err(
        build(stride_value_slice_kernel),
        ErrorKind::Unsupported,
        "stride_value_slice",
        &[
            "value slice takes stride 1",
            "r.at((ds(i, n).stride(2), ..)).load()",
        ],
    );
    let dma = pallas_call(stride_dma_kernel)
        .grid([1])
        .input_any(ArrayType::new([16, 128], F32))
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .build();
    expect_err(
        dma,
        ErrorKind::Unsupported,
        "stride_dma",
        &["strided window", "DMA endpoint", "Pallas refuses"],
    );
}

/// The hint of `stride_masked` builds, and gives what a masked strided store would.
#[tpu_kernel]
fn stride_masked_fixed_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at(ds(0, 16)).load());
    let v = x.at((ds(0, 8).stride(2), ..)).load();
    let old = o.at((ds(0, 8).stride(2), ..)).load();
    o.at((ds(0, 8).stride(2), ..))
        .store(select(v > 0.0, v * 2.0, old));
}

#[test]
fn the_masked_strided_store_hint_builds_and_runs() {
    let call = pallas_call(stride_masked_fixed_kernel)
        .grid([1])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .build()
        .expect("builds");
    let x = rows(16, 9);
    let out = engines_agree(&call, std::slice::from_ref(&x));
    let xs = x.as_slice::<f32>().unwrap();
    let want: Vec<u32> = (0..16 * 128)
        .map(|i| {
            let v = xs[i];
            match (i / 128) % 2 == 0 && v > 0.0 {
                true => (v * 2.0).to_bits(),
                false => v.to_bits(),
            }
        })
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

// ---------------------------------------------------------------------------------------------- run-time sizes

/// Step `i` copies rows `meta[i, 0]..meta[i, 0] + meta[i, 1]` of `x` (in HBM) into the first
/// `meta[i, 1]` rows of a zeroed VMEM buffer — a run-time-sized window on both ends of one DMA, as
/// tpu-inference copies pages (`pl.ds(start, traced_size)`) — waits with the same descriptor, then
/// stores the buffer.
#[tpu_kernel]
fn ragged_kernel(
    meta: Ref<i32, Smem>,
    x: Ref<f32, Any>,
    o: RefMut<f32>,
    buf: RefMut<f32>,
    sem: DmaSem,
) {
    let i = program_id(0);
    let (start, n) = (meta.at((i, 0)).load(), meta.at((i, 1)).load());
    buf.store(zeros());
    let copy = async_copy(x.at(ds(start, n)), buf.at(ds(0, n)), sem);
    copy.start(); // E:ragged_copy
    copy.wait();
    o.store(buf.load());
}

fn ragged_call(steps: usize) -> PallasCall {
    pallas_call(ragged_kernel)
        .grid([steps])
        .scalar_prefetch(ArrayType::new([steps, 2], I32))
        .input_any(ArrayType::new([64, 128], F32))
        .output(
            ArrayType::new([steps * 16, 128], F32),
            BlockSpec::new([16, 128], |[i]| (i, 0)),
        )
        .scratch(Vmem::new([16, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("builds")
}

/// The plain-Rust meaning of `ragged_kernel`.
fn ragged_reference(meta: &[i32], x: &[f32]) -> Vec<u32> {
    let mut out = vec![0.0f32; meta.len() / 2 * 16 * 128];
    for (i, m) in meta.chunks(2).enumerate() {
        let (start, n) = (m[0] as usize, m[1] as usize);
        out[i * 16 * 128..][..n * 128].copy_from_slice(&x[start * 128..][..n * 128]);
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_run_time_sized_dma_lowers_as_pallas_and_copies_the_rows_it_names() {
    let call = ragged_call(4);
    let mosaic = call.mosaic_mlir().expect("lowers and verifies");
    // Pallas's `_slice_memref`: `?` in the sliced type, the size as an i32 operand of its own segment.
    assert!(
        mosaic.contains("operandSegmentSizes = array<i32: 1, 2, 1>")
            && mosaic.contains("-> memref<?x128xf32, #tpu.memory_space<any>>")
            && mosaic.contains("-> memref<?x128xf32, #tpu.memory_space<vmem>>"),
        "{mosaic}"
    );
    let meta = vec![0, 16, 5, 3, 63, 1, 40, 9];
    let x = rows(64, 11);
    let inputs = [
        HostArray::from_vec([4, 2], meta.clone()).unwrap(),
        x.clone(),
    ];
    let out = call.interpret(&inputs).expect("runs");
    assert_eq!(
        f32_bits(&out[0]),
        ragged_reference(&meta, x.as_slice::<f32>().unwrap())
    );
    // Mosaic-on-CPU runs the emitted `?`-sized slices: the same bits.
    engines_agree(&call, &inputs);
    // Under every DMA completion timing: the copy's bytes are the run-time window's.
    for seed in 1..4 {
        let opts = InterpretOptions {
            dma_seed: Some(seed),
            ..InterpretOptions::default()
        };
        let again = call.interpret_with(&inputs, &opts).expect("runs");
        assert_eq!(f32_bits(&again[0]), f32_bits(&out[0]));
    }
}

#[test]
fn a_run_time_size_past_the_array_is_an_error_where_the_copy_starts() {
    let call = ragged_call(2);
    let x = rows(64, 2);
    // Step 1: rows 60..66 of a 64-row array; then a size of 0.
    for (meta, needle) in [
        (vec![0, 16, 60, 6], "60..66 along dimension 0"),
        (vec![0, 0, 0, 16], "run-time size of 0"),
        (
            vec![0, 17, 0, 16],
            "0..17 along dimension 0 of a window of shape [16, 128]",
        ),
    ] {
        let inputs = [HostArray::from_vec([2, 2], meta).unwrap(), x.clone()];
        // The same error, at the same line, from both engines.
        for e in both_errors(&call, &inputs) {
            HERE.check(&e, ErrorKind::OutOfBounds, "ragged_copy", &[needle]);
        }
        let [a, b] = both_errors(&call, &inputs);
        assert_eq!(a.message, b.message);
    }
}

/// Two run-time sizes on the two ends of one copy that disagree when the kernel runs: the same error
/// in both engines, at the copy's start.
#[tpu_kernel]
fn ragged_mismatch_kernel(
    meta: Ref<i32, Smem>,
    x: Ref<f32, Any>,
    o: RefMut<f32>,
    buf: RefMut<f32>,
    sem: DmaSem,
) {
    let (n, m) = (meta.at(0).load(), meta.at(1).load());
    buf.store(zeros());
    let copy = async_copy(x.at(ds(0, n)), buf.at(ds(0, m)), sem);
    copy.start(); // E:mismatch_copy
    copy.wait();
    o.store(buf.load());
}

#[test]
fn run_time_sizes_that_disagree_are_the_same_error_in_both_engines() {
    let call = pallas_call(ragged_mismatch_kernel)
        .grid([1])
        .scalar_prefetch(ArrayType::new([2], I32))
        .input_any(ArrayType::new([64, 128], F32))
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .scratch(Vmem::new([16, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("builds");
    let x = rows(64, 5);
    let same = [HostArray::from_vec([2], vec![8, 8]).unwrap(), x.clone()];
    engines_agree(&call, &same);
    let differ = [HostArray::from_vec([2], vec![8, 5]).unwrap(), x];
    let [a, b] = both_errors(&call, &differ);
    for e in [&a, &b] {
        HERE.check(
            e,
            ErrorKind::Shape,
            "mismatch_copy",
            &["[8, 128] into a window of shape [5, 128]"],
        );
    }
    assert_eq!(a.message, b.message);
}

#[tpu_kernel]
fn ragged_load_kernel(meta: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>) {
    let n = meta.at(0).load();
    o.store(x.at(ds(0, n)).load()); // E:ragged_load
}

#[tpu_kernel]
fn ragged_one_end_kernel(
    meta: Ref<i32, Smem>,
    x: Ref<f32, Any>,
    o: RefMut<f32>,
    buf: RefMut<f32>,
    sem: DmaSem,
) {
    let n = meta.at(0).load();
    sync_copy(x.at(ds(0, n)), buf, sem); // E:ragged_one_end
    o.store(buf.load());
}

#[tpu_kernel]
fn ragged_lanes_kernel(
    meta: Ref<i32, Smem>,
    x: Ref<f32, Any>,
    o: RefMut<f32>,
    buf: RefMut<f32>,
    sem: DmaSem,
) {
    let n = meta.at(0).load();
    sync_copy(x.at((ds(0, 16), ds(0, n))), buf.at((.., ds(0, n))), sem); // E:ragged_lanes
    o.store(buf.load());
}

/// The parameters of `ragged_kernel`'s mistaken variants.
type RaggedKernel = fn(Ref<i32, Smem>, Ref<f32, Any>, RefMut<f32>, RefMut<f32>, DmaSem);

#[test]
fn run_time_size_mistakes_name_the_line() {
    let load = pallas_call(ragged_load_kernel)
        .grid([1])
        .scalar_prefetch(ArrayType::new([1], I32))
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .build();
    expect_err(
        load,
        ErrorKind::Unsupported,
        "ragged_load",
        &["run-time size", "static shapes", "DMA endpoint"],
    );
    let dma = |k: RaggedKernel| {
        pallas_call(k)
            .grid([1])
            .scalar_prefetch(ArrayType::new([1], I32))
            .input_any(ArrayType::new([64, 128], F32))
            .output(
                ArrayType::new([16, 128], F32),
                BlockSpec::new([16, 128], |[_]| (0, 0)),
            )
            .scratch(Vmem::new([16, 128], F32))
            .scratch(DmaSem::one())
            .build()
    };
    expect_err(
        dma(ragged_one_end_kernel),
        ErrorKind::Shape,
        "ragged_one_end",
        &[
            "shape [?, 128] into a f32 window of shape [16, 128]",
            "ds(0, n)",
        ],
    );
    expect_err(
        dma(ragged_lanes_kernel),
        ErrorKind::Unsupported,
        "ragged_lanes",
        &["last (lane) dimension", "512 bytes"],
    );
}

/// For `python/tests/test_windows.py`: the StableHLO of `ragged_call(4)` built for each generation
/// named in `TPU_KERNEL_WINDOWS_TARGETS`, written to `TPU_KERNEL_WINDOWS_OUT/ragged_<gen>.mlir`.
#[test]
#[ignore = "run by python/tests/test_windows.py"]
fn export_ragged() {
    use tpu_kernel::runtime::serialize::CustomCall;
    let dir = std::path::PathBuf::from(std::env::var("TPU_KERNEL_WINDOWS_OUT").expect("out dir"));
    let targets = std::env::var("TPU_KERNEL_WINDOWS_TARGETS").expect("targets");
    for name in targets.split(',') {
        let target = Target::parse(name).expect("a target");
        let call = target.scope(|| ragged_call(4));
        let hlo = CustomCall::new(call.ir()).stablehlo().expect("StableHLO");
        std::fs::write(dir.join(format!("ragged_{name}.mlir")), hlo).expect("write");
    }
}

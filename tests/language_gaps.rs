//! The small constructs of issue 11 (item 5) that a Pallas port needs: value slicing, `full_like` /
//! `zeros_like`, ... Each one: the interpreter's numbers against a plain-Rust reference (bit for bit
//! where the op is exact), the shipped Mosaic module run on the CPU agreeing with the interpreter, and
//! every trace-time mistake as a `KernelError` located at the offending line (marked `// E:<tag>`).

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::{ErrorKind, KernelError};

// ---------------------------------------------------------------------------------------------- helpers

/// The line in this file carrying the marker comment `// E:<tag>`.
fn marked_line(tag: &str) -> u32 {
    let marker = format!("// E:{tag}");
    let src = include_str!("language_gaps.rs");
    let idx = src
        .lines()
        .position(|l| l.trim_end().ends_with(&marker))
        .unwrap_or_else(|| panic!("no marker {marker}"));
    idx as u32 + 1
}

#[track_caller]
fn expect_err(r: Result<PallasCall, KernelError>, kind: ErrorKind, tag: &str, needles: &[&str]) {
    let e = match r {
        Ok(_) => panic!("expected a {kind:?} error for {tag}, but build() succeeded"),
        Err(e) => e,
    };
    assert_eq!(e.kind, kind, "{tag}: wrong kind: {e}");
    for n in needles {
        assert!(e.message.contains(n), "{tag}: `{}` lacks `{n}`", e.message);
    }
    let loc = e
        .location
        .unwrap_or_else(|| panic!("{tag}: no location: {e}"));
    assert!(
        loc.file.ends_with("language_gaps.rs"),
        "{tag}: in {}",
        loc.file
    );
    assert_eq!(loc.line, marked_line(tag), "{tag}: wrong line in `{e}`");
}

fn f32_input(shape: [usize; 2]) -> (Vec<f32>, HostArray) {
    let v: Vec<f32> = (0..shape[0] * shape[1])
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
        .collect();
    (v.clone(), HostArray::from_vec(shape, v).unwrap())
}

fn f32_bits(a: &HostArray) -> Vec<u32> {
    a.as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// The interpreter and the Mosaic module run on the CPU give the same bits.
fn engines_agree(call: &PallasCall, inputs: &[HostArray]) -> Vec<HostArray> {
    let want = call
        .interpret(inputs)
        .unwrap_or_else(|e| panic!("{}: interpret: {e}", call.name()));
    let got = mosaic_cpu::compile(call.ir())
        .and_then(|c| c.run(inputs))
        .unwrap_or_else(|e| panic!("{}: mosaic_cpu: {e}", call.name()));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(f32_bits(g), f32_bits(w), "{}: engines differ", call.name());
    }
    want
}

fn one_block(
    kernel: impl tpu_kernel::launch::KernelFn<(Ref<f32>, RefMut<f32>)>,
    input: [usize; 2],
    output: [usize; 2],
) -> Result<PallasCall, KernelError> {
    pallas_call(kernel)
        .grid([1])
        .input(
            ArrayType::new(input, F32),
            BlockSpec::new(input, |[_]| (0, 0)),
        )
        .output(
            ArrayType::new(output, F32),
            BlockSpec::new(output, |[_]| (0, 0)),
        )
        .build()
}

// ---------------------------------------------------------------------------------------------- slicing

#[tpu_kernel]
fn slice_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load(); // [16, 256]
    let last_col = a.slice((.., 255..)); // [16, 1]
    let row3 = a.slice((3, ..)).reshape([1, 256]); // x[3]
    let window = a.slice((5..13, 1..129)); // [8, 128], unaligned both ways
    let col7 = a.slice((.., 7)).reshape([16, 1]).slice((8.., ..)); // x[8:, 7:8]
    o.store(window + last_col.slice((..8, ..)) + row3.slice((.., 100..228)) + col7 * 2.0);
}

#[test]
fn value_slices_take_the_right_elements_in_both_engines() {
    let call = one_block(slice_kernel, [16, 256], [8, 128]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert!(mosaic.contains("vector.extract_strided_slice"), "{mosaic}");
    assert!(
        mosaic.contains("offsets = [5, 1], sizes = [8, 128], strides = [1, 1]"),
        "{mosaic}"
    );
    let (x, input) = f32_input([16, 256]);
    let out = engines_agree(&call, &[input]);
    let at = |r: usize, c: usize| x[r * 256 + c];
    let want: Vec<u32> = (0..8 * 128)
        .map(|i| {
            let (r, c) = (i / 128, i % 128);
            (at(5 + r, 1 + c) + at(r, 255) + at(3, 100 + c) + at(8 + r, 7) * 2.0).to_bits()
        })
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

#[tpu_kernel]
fn slice_whole_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((.., ..)) + x.load().slice((0..8, 0..128)));
}

#[test]
fn a_whole_slice_is_the_value_itself() {
    let call = one_block(slice_whole_kernel, [8, 128], [8, 128]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert!(!mosaic.contains("extract_strided_slice"), "{mosaic}");
}

#[tpu_kernel]
fn slice_oob_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((.., 120..136))); // E:slice_oob
}

#[tpu_kernel]
fn slice_index_oob_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let row = x.load().slice((8, ..)); // E:slice_index_oob
    o.store(row.reshape([1, 128]));
}

#[tpu_kernel]
fn slice_rank_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((.., .., 0..1))); // E:slice_rank
}

#[tpu_kernel]
fn slice_empty_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((.., 4..4))); // E:slice_empty
}

#[tpu_kernel]
fn slice_dynamic_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    o.store(x.load().slice((ds(i, 1), ..)).broadcast_to([8, 128])); // E:slice_dynamic
}

#[tpu_kernel]
fn slice_every_dim_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((0, 0))); // E:slice_every_dim
}

#[test]
fn slicing_mistakes_name_the_line() {
    let build = |k: fn(Ref<f32>, RefMut<f32>)| one_block(k, [8, 128], [8, 128]);
    expect_err(
        build(slice_oob_kernel),
        ErrorKind::OutOfBounds,
        "slice_oob",
        &["slice 120..136 along dimension 1", "[8, 128]"],
    );
    expect_err(
        build(slice_index_oob_kernel),
        ErrorKind::OutOfBounds,
        "slice_index_oob",
        &["index 8 along dimension 0"],
    );
    expect_err(
        build(slice_rank_kernel),
        ErrorKind::Shape,
        "slice_rank",
        &["3 indices", "rank 2"],
    );
    expect_err(
        build(slice_empty_kernel),
        ErrorKind::Shape,
        "slice_empty",
        &["empty slice along dimension 1"],
    );
    expect_err(
        build(slice_dynamic_kernel),
        ErrorKind::Shape,
        "slice_dynamic",
        &["constant positions", "r.at((ds(i, n), ..)).load()"],
    );
    expect_err(
        build(slice_every_dim_kernel),
        ErrorKind::Shape,
        "slice_every_dim",
        &["single element", "i..i + 1"],
    );
}

/// The hint of `slice_dynamic` leads to a kernel that builds and runs: slice the ref instead.
#[tpu_kernel]
fn slice_dynamic_fixed_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    o.store(x.at((ds(i, 1), ..)).load().broadcast_to([8, 128]));
}

#[test]
fn the_dynamic_slice_hint_builds() {
    let call = one_block(slice_dynamic_fixed_kernel, [8, 128], [8, 128]).expect("builds");
    let (_, input) = f32_input([8, 128]);
    engines_agree(&call, &[input]);
}

// ---------------------------------------------------------------------------------------------- full_like

#[tpu_kernel]
fn like_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let row = a.slice((0..1, ..)); // [1, 128]
    o.store(full_like(a, 2.5) * a + zeros_like(o) + full_like(x, row) + zeros_like(a));
}

#[test]
fn full_like_and_zeros_like_copy_shape_and_type() {
    let call = one_block(like_kernel, [8, 128], [8, 128]).expect("builds");
    let (x, input) = f32_input([8, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..8 * 128)
        .map(|i| (2.5 * x[i] + 0.0 + x[i % 128] + 0.0).to_bits())
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

#[tpu_kernel]
fn like_bad_fill_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let col = x.load().slice((.., 0..2)); // [8, 2]
    o.store(full_like(x, col)); // E:like_bad_fill
}

#[test]
fn a_fill_that_does_not_broadcast_names_the_line() {
    let r = one_block(like_bad_fill_kernel, [8, 128], [8, 128]);
    expect_err(
        r,
        ErrorKind::Shape,
        "like_bad_fill",
        &["[8, 2] and [8, 128] cannot be broadcast together"],
    );
}

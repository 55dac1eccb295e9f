//! The small constructs of issue 11 (item 5) that a Pallas port needs: value slicing, `full_like` /
//! `zeros_like`, ... Each one: the interpreter's numbers against a plain-Rust reference (bit for bit
//! where the op is exact), the shipped Mosaic module run on the CPU agreeing with the interpreter, and
//! every trace-time mistake as a `KernelError` located at the offending line (marked `// E:<tag>`).

use tpu_kernel::prelude::*;
use tpu_kernel::{ErrorKind, KernelError};

// ---------------------------------------------------------------------------------------------- helpers

#[path = "common/marks.rs"]
mod marks;

#[path = "common/engines.rs"]
mod engines;
use engines::{engines_agree, f32_bits, f32_input, one_block};

const HERE: marks::Marked = marks::Marked {
    file: "language_gaps.rs",
    src: include_str!("language_gaps.rs"),
};

fn marked_line(tag: &str) -> u32 {
    HERE.line(tag)
}

#[track_caller]
fn expect_err(r: Result<PallasCall, KernelError>, kind: ErrorKind, tag: &str, needles: &[&str]) {
    expect_err_at(r, kind, tag, marked_line(tag), needles)
}

/// [`expect_err`] for an error on the line above its marker (a loop header, whose trailing comment
/// rustfmt moves into the body).
#[track_caller]
fn expect_err_above(
    r: Result<PallasCall, KernelError>,
    kind: ErrorKind,
    tag: &str,
    needles: &[&str],
) {
    expect_err_at(r, kind, tag, marked_line(tag) - 1, needles)
}

#[track_caller]
fn expect_err_at(
    r: Result<PallasCall, KernelError>,
    kind: ErrorKind,
    tag: &str,
    line: u32,
    needles: &[&str],
) {
    let e = match r {
        Ok(_) => panic!("expected a {kind:?} error for {tag}, but build() succeeded"),
        Err(e) => e,
    };
    HERE.check_at(&e, kind, tag, line, needles);
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

/// LLVM 22 prints `vector.extract_strided_slice` with its attributes in braces, a syntax jaxlib's newer
/// MLIR no longer parses; the generic form is what other tools get (`--emit mlir-generic`, `--check`, the
/// Python suite's strict verify), and it names the same op with the same attributes.
#[test]
fn generic_text_prints_slices_in_the_version_neutral_form() {
    let call = one_block(slice_kernel, [16, 256], [8, 128]).expect("builds");
    let generic = call.mosaic_mlir_generic().expect("lowers");
    assert!(
        generic.contains("\"vector.extract_strided_slice\"(%"),
        "{generic}"
    );
    assert!(
        generic.contains("<{offsets = [5, 1], sizes = [8, 128], strides = [1, 1]}>"),
        "{generic}"
    );
    assert!(
        !generic.contains("vector.extract_strided_slice %"),
        "{generic}"
    );
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

// ---------------------------------------------------------------------------------------------- ref += value

#[tpu_kernel]
fn ref_add_assign_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    o += x.load() * 0.5;
    o *= 3.0;
    o -= 1.0;
    o /= 2.0;
    o.at((ds(8, 8), ..)) += 10.0; // a window, rows 8..16
    o.at((0..8, ..)) -= x.at((8..16, ..)).load();
}

#[tpu_kernel]
fn ref_add_assign_spelled_out_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    // `o op= v` evaluates `v` first, then loads `o`.
    let v = x.load() * 0.5;
    o.store(o.load() + v);
    o.store(o.load() * 3.0);
    o.store(o.load() - 1.0);
    o.store(o.load() / 2.0);
    let w = o.at((ds(8, 8), ..));
    w.store(w.load() + 10.0);
    let top = o.at((0..8, ..));
    let v = x.at((8..16, ..)).load();
    top.store(top.load() - v);
}

#[test]
fn ref_compound_assignment_stores_into_the_ref() {
    let call = one_block(ref_add_assign_kernel, [16, 128], [16, 128]).expect("builds");
    let (x, input) = f32_input([16, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..16 * 128)
        .map(|i| {
            let v = (((x[i] + x[i] * 0.5) * 3.0) - 1.0) / 2.0;
            let (r, c) = (i / 128, i % 128);
            let v = if r >= 8 { v + 10.0 } else { v };
            let v = if r < 8 { v - x[(r + 8) * 128 + c] } else { v };
            v.to_bits()
        })
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
    // The same kernel as the spelled-out loads and stores, op for op.
    let spelled =
        one_block(ref_add_assign_spelled_out_kernel, [16, 128], [16, 128]).expect("builds");
    let named = |c: &PallasCall| c.mosaic_mlir().expect("lowers").replace(c.name(), "k");
    assert_eq!(named(&call), named(&spelled));
}

/// `o += ..` inside traced control flow: the ref is carried through unchanged (no loop value).
#[tpu_kernel]
fn ref_add_assign_in_loops_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(zeros());
    for i in 0..4 {
        o += x.at((ds(multiple_of(i * 8, 8), 8), ..)).load();
    }
    if program_id(0) == 0 {
        o *= 2.0;
    }
}

#[test]
fn ref_compound_assignment_in_traced_loops_and_branches() {
    let call = one_block(ref_add_assign_in_loops_kernel, [32, 128], [8, 128]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert!(mosaic.contains("scf.for"), "{mosaic}");
    assert!(mosaic.contains("scf.if"), "{mosaic}");
    // Nothing is carried: the loop and the branch have no results.
    assert!(!mosaic.contains("iter_args"), "{mosaic}");
    assert!(!mosaic.contains("scf.yield %"), "{mosaic}");
    let (x, input) = f32_input([32, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..8 * 128)
        .map(|i| {
            let mut s = 0.0f32;
            for k in 0..4 {
                s += x[k * 8 * 128 + i];
            }
            (s * 2.0).to_bits()
        })
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

/// `count.at(0) += 1` on an SMEM scratch cell, across grid steps.
#[tpu_kernel]
fn smem_add_assign_kernel(x: Ref<f32>, o: RefMut<f32>, count: RefMut<i32, Smem>) {
    if program_id(0) == 0 {
        count.at(0).store(0);
    }
    count.at(0) += 1;
    o.store(x.load() + count.at(0).load().cast::<f32>());
}

#[test]
fn smem_element_compound_assignment_counts_steps() {
    let call = pallas_call(smem_add_assign_kernel)
        .grid([4])
        .input(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .scratch(Smem::new([1], I32))
        .build()
        .expect("builds");
    let (x, input) = f32_input([32, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..32 * 128)
        .map(|i| (x[i] + (i / (8 * 128) + 1) as f32).to_bits())
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

#[tpu_kernel]
fn add_assign_shape_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o += x.load().slice((0..4, ..)); // E:add_assign_shape
}

#[tpu_kernel]
fn window_add_assign_shape_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.at((0..4, ..)) += x.load(); // E:window_add_assign_shape
}

#[tpu_kernel]
fn ref_reassigned_kernel(x: Ref<f32>, o: RefMut<f32>, t: RefMut<f32>) {
    let mut r = o;
    if program_id(0) == 0 {
        // E:ref_reassigned
        r = t;
    }
    r.store(x.load());
}

#[test]
fn compound_assignment_mistakes_name_the_line() {
    expect_err(
        one_block(add_assign_shape_kernel, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "add_assign_shape",
        &["[8, 128] and [4, 128] cannot be broadcast together"],
    );
    expect_err(
        one_block(window_add_assign_shape_kernel, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "window_add_assign_shape",
        &["[4, 128] and [8, 128] cannot be broadcast together"],
    );
}

#[test]
fn a_ref_reassigned_in_a_traced_branch_is_an_error() {
    let r = pallas_call(ref_reassigned_kernel)
        .grid([1])
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .scratch(Vmem::new([8, 128], F32))
        .build();
    let Err(e) = r else {
        panic!("a ref reassigned in a traced branch was accepted");
    };
    assert_eq!(e.kind, ErrorKind::Trace, "{e}");
    assert!(e.message.contains("assigns another ref"), "{e}");
    let loc = e.location.expect("located");
    // The `if` carrying `r`: the line above the marker.
    assert_eq!(loc.line, marked_line("ref_reassigned") - 1, "{e}");
}

// ---------------------------------------------------------------------------------------------- unroll

/// Four row bands summed by an unrolled loop: static slices at `p * 8`, no `scf.for`.
#[tpu_kernel]
fn unroll_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load(); // [32, 128]
    let mut acc = zeros_like(o);
    for p in unroll(0..4) {
        acc += a.slice((p * 8..p * 8 + 8, ..)) * (p + 1) as f32;
    }
    for p in unroll((0..128).step_by(64)) {
        o.at((.., p..p + 64)).store(acc.slice((.., p..p + 64)));
    }
}

#[test]
fn unrolled_loops_trace_the_body_per_step() {
    let call = one_block(unroll_kernel, [32, 128], [8, 128]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert!(!mosaic.contains("scf.for"), "{mosaic}");
    assert_eq!(
        mosaic.matches("vector.extract_strided_slice").count(),
        4 + 2,
        "{mosaic}"
    );
    for p in 0..4 {
        let offsets = format!("offsets = [{}, 0], sizes = [8, 128]", p * 8);
        assert!(mosaic.contains(&offsets), "{offsets}: {mosaic}");
    }
    assert_eq!(mosaic.matches("tpu.vector_store").count(), 2, "{mosaic}");
    let (x, input) = f32_input([32, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..8 * 128)
        .map(|i| {
            let mut acc = 0.0f32;
            for p in 0..4 {
                acc += x[p * 8 * 128 + i] * (p + 1) as f32;
            }
            acc.to_bits()
        })
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

#[tpu_kernel]
fn unroll_zero_step_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    for _ in unroll((0..4).step_by(0)) {
        // E:unroll_step
        o += 1.0;
    }
}

#[tpu_kernel]
fn unroll_negative_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    let lo: i32 = -2;
    for _ in unroll(lo..2) {
        // E:unroll_negative
        o += 1.0;
    }
}

#[test]
fn unrolled_loop_mistakes_name_the_line() {
    expect_err_above(
        one_block(unroll_zero_step_kernel, [8, 128], [8, 128]),
        ErrorKind::Grid,
        "unroll_step",
        &["step must be positive, got 0"],
    );
    expect_err_above(
        one_block(unroll_negative_kernel, [8, 128], [8, 128]),
        ErrorKind::Grid,
        "unroll_negative",
        &["must not be negative, got -2..2"],
    );
}

// ---------------------------------------------------------------------------------------------- bind

#[tpu_kernel]
fn scale_shift_kernel(x: Ref<f32>, o: RefMut<f32>, scale: f32, rows: usize) {
    o.store(x.load() * scale);
    o.at((0..rows, ..)) += 1.0;
}

#[tpu_kernel]
fn scale_only_kernel(x: Ref<f32>, o: RefMut<f32>, scale: f32) {
    o.store(x.load() * scale);
}

#[test]
fn bound_parameters_keep_the_kernel_and_its_name() {
    let (x, input) = f32_input([8, 128]);
    let one = one_block(scale_only_kernel.bind(2.5), [8, 128], [8, 128]).expect("builds");
    assert_eq!(one.name(), "scale_only_kernel");
    let out = engines_agree(&one, std::slice::from_ref(&input));
    let want: Vec<u32> = x.iter().map(|v| (v * 2.5).to_bits()).collect();
    assert_eq!(f32_bits(&out[0]), want);

    let two = one_block(scale_shift_kernel.bind((0.5, 3)), [8, 128], [8, 128]).expect("builds");
    assert_eq!(two.name(), "scale_shift_kernel");
    assert!(two
        .mosaic_mlir()
        .expect("lowers")
        .contains("func.func @scale_shift_kernel"));
    let out = engines_agree(&two, &[input]);
    let want: Vec<u32> = (0..8 * 128)
        .map(|i| (x[i] * 0.5 + if i / 128 < 3 { 1.0 } else { 0.0 }).to_bits())
        .collect();
    assert_eq!(f32_bits(&out[0]), want);

    // `.name(..)` still wins.
    let renamed = pallas_call(scale_only_kernel.bind(1.0))
        .name("renamed")
        .grid([1])
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .build()
        .expect("builds");
    assert_eq!(renamed.name(), "renamed");
}

#[tpu_kernel]
fn bound_rows_kernel(x: Ref<f32>, o: RefMut<f32>, rows: usize) {
    o.store(x.load().slice((0..rows, ..))); // E:bound_rows
}

#[test]
fn a_bound_value_the_kernel_rejects_names_the_kernel_line() {
    expect_err(
        one_block(bound_rows_kernel.bind(4), [8, 128], [8, 128]),
        ErrorKind::Shape,
        "bound_rows",
        &["storing a value of shape [4, 128] into a window of shape [8, 128]"],
    );
}

// ---------------------------------------------------------------------------------------- scalar min/max

/// `Scalar::min` / `Scalar::max` in a kernel body (a clamped index, a float bound): scalar results,
/// usable as window starts and loop bounds, as Pallas's `jnp.minimum` of two scalars.
#[tpu_kernel]
fn scalar_min_max_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    let row = (i * 8i32).min(16); // steps 2 and 3 read rows 16..24 again
    let floor = scalar(2.5f32).max(i.cast::<f32>());
    let mut acc = x.at((ds(multiple_of(row, 8), 8), ..)).load();
    for _ in 0..(i - 1i32).max(0) {
        acc += floor.min(3.0);
    }
    o.store(acc);
}

#[test]
fn scalar_min_and_max_in_a_body_stay_scalars_in_both_engines() {
    let call = pallas_call(scalar_min_max_kernel)
        .grid([4])
        .input(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([32, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
        .expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    for op in [
        "arith.minsi %",
        "arith.maxsi %",
        "arith.maximumf %",
        "arith.minimumf %",
    ] {
        let line = mosaic
            .lines()
            .find(|l| l.contains(op))
            .unwrap_or_else(|| panic!("no {op} in {mosaic}"));
        assert!(
            line.ends_with(": i32") || line.ends_with(": f32"),
            "{op} is not a scalar op: {line}"
        );
    }
    let (x, input) = f32_input([32, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..32 * 128)
        .map(|k| {
            let (i, r, c) = (k / (8 * 128), k / 128 % 8, k % 128);
            let mut v = x[((i * 8).min(16) + r) * 128 + c];
            for _ in 0..i.saturating_sub(1) {
                v += 2.5f32.max(i as f32).min(3.0);
            }
            v.to_bits()
        })
        .collect();
    assert_eq!(f32_bits(&out[0]), want);
}

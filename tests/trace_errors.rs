//! Trace-time errors: user mistakes that only concrete shapes reveal. Each must be a `KernelError` value of
//! the right kind, with a message a user can act on, located at the offending Rust line (marked `// E:<tag>`
//! in this file) — never a panic.

use tpu_kernel::prelude::*;
use tpu_kernel::{ErrorKind, KernelError};

#[path = "common/marks.rs"]
mod marks;

const HERE: marks::Marked = marks::Marked {
    file: "trace_errors.rs",
    src: include_str!("trace_errors.rs"),
};

#[track_caller]
fn expect_err(
    r: Result<PallasCall, KernelError>,
    kind: ErrorKind,
    tag: &str,
    needles: &[&str],
) -> KernelError {
    HERE.expect_err(r, kind, tag, needles)
}

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

fn f32s(shape: [usize; 2]) -> ArrayType {
    ArrayType::new(shape, F32)
}

fn bf16s(shape: [usize; 2]) -> ArrayType {
    ArrayType::new(shape, BF16)
}

#[test]
fn tiling_rule_names_the_block_and_a_fix() {
    let r = pallas_call(copy_kernel)
        .grid([8, 4])
        .input(f32s([512, 512]), BlockSpec::new([64, 100], |[i, j]| [i, j])) // E:tiling
        .output(f32s([512, 512]), BlockSpec::new([64, 128], |[i, j]| [i, j]))
        .build();
    let e = expect_err(
        r,
        ErrorKind::Tiling,
        "tiling",
        &["[64, 100]", "divisible by 128"],
    );
    assert_eq!(e.argument.as_deref(), Some("input 0"));
}

/// A block larger than its array is one padded edge block, as in Pallas (which accepts it, and libtpu
/// compiles it: found by sending our rejected random launches through libtpu,
/// `python/tests/test_fuzz_libtpu.py`): reads past the array are padding, writes past it are dropped.
#[test]
fn block_larger_than_array_is_one_padded_edge_block() {
    let call = pallas_call(copy_kernel)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([16, 128], |[i]| (i, 0)))
        .output(f32s([8, 128]), BlockSpec::new([16, 128], |[i]| (i, 0)))
        .build()
        .expect("a block larger than the array is accepted");
    call.mosaic_mlir().expect("lowers");
    let x = tpu_kernel::runtime::interpret::HostArray::random([8, 128], F32, 7).expect("small");
    let out = call.interpret(std::slice::from_ref(&x)).expect("runs");
    assert_eq!(out[0], x, "the copy through a padded block is exact");
}

#[test]
fn index_map_returns_wrong_rank() {
    let r = pallas_call(copy_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| [i])) // E:rank
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(
        r,
        ErrorKind::Grid,
        "rank",
        &["returns 1 block indices", "rank 2"],
    );
}

#[test]
fn index_map_arity_differs_from_grid() {
    let r = pallas_call(copy_kernel)
        .grid([4, 1])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0))) // E:arity
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i, j]| (i, j)))
        .build();
    expect_err(
        r,
        ErrorKind::Grid,
        "arity",
        &["takes 1 grid indices", "2 axes"],
    );
}

#[test]
fn dtype_of_parameter_and_array_differ() {
    let r = pallas_call(copy_kernel)
        .grid([4])
        .input(bf16s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0))) // E:dtype
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(r, ErrorKind::DType, "dtype", &["f32", "bf16"]);
}

#[test]
fn output_not_covered_by_grid() {
    let r = pallas_call(copy_kernel)
        .grid([2])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0))) // E:cover
        .build();
    let e = expect_err(
        r,
        ErrorKind::Grid,
        "cover",
        &["never writes output block [2, 0]"],
    );
    assert_eq!(e.argument.as_deref(), Some("output 0"));
}

#[test]
fn index_map_out_of_bounds() {
    let r = pallas_call(copy_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i + 1, 0))) // E:oob
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(
        r,
        ErrorKind::OutOfBounds,
        "oob",
        &["grid point [3]", "block [4, 0]"],
    );
}

#[test]
fn dimension_semantics_length() {
    let r = pallas_call(copy_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .dimension_semantics([Parallel, Arbitrary]) // E:semantics
        .build();
    expect_err(r, ErrorKind::Grid, "semantics", &["2 entries", "1 axes"]);
}

#[test]
fn vmem_budget() {
    let r = pallas_call(copy_kernel) // E:vmem
        .grid([1])
        .input(
            f32s([2048, 2048]),
            BlockSpec::new([2048, 2048], |[i]| (i, 0)),
        )
        .output(
            f32s([2048, 2048]),
            BlockSpec::new([2048, 2048], |[i]| (i, 0)),
        )
        .build();
    expect_err(
        r,
        ErrorKind::Vmem,
        "vmem",
        &["64.00 MiB", "limit is 16.00 MiB", "vmem_limit_bytes"],
    );
}

#[test]
fn raising_the_vmem_limit_accepts_the_same_kernel() {
    let r = pallas_call(copy_kernel)
        .grid([1])
        .input(
            f32s([2048, 2048]),
            BlockSpec::new([2048, 2048], |[i]| (i, 0)),
        )
        .output(
            f32s([2048, 2048]),
            BlockSpec::new([2048, 2048], |[i]| (i, 0)),
        )
        .vmem_limit_bytes(64 << 20)
        .build();
    assert!(r.is_ok(), "{:?}", r.err());
}

#[test]
fn kernel_takes_fewer_parameters_than_launch() {
    let r = pallas_call(copy_kernel) // E:arity_params
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(
        r,
        ErrorKind::Signature,
        "arity_params",
        &["takes 2 parameters", "declares 3"],
    );
}

#[tpu_kernel]
fn shape_mismatch_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    let s = x.load() + y.load(); // E:body_shape
    o.store(s);
}

#[test]
fn elementwise_shape_mismatch_in_body() {
    let r = pallas_call(shape_mismatch_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .input(f32s([64, 128]), BlockSpec::new([16, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(
        r,
        ErrorKind::Shape,
        "body_shape",
        &["[8, 128]", "[16, 128]", "cannot be broadcast"],
    );
}

#[tpu_kernel]
fn bad_dot_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<f32>) {
    o.store(dot(x.load(), y.load())); // E:dot
}

#[test]
fn dot_contraction_mismatch() {
    let r = pallas_call(bad_dot_kernel)
        .grid([1])
        .input(
            ArrayType::new([128, 256], BF16),
            BlockSpec::new([128, 256], |[_]| (0, 0)),
        )
        .input(
            ArrayType::new([128, 128], BF16),
            BlockSpec::new([128, 128], |[_]| (0, 0)),
        )
        .output(f32s([128, 128]), BlockSpec::new([128, 128], |[_]| (0, 0)))
        .build();
    expect_err(r, ErrorKind::Shape, "dot", &["contraction", "256", "128"]);
}

#[tpu_kernel]
fn bad_axis_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let s = x.load().sum_keepdims(2); // E:axis
    o.store(s.broadcast_to([8, 128]));
}

#[test]
fn reduction_axis_out_of_range() {
    let r = pallas_call(bad_axis_kernel)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build();
    expect_err(r, ErrorKind::Shape, "axis", &["axis 2", "rank 2"]);
}

#[tpu_kernel]
fn bad_program_id_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(1); // E:program_id
    o.store(x.load() + i.cast::<f32>());
}

#[test]
fn program_id_axis_out_of_range() {
    let r = pallas_call(bad_program_id_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(
        r,
        ErrorKind::Grid,
        "program_id",
        &["program_id(1)", "1 axes"],
    );
}

#[tpu_kernel]
fn static_slice_oob_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((ds(4, 8), ..)).load()); // E:slice
}

#[test]
fn static_slice_out_of_bounds() {
    let r = pallas_call(static_slice_oob_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(r, ErrorKind::OutOfBounds, "slice", &["4..12", "[8, 128]"]);
}

#[rustfmt::skip] // keeps the marker comment on the `for` line
#[tpu_kernel]
fn carried_shape_change_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let mut acc = x.load();
    for _i in 0..4 { // E:carry
        acc = acc.sum_keepdims(0);
    }
    o.store(acc.broadcast_to([8, 128]));
}

#[test]
fn loop_carried_value_changes_shape() {
    let r = pallas_call(carried_shape_change_kernel)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build();
    expect_err(
        r,
        ErrorKind::Shape,
        "carry",
        &["[8x128]f32", "[1x128]f32", "keep its shape"],
    );
}

#[tpu_kernel]
fn store_shape_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().sum_keepdims(0)); // E:store
}

#[test]
fn store_of_wrong_shape() {
    let r = pallas_call(store_shape_kernel)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build();
    expect_err(r, ErrorKind::Shape, "store", &["[1, 128]", "[8, 128]"]);
}

#[test]
fn a_panicking_kernel_body_is_an_error_not_a_crash() {
    #[tpu_kernel]
    fn panicky(x: Ref<f32>, o: RefMut<f32>) {
        let dims = x.shape();
        let n = dims[5];
        o.store(full([8, 128], n as f32));
    }
    let r = pallas_call(panicky)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build();
    let e = r.expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::Trace);
    assert!(
        e.message.contains("panicked") && e.message.contains("index out of bounds"),
        "{e}"
    );
    // The thread is usable afterwards.
    assert!(pallas_call(copy_kernel)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .is_ok());
}

#[test]
fn traced_api_used_outside_a_kernel_is_reported_by_the_next_build() {
    let _stray = program_id(0); // E:stray
    let r = pallas_call(copy_kernel)
        .grid([1])
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build();
    expect_err(r, ErrorKind::Trace, "stray", &["outside of a kernel trace"]);
}

#[test]
fn error_display_names_file_line_and_argument() {
    let r = pallas_call(copy_kernel)
        .grid([8, 4])
        .input(f32s([512, 512]), BlockSpec::new([64, 100], |[i, j]| [i, j]))
        .output(f32s([512, 512]), BlockSpec::new([64, 128], |[i, j]| [i, j]))
        .build();
    let shown = r.expect_err("tiling").to_string();
    assert!(shown.starts_with("tests/trace_errors.rs:"), "{shown}");
    assert!(
        shown.contains(": input 0: block shape [64, 100]"),
        "{shown}"
    );
}

#[tpu_kernel]
fn error_in_branch_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    if program_id(0) == 1 {
        o.store(x.load().sum_keepdims(1)); // E:branch
    }
}

#[test]
fn error_inside_a_traced_branch_is_located_in_the_branch() {
    let r = pallas_call(error_in_branch_kernel)
        .grid([2])
        .input(f32s([16, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([16, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    expect_err(r, ErrorKind::Shape, "branch", &["[8, 1]", "[8, 128]"]);
}

#[test]
fn absurd_grids_are_errors_not_overflows() {
    let build = |grid: [usize; 3]| {
        pallas_call(copy_kernel)
            .grid(grid) // E:grid
            .input(f32s([8, 128]), BlockSpec::new([8, 128], |[_, _, _]| (0, 0)))
            .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_, _, _]| (0, 0)))
            .build()
    };
    let huge = i32::MAX as usize;
    expect_err(
        build([huge, huge, huge]),
        ErrorKind::Grid,
        "grid",
        &["2^48 steps"],
    );
    expect_err(build([4, 0, 1]), ErrorKind::Grid, "grid", &["empty axis 1"]);
    expect_err(build([huge + 1, 1, 1]), ErrorKind::Grid, "grid", &["i32"]);
}

#[test]
fn enormous_arrays_are_checked_without_overflow_or_huge_allocations() {
    // 2^58 bytes: representable (past i64::MAX bytes is a Shape error, tests/hostile_input.rs)
    let n = 1usize << 28;
    let r = pallas_call(copy_kernel)
        .grid([1])
        .input(f32s([n, n]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .scratch(Vmem::new([n, n], F32))
        .build();
    // The launch has 3 operands for a 2-parameter kernel: reported first, as a value.
    assert_eq!(r.expect_err("mismatch").kind, ErrorKind::Signature);
    #[tpu_kernel]
    fn with_scratch(x: Ref<f32>, o: RefMut<f32>, s: RefMut<f32>) {
        s.at((ds(0, 8), ds(0, 128))).store(x.load());
        o.store(x.load());
    }
    let r = pallas_call(with_scratch)
        .grid([1])
        .input(f32s([n, n]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .scratch(Vmem::new([n, n], F32))
        .build();
    let e = r.expect_err("VMEM");
    assert_eq!(e.kind, ErrorKind::Vmem, "{e}");
}

fn mistake_then_panic_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    let bad = x.load() + y.load(); // E:first_mistake
    let rows = bad.shape()[0]; // the poisoned value has no shape: this indexing panics
    o.store(x.load() * rows as f32);
}

#[test]
fn a_panic_after_a_mistake_reports_the_mistake() {
    let r = pallas_call(mistake_then_panic_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .input(f32s([64, 128]), BlockSpec::new([16, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build();
    // The first recorded error, at its own line — not "the kernel body panicked: index out of bounds".
    let e = expect_err(
        r,
        ErrorKind::Shape,
        "first_mistake",
        &["cannot be broadcast"],
    );
    assert!(!e.message.contains("panicked"), "{e}");
}

//! Hostile input (issue 13, item 1): sizes and integers no kernel could use are errors naming the
//! argument and the Rust line — never a panic blamed on the body, an abort, or a silently wrapped value —
//! in debug and release alike. One test per reproducer of the issue.

use tpu_kernel::prelude::*;
use tpu_kernel::{ErrorKind, KernelError};

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

#[tpu_kernel]
fn copy_with_scratch_kernel(x: Ref<f32>, o: RefMut<f32>, _s: RefMut<f32>) {
    o.store(x.load());
}

fn tile() -> ArrayType {
    ArrayType::new([8, 128], F32)
}

/// The line of this file holding `marker` (a comment at the end of the line the error must name).
fn line_of(marker: &str) -> u32 {
    let src = include_str!("hostile_input.rs");
    let at = src.find(marker).expect("marker in this file");
    src[..at].lines().count() as u32
}

fn not_blamed_on_the_body(e: &KernelError) {
    assert!(!e.message.contains("panicked"), "{e}");
}

#[test]
fn a_scratch_buffer_past_mlir_dims_is_a_shape_error() {
    let e = pallas_call(copy_with_scratch_kernel)
        .grid([1])
        .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .scratch(Vmem::new([usize::MAX], F32))
        .build()
        .expect_err("usize::MAX scratch");
    not_blamed_on_the_body(&e);
    assert_eq!(e.kind, ErrorKind::Shape, "{e}");
    assert!(
        e.message
            .contains("above the largest MLIR dimension, i64::MAX"),
        "{e}"
    );
    assert!(
        e.to_string().contains("scratch 0"),
        "names the operand: {e}"
    );
    assert!(e.to_string().contains("tests/hostile_input.rs"), "{e}");
}

#[test]
fn a_block_near_usize_max_is_an_error_not_an_overflowing_tiling_hint() {
    let e = pallas_call(copy_kernel)
        .grid([1])
        .input(
            ArrayType::new([8, usize::MAX], F32),
            BlockSpec::new([8, usize::MAX - 1], |[_]| (0, 0)),
        )
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("huge array");
    not_blamed_on_the_body(&e);
    assert!(e.to_string().contains("input 0"), "{e}");
    assert!(e.message.contains("i64::MAX"), "{e}");
}

#[test]
fn an_array_whose_bytes_overflow_is_an_error() {
    let e = pallas_call(copy_kernel)
        .grid([1])
        .input(
            ArrayType::new([1 << 31, 1 << 31, 8, 128], F32),
            BlockSpec::new([1, 1, 8, 128], |[_]| (0, 0, 0, 0)),
        )
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("2^62 f32 elements");
    assert!(e.message.contains("overflows"), "{e}");
}

#[tpu_kernel]
fn reshape_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.load().reshape([usize::MAX, 2]); // <- overflowing reshape
    o.store(v.reshape([8, 128]));
}

#[test]
fn a_reshape_whose_element_count_overflows_is_an_error_at_its_line() {
    let e = pallas_call(reshape_kernel)
        .grid([1])
        .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("overflowing reshape");
    not_blamed_on_the_body(&e);
    assert!(e.message.contains("element count overflows"), "{e}");
    let line = e.location.as_ref().map(|l| l.line).expect("located");
    assert_eq!(
        line,
        line_of("// <- overflowing reshape"),
        "at the reshape: {e}"
    );
}

#[test]
fn an_index_map_constant_past_i32_is_an_error_not_block_0() {
    let e = pallas_call(copy_kernel)
        .grid([1])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[_]| (1usize << 32, 0)),
        )
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("block index 2^32");
    assert!(e.message.contains("4294967296"), "{e}");
    assert!(e.message.contains("does not fit i32"), "{e}");
    assert!(e.to_string().contains("input 0"), "{e}");
}

#[tpu_kernel]
fn far_window_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at(((1usize << 32)..(1usize << 32) + 8, ..)).load()); // <- far window
}

#[tpu_kernel]
fn far_from_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at(((1usize << 32).., ..)).load()); // <- far from
}

#[tpu_kernel]
fn huge_loop_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let mut acc = x.load();
    // the huge loop is on the next line
    for _ in 0..(1usize << 31) {
        acc += 1.0;
    }
    o.store(acc);
}

fn one_tile(kernel: impl tpu_kernel::launch::KernelFn<(Ref<f32>, RefMut<f32>)>) -> KernelError {
    pallas_call(kernel)
        .grid([1])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("rejected")
}

#[test]
fn rust_integers_past_i32_in_windows_and_loops_are_errors_at_their_lines() {
    for (kernel_line, e) in [
        (line_of("// <- far window"), one_tile(far_window_kernel)),
        (line_of("// <- far from"), one_tile(far_from_kernel)),
        (
            line_of("// the huge loop is on the next line") + 1,
            one_tile(huge_loop_kernel),
        ),
    ] {
        not_blamed_on_the_body(&e);
        assert_eq!(e.kind, ErrorKind::OutOfBounds, "{e}");
        assert_eq!(
            e.location.as_ref().map(|l| l.line),
            Some(kernel_line),
            "{e}"
        );
    }
}

#[test]
fn squeezing_a_dimension_the_block_lacks_names_it() {
    let e = pallas_call(copy_kernel)
        .grid([1])
        .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)).squeeze(5))
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("squeeze(5)");
    assert!(
        e.message.contains(
            "`.squeeze(5)` names a dimension the block shape [8, 128] (rank 2) does not have"
        ),
        "{e}"
    );
}

#[test]
fn host_arrays_of_overflowing_shapes_are_errors() {
    use tpu_kernel::runtime::interpret::{HostArray, HostData};
    let huge = [1usize << 32, 1 << 32];
    for e in [
        HostArray::zeros(huge, F32).map(|_| ()),
        HostArray::random(huge, F32, 0).map(|_| ()),
        HostArray::new(huge, HostData::zeros(F32, 0)).map(|_| ()),
    ] {
        let e = e.expect_err("2^64 elements");
        assert!(e.message.contains("its size overflows"), "{e}");
    }
}

/// A 4 TiB output an accepted kernel writes: interpreting it is an error naming the output, not the
/// process aborting in the allocator; the limit is an option.
#[test]
fn an_output_past_the_memory_limit_is_an_error_not_an_abort() {
    use tpu_kernel::runtime::interpret::{HostArray, InterpretOptions};
    let call = pallas_call(copy_kernel)
        .grid([1 << 17, 1 << 13])
        .input(tile(), BlockSpec::new([8, 128], |[_, _]| (0, 0)))
        .output(
            ArrayType::new([1 << 20, 1 << 20], F32),
            BlockSpec::new([8, 128], |[i, j]| (i, j)),
        )
        .build()
        .expect("a valid (if huge) kernel");
    let x = HostArray::zeros([8, 128], F32).unwrap();
    let e = call.interpret(std::slice::from_ref(&x)).expect_err("4 TiB");
    assert_eq!(e.kind, ErrorKind::Memory, "{e}");
    assert!(
        e.message
            .contains("output 0 ([1048576, 1048576] f32) needs 4398046511104 bytes"),
        "{e}"
    );
    // a small limit refuses a small output the same way
    let small = pallas_call(copy_kernel)
        .grid([1])
        .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .unwrap();
    let opts = InterpretOptions {
        memory_limit: 1024,
        ..Default::default()
    };
    let e = small
        .interpret_with(std::slice::from_ref(&x), &opts)
        .expect_err("limit");
    assert!(e.message.contains("InterpretOptions::memory_limit"), "{e}");
    assert!(small.interpret(std::slice::from_ref(&x)).is_ok());
}

#[tpu_kernel]
fn library_bug_kernel(x: Ref<f32>, o: RefMut<f32>) {
    tpu_kernel::trace::__library_panic_for_tests();
    o.store(x.load());
}

#[tpu_kernel]
fn body_panic_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let dims = x.shape();
    let _ = dims[7]; // <- the body's own panic
    o.store(x.load());
}

/// A panic inside the library is an internal error saying so (with where it happened); a panic in the
/// user's body is blamed on the body, at its line.
#[test]
fn library_panics_are_internal_errors_and_body_panics_name_their_line() {
    let build = |k: fn(Ref<f32>, RefMut<f32>)| {
        pallas_call(k)
            .grid([1])
            .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
            .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
            .build()
            .expect_err("panics")
    };
    let e = build(library_bug_kernel);
    assert_eq!(e.kind, ErrorKind::Internal, "{e}");
    assert!(e.message.contains("kernel-runtime/src/trace/api.rs"), "{e}");
    assert!(e.message.contains("a bug in tpu-kernel"), "{e}");
    let e = build(body_panic_kernel);
    assert_eq!(e.kind, ErrorKind::Trace, "{e}");
    let line = line_of("// <- the body's own panic");
    assert!(
        e.message
            .contains(&format!("tests/hostile_input.rs:{line}:")),
        "{e}"
    );
}

#[test]
fn an_empty_kernel_name_is_an_error_not_an_invalid_module() {
    let e = pallas_call(copy_kernel)
        .name("")
        .grid([1])
        .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .build()
        .expect_err("empty name");
    assert!(e.message.contains("the kernel name \"\" is empty"), "{e}");
}

#[tpu_kernel]
fn element_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.at(0).store(x.at(0).load());
}

/// What lowering cannot emit, `build()` rejects: a rank-0 VMEM window (every block dimension squeezed,
/// or `x.at(0)` on a rank-1 block) cannot be loaded by Mosaic.
#[test]
fn rank_0_vmem_windows_are_rejected_by_build() {
    let e = pallas_call(copy_kernel)
        .grid([1])
        .input(
            ArrayType::new([1, 1], F32),
            BlockSpec::new([1, 1], |[_]| (0, 0)).squeeze(0).squeeze(1),
        )
        .output(
            ArrayType::new([1, 1], F32),
            BlockSpec::new([1, 1], |[_]| (0, 0)).squeeze(0).squeeze(1),
        )
        .build()
        .expect_err("fully squeezed");
    assert!(
        e.message
            .contains("loading a single element from a VMEM ref"),
        "{e}"
    );
    let e = pallas_call(element_kernel)
        .grid([1])
        .input(
            ArrayType::new([128], F32),
            BlockSpec::new([128], |[_]| (0,)),
        )
        .output(
            ArrayType::new([128], F32),
            BlockSpec::new([128], |[_]| (0,)),
        )
        .build()
        .expect_err("x.at(0) on rank 1");
    assert!(
        e.message
            .contains("loading a single element from a VMEM ref"),
        "{e}"
    );
}

/// Found by python/tests/test_fuzz_libtpu.py (random launches through libtpu): two launches our checks
/// accepted and libtpu rejected.
#[test]
fn false_accepts_found_by_the_libtpu_fuzz_are_rejected() {
    #[tpu_kernel]
    fn copy_bf16(x: Ref<bf16>, o: RefMut<bf16>) {
        o.store(x.load());
    }
    // a rank-1 bf16 block of 128: libtpu tiles 1-D bf16 by 256
    let one_d = |block: usize| {
        pallas_call(copy_bf16)
            .grid([256 / block])
            .input(
                ArrayType::new([256], BF16),
                BlockSpec::new([block], |[i]| (i,)),
            )
            .output(
                ArrayType::new([256], BF16),
                BlockSpec::new([block], |[i]| (i,)),
            )
            .build()
    };
    let e = one_d(128).expect_err("bf16 1-D block 128");
    assert!(
        e.message.contains(
            "the last dimension (128) must be divisible by 256 or equal the array dimension (256)"
        ),
        "{e}"
    );
    one_d(256).expect("the whole array");
    // a VMEM limit past i64::MAX does not fit libtpu's backend config
    let e = pallas_call(copy_kernel)
        .grid([1])
        .input(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(tile(), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .vmem_limit_bytes(u64::MAX)
        .build()
        .expect_err("u64::MAX VMEM limit");
    assert_eq!(e.kind, ErrorKind::Vmem, "{e}");
}

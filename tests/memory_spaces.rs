//! Memory spaces in the types, scalar prefetch and SMEM: what the kernels compute in interpret mode
//! (against plain-Rust loops), what they lower to, and every mistake as an error at its Rust line.

use tpu_kernel::prelude::*;
use tpu_kernel::{ErrorKind, KernelError};

#[path = "common/kernels.rs"]
mod kernels;
use kernels::{counter_call, counter_kernel, lengths_call, table_call, table_kernel};

#[path = "common/marks.rs"]
mod marks;

const HERE: marks::Marked = marks::Marked {
    file: "memory_spaces.rs",
    src: include_str!("memory_spaces.rs"),
};

#[track_caller]
fn expect_err(e: KernelError, kind: ErrorKind, tag: &str, needles: &[&str]) {
    HERE.check(&e, kind, tag, needles);
}

fn f32s<const R: usize>(shape: [usize; R]) -> ArrayType {
    ArrayType::new(shape, F32)
}
fn i32s<const R: usize>(shape: [usize; R]) -> ArrayType {
    ArrayType::new(shape, I32)
}

// ---------------------------------------------------------------------------------------------- prefetch

#[test]
fn index_maps_and_the_body_read_a_two_dimensional_table() {
    let call = table_call().expect("build");
    let tables = HostArray::from_vec([3, 2], vec![3, 2, 0, -1, 3, 5]).unwrap();
    let x: Vec<f32> = (0..32 * 128).map(|i| i as f32 * 0.5).collect();
    let out = call
        .interpret(&[tables, HostArray::from_vec([32, 128], x.clone()).unwrap()])
        .expect("interpret");
    let got = out[0].as_slice::<f32>().unwrap();
    let rows = [(3usize, 2.0f32), (0, -1.0), (3, 5.0)];
    for (b, (blk, s)) in rows.iter().enumerate() {
        for r in 0..8 {
            for c in 0..128 {
                let want = x[(blk * 8 + r) * 128 + c] * s;
                assert_eq!(
                    got[(b * 8 + r) * 128 + c].to_bits(),
                    want.to_bits(),
                    "{b} {r} {c}"
                );
            }
        }
    }
    // Pallas's signature: grid index, then the SMEM table, in the kernel and in every index map.
    let text = call.mosaic_mlir().expect("lower");
    assert!(text.contains("scalar_prefetch = 1 : i64"), "{text}");
    assert!(
        text.contains("@transform_1(%arg0: i32, %arg1: memref<3x2xi32, #tpu.memory_space<smem>>)"),
        "{text}"
    );
    assert_eq!(text.matches("memref.load").count(), 2, "{text}");
}

#[test]
fn a_prefetched_scalar_bounds_a_loop_and_picks_a_branch() {
    let call = lengths_call().expect("build");
    let lens = HostArray::from_vec([3], vec![2, 0, 4]).unwrap();
    let x: Vec<f32> = (0..24 * 512).map(|i| (i % 7) as f32).collect();
    let out = call
        .interpret(&[lens, HostArray::from_vec([24, 512], x.clone()).unwrap()])
        .expect("interpret");
    let got = out[0].as_slice::<f32>().unwrap();
    for (b, n) in [2usize, 0, 4].into_iter().enumerate() {
        for r in 0..8 {
            for c in 0..128 {
                let row = b * 8 + r;
                let want = if n == 0 {
                    -1.0
                } else {
                    (0..n).map(|j| x[row * 512 + j * 128 + c]).sum::<f32>()
                };
                assert_eq!(got[row * 128 + c], want, "block {b} row {r} col {c}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------- SMEM scratch

#[test]
fn smem_scratch_holds_scalars_across_grid_steps() {
    let call = counter_call().expect("build");
    let x = HostArray::from_vec([32, 128], vec![0.5f32; 32 * 128]).unwrap();
    let out = call.interpret(&[x]).expect("interpret");
    let got = out[0].as_slice::<f32>().unwrap();
    for (r, row) in got.chunks(128).enumerate() {
        assert!(
            row.iter().all(|&v| v == 0.5 + (r / 8 + 1) as f32),
            "row {r}: {:?}",
            &row[..4]
        );
    }
    let text = call.mosaic_mlir().expect("lower");
    assert!(
        text.contains("memref<1xi32, #tpu.memory_space<smem>>"),
        "{text}"
    );
    assert!(text.contains("memref.store"), "{text}");
    assert!(text.contains("scratch_operands = 1 : i64"), "{text}");
}

// ---------------------------------------------------------------------------------------------- mistakes

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

#[test]
fn an_any_input_received_as_a_vmem_ref_names_the_type_to_declare() {
    let e = pallas_call(copy_kernel)
        .input_any(f32s([8, 128])) // E:any_param
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::Signature,
        "any_param",
        &["`Ref<f32>`", "input 0", "declare it `Ref<f32, Any>`"],
    );
}

#[tpu_kernel]
fn partial_smem_kernel(t: Ref<i32, Smem>, o: RefMut<i32>) {
    let v = t.at(0).load(); // E:partial_smem
    o.store(v);
}

#[test]
fn an_smem_read_must_index_every_dimension() {
    let e = pallas_call(partial_smem_kernel)
        .scalar_prefetch(i32s([2, 4]))
        .output(i32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::Unsupported,
        "partial_smem",
        &["index every dimension", "[2, 4]"],
    );
}

#[tpu_kernel]
fn vmem_scalar_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.at((0, 0)).load(); // E:vmem_scalar
    o.store(v);
}

#[test]
fn a_single_element_load_from_vmem_points_to_smem() {
    let e = pallas_call(vmem_scalar_kernel)
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::Unsupported,
        "vmem_scalar",
        &[
            "single element from a VMEM ref",
            ".scalar_prefetch(..)",
            "Smem::new",
        ],
    );
}

#[test]
fn an_index_map_taking_more_tables_than_the_call_prefetches() {
    let e = pallas_call(table_kernel)
        .grid([3])
        .scalar_prefetch(i32s([3, 2]))
        .input(
            f32s([32, 128]),
            BlockSpec::with_prefetch([8, 128], |[b], [t, _u]| (t.at((b, 0)).load(), 0)), // E:two_tables
        )
        .output(f32s([24, 128]), BlockSpec::new([8, 128], |[b]| (b, 0)))
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::Grid,
        "two_tables",
        &["takes 2 scalar-prefetch refs", "has 1"],
    );
}

#[test]
fn smem_holds_32_bit_scalars_only() {
    let e = pallas_call(counter_kernel)
        .grid([4])
        .input(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(f32s([32, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .scratch(Smem::new([1], BF16)) // E:bf16_smem
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::DType,
        "bf16_smem",
        &["32-bit scalars", "bf16"],
    );
}

#[test]
fn a_block_number_out_of_range_in_the_table_is_an_error_when_the_kernel_runs() {
    let call = table_call().expect("build");
    let tables = HostArray::from_vec([3, 2], vec![0, 1, 4, 1, 0, 1]).unwrap();
    let x = HostArray::from_vec([32, 128], vec![0f32; 32 * 128]).unwrap();
    let e = call.interpret(&[tables, x]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfBounds, "{e}");
    assert!(
        e.message.contains("grid point [1]")
            && e.message.contains("block [4, 0]")
            && e.message.contains("scalar-prefetch"),
        "{e}"
    );
    // ... and an element outside the table is one too.
    let call = pallas_call(table_kernel)
        .grid([3])
        .scalar_prefetch(i32s([2, 2]))
        .input(
            f32s([32, 128]),
            BlockSpec::with_prefetch([8, 128], |[b], [t]| (t.at((b, 0)).load(), 0)),
        )
        .output(f32s([24, 128]), BlockSpec::new([8, 128], |[b]| (b, 0)))
        .build()
        .expect("build");
    let tables = HostArray::from_vec([2, 2], vec![0, 1, 1, 1]).unwrap();
    let x = HostArray::from_vec([32, 128], vec![0f32; 32 * 128]).unwrap();
    let e = call.interpret(&[tables, x]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfBounds, "{e}");
    assert!(e.message.contains("element [2, 0]"), "{e}");
}

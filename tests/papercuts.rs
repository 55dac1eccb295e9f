//! Issue 21's papercuts, each as a new user met it: integer literals next to traced `i32` scalars (in
//! index maps and bodies) need no suffix; a failed `build()` leaves nothing behind on its thread.

use tpu_kernel::prelude::*;

/// `(i * hb - 1).max(0)`: `Scalar<i32>` takes `usize` (`hb`) and `i32` operands, and the literal `1`
/// still infers (it falls back to i32) — in an index map and in a body.
#[tpu_kernel]
fn previous_block(x: Ref<f32>, o: RefMut<f32>) {
    let hb = 2usize;
    let i = program_id(0);
    let prev = (i * hb - 1).max(0);
    let next = (i + 1).min(3) * 2 - 1;
    o.store(x.load() + (prev + next).cast::<f32>());
}

#[test]
fn integer_literals_next_to_traced_scalars_need_no_suffix() {
    let hb = 2usize;
    let call = pallas_call(previous_block)
        .grid([4])
        .input(
            ArrayType::new([64, 128], F32),
            BlockSpec::new([8, 128], move |[i]| ((i * hb - 1).max(0), 0)),
        )
        .output(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
        .expect("build");
    let x = HostArray::from_vec(
        [64, 128],
        (0..64 * 128).map(|i| (i / 128) as f32).collect::<Vec<_>>(),
    )
    .unwrap();
    let out = call.interpret(&[x]).expect("interpret");
    let o = out[0].as_slice::<f32>().unwrap();
    for i in 0..4usize {
        let prev = (i as i32 * 2 - 1).max(0);
        let next = (i as i32 + 1).min(3) * 2 - 1;
        for r in 0..8 {
            // Block `prev` of x holds rows 8 * prev ..: row value = its row number.
            let want = (8 * prev + r) as f32 + (prev + next) as f32;
            assert_eq!(o[(8 * i + r as usize) * 128], want, "step {i} row {r}");
        }
    }
}

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

fn copy_call(block_row: usize) -> Result<PallasCall, tpu_kernel::KernelError> {
    pallas_call(copy_kernel)
        .grid([1])
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], move |[_]| (block_row, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
}

/// A `build()` that fails between starting and ending a trace (an index map returning a constant past
/// i32) leaves no trace running: the next `build()` on the thread works. (It used to fail every later
/// build on that thread with "a kernel trace is already running on this thread".)
#[test]
fn a_failed_build_leaves_nothing_behind_on_its_thread() {
    let e = copy_call(1 << 32).unwrap_err();
    assert!(e.message.contains("does not fit i32"), "{e}");
    copy_call(0).expect("the next build on the same thread");
    // And after a panic inside a kernel body.
    let e = pallas_call(|_x: Ref<f32>, _o: RefMut<f32>| panic!("in the body"))
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .build()
        .unwrap_err();
    assert!(e.message.contains("in the body"), "{e}");
    copy_call(0).expect("the next build after a panic");
}

/// A launch without a grid takes whole arrays, as Pallas's grid-free `pallas_call` (libtpu refuses
/// window attributes without iteration bounds): a window is refused with a hint, and the hint (a
/// one-step grid) builds; a whole-array block runs with no grid.
#[test]
fn a_grid_free_launch_takes_whole_arrays() {
    let e = pallas_call(copy_kernel)
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[]| (1, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .build()
        .unwrap_err();
    assert!(
        e.message.contains("without a grid takes whole arrays") && e.message.contains(".grid([1])"),
        "{e}"
    );
    assert_eq!(e.argument.as_deref(), Some("input 0"), "{e}");
    // The hint: a one-step grid (whose index maps then take the step's index).
    pallas_call(copy_kernel)
        .grid([1])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[_]| (1, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .build()
        .expect("the hint builds");
    let whole = pallas_call(copy_kernel)
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .build()
        .expect("whole arrays");
    let x = HostArray::from_vec([8, 128], (0..1024).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    assert_eq!(whole.interpret(std::slice::from_ref(&x)).unwrap()[0], x);
    let text = whole.mosaic_mlir().expect("lower");
    assert!(
        !text.contains("iteration_bounds") && !text.contains("window_params"),
        "{text}"
    );
    assert!(!text.contains("@transform_"), "{text}");
}

//! `input_output_aliases`: an output that reuses an input's buffer starts as that input, keeps it in
//! the blocks the kernel never writes, and is declared to XLA; mistakes are errors at the call's line.

use tpu_kernel::prelude::*;
use tpu_kernel::ErrorKind;

#[tpu_kernel]
fn triple_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() * 3.0);
}

fn ramp() -> HostArray {
    HostArray::from_vec(
        [64, 128],
        (0..64 * 128).map(|i| i as f32).collect::<Vec<_>>(),
    )
    .unwrap()
}

/// Only the even 8-row blocks are visited (grid 4, block 2i).
fn even_blocks(alias: bool) -> Result<PallasCall, KernelError> {
    let a = ArrayType::new([64, 128], F32);
    let spec = || BlockSpec::new([8, 128], |[i]| (i * 2, 0));
    let b = pallas_call(triple_kernel)
        .grid([4])
        .input(a.clone(), spec())
        .output(a, spec());
    if alias {
        b.input_output_aliases([(0, 0)]).build()
    } else {
        b.build()
    }
}

#[test]
fn an_aliased_output_keeps_the_input_where_the_kernel_does_not_write() {
    let call = even_blocks(true).expect("build");
    let x = ramp();
    let out = call.interpret(std::slice::from_ref(&x)).expect("interpret");
    let (got, xs) = (
        out[0].as_slice::<f32>().unwrap(),
        x.as_slice::<f32>().unwrap(),
    );
    for (i, (g, v)) in got.iter().zip(xs).enumerate() {
        let block = i / (8 * 128);
        let want = if block % 2 == 0 { v * 3.0 } else { *v };
        assert_eq!(g.to_bits(), want.to_bits(), "element {i} (block {block})");
    }
    // XLA is told: the StableHLO call carries the alias.
    let hlo = call.stablehlo().expect("stablehlo");
    assert!(hlo.contains("output_operand_aliases"), "{hlo}");
    assert!(hlo.contains("operand_index = 0"), "{hlo}");
}

#[test]
fn without_the_alias_the_same_grid_leaves_blocks_unwritten() {
    let e = even_blocks(false).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Grid, "{e}");
    assert!(
        e.message.contains("never writes output block [1, 0]"),
        "{e}"
    );
}

#[tpu_kernel]
fn scale_rows_kernel(x: Ref<f32>, w: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() * w.load());
}

#[test]
fn alias_mistakes_are_errors_at_the_aliases_line() {
    let a = ArrayType::new([64, 128], F32);
    let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let call = |pairs: [(usize, usize); 1]| {
        pallas_call(scale_rows_kernel)
            .grid([8])
            .input(a.clone(), spec())
            .input(
                ArrayType::new([1, 128], F32),
                BlockSpec::new([1, 128], |[_]| (0, 0)),
            )
            .output(a.clone(), spec())
            .input_output_aliases(pairs) // E:aliases
            .build()
    };
    let line = include_str!("aliasing.rs")
        .lines()
        .position(|l| l.trim_end().ends_with("// E:aliases"))
        .expect("marker") as u32
        + 1;
    assert!(call([(0, 0)]).is_ok());
    let e = call([(1, 0)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Signature, "{e}");
    assert!(
        e.message
            .contains("input 1 ([1, 128] f32) cannot alias output 0"),
        "{e}"
    );
    assert_eq!(e.location.expect("location").line, line, "{e}");
    let e = call([(2, 0)]).unwrap_err();
    assert!(
        e.message.contains("the call has 2 inputs and 1 outputs"),
        "{e}"
    );
    assert_eq!(e.location.expect("location").line, line, "{e}");
}

/// Rows 0..8 of `o` become 7 by a DMA from VMEM, then rows 0..8 of `x` are copied to rows 16..24 of
/// `o` (through VMEM) — when `patch`; else the kernel writes nothing.
#[tpu_kernel]
fn patch_rows_kernel(
    x: Ref<f32, Any>,
    o: RefMut<f32, Any>,
    buf: RefMut<f32>,
    sem: DmaSem,
    patch: bool,
) {
    if patch {
        buf.store(full([8, 128], 7.0f32));
        sync_copy(buf, o.at((0..8, ..)), sem);
        sync_copy(x.at((0..8, ..)), buf, sem);
        sync_copy(buf, o.at((16..24, ..)), sem);
    }
}

/// A rows kernel over a whole (ANY) f32 array of `shape` aliased to its output, with an `[8, 128]`
/// VMEM buffer and a DMA semaphore.
fn rows_call(
    kernel: impl tpu_kernel::launch::KernelFn<(Ref<f32, Any>, RefMut<f32, Any>, RefMut<f32>, DmaSem)>,
    shape: [usize; 2],
) -> PallasCall {
    let a = ArrayType::new(shape, F32);
    pallas_call(kernel)
        .input_any(a.clone())
        .output_any(a)
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .input_output_aliases([(0, 0)])
        .build()
        .expect("build")
}

/// `call` on raw f32 buffers of `shape`, as XLA makes it: `input` read, `out` written (one buffer
/// when they are the same pointer).
///
/// # Safety
/// Both must point at live, aligned f32 buffers of `shape`'s size that nobody else touches during the
/// call (the same one when XLA aliases the pair).
unsafe fn on_raw(
    call: &PallasCall,
    shape: &[usize],
    (input, out): (*const f32, *mut f32),
    opts: &tpu_kernel::runtime::interpret::InterpretOptions,
) -> Result<(), KernelError> {
    use tpu_kernel::runtime::interpret::{interpret_into, ArrayView, ArrayViewMut};
    // SAFETY: the caller's contract.
    let (view, mut out_view) = unsafe {
        (
            ArrayView::from_raw(shape, F32, input.cast()),
            ArrayViewMut::from_raw(shape, F32, out.cast()),
        )
    };
    interpret_into(
        call.ir(),
        &[view],
        std::slice::from_mut(&mut out_view),
        opts,
    )
}

/// A whole (ANY) output aliased to its input starts as the input's buffer and reaches the output
/// array once, after the grid (`interpret/grid.rs`'s `start_aliased_outputs`): run owned, on two
/// buffers and on one (as XLA passes a donated pair), the output is the input patched, the input
/// is read as it was before the call (rows 16..24 get the input's rows 0..8, not the 7s written
/// over them first), and a separate input buffer is left as it was.
#[test]
fn a_whole_output_aliased_to_its_input_updates_in_place_or_not() {
    use tpu_kernel::runtime::interpret::InterpretOptions;
    let shape = [32usize, 128];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let xs: Vec<f32> = (0..32 * 128).map(|i| i as f32 - 100.5).collect();
    for patch in [false, true] {
        let call = rows_call(patch_rows_kernel.bind(patch), shape);
        let mut want = xs.clone();
        if patch {
            want[..8 * 128].fill(7.0);
            want[16 * 128..24 * 128].copy_from_slice(&xs[..8 * 128]);
        }
        let x = HostArray::from_vec(shape, xs.clone()).unwrap();
        let owned = call.interpret(std::slice::from_ref(&x)).expect("owned run");
        assert_eq!(
            bits(owned[0].as_slice::<f32>().unwrap()),
            bits(&want),
            "owned, patch {patch}"
        );

        // The call on raw buffers, as XLA makes it: `input` read, `out` written (one buffer when
        // they are the same pointer).
        let opts = InterpretOptions::default();
        // SAFETY (each call): live, aligned f32 buffers of the shape that nobody else touches.
        let run = |input: *const f32, out: *mut f32| unsafe {
            on_raw(&call, &shape, (input, out), &opts)
        };
        let input = xs.clone();
        let mut out = vec![f32::NAN; xs.len()];
        run(input.as_ptr(), out.as_mut_ptr()).expect("two buffers");
        assert_eq!(bits(&out), bits(&want), "two buffers, patch {patch}");
        assert_eq!(bits(&input), bits(&xs), "the input buffer, patch {patch}");

        let mut one = xs.clone();
        let p = one.as_mut_ptr();
        run(p.cast_const(), p).expect("one buffer");
        assert_eq!(bits(&one), bits(&want), "one buffer, patch {patch}");
    }
}

/// Rows 0..8 of `o` become 7, the left half of rows 0..16 is copied onto rows 8..24 of `o` itself
/// (overlapping, one row at a time: the copy must read its source as it was), and rows 8..16 plus one
/// reach rows 24..32 through VMEM. The aliased input is never read.
#[tpu_kernel]
fn shift_rows_kernel(_x: Ref<f32, Any>, o: RefMut<f32, Any>, buf: RefMut<f32>, sem: DmaSem) {
    buf.store(full([8, 128], 7.0f32));
    sync_copy(buf, o.at((0..8, ..)), sem);
    sync_copy(o.at((0..16, 0..64)), o.at((8..24, 0..64)), sem);
    sync_copy(o.at((8..16, ..)), buf, sem);
    buf.store(buf.load() + 1.0);
    sync_copy(buf, o.at((24..32, ..)), sem);
}

/// A whole output aliased to an input the kernel never reads is updated in place in its own array
/// (`Runner::lend_sink`): owned, on two buffers and on one (XLA's donated pair), the output is the
/// input updated — an overlapping copy within it reads its source first — and a separate input
/// buffer is left as it was.
#[test]
fn a_whole_output_whose_input_is_unread_is_updated_in_its_own_array() {
    use tpu_kernel::runtime::interpret::InterpretOptions;
    let shape = [32usize, 128];
    // The first element whose bits differ, if any.
    let differ = |a: &[f32], b: &[f32]| {
        (a.len() != b.len())
            .then_some(usize::MAX)
            .or_else(|| (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()))
    };
    let xs: Vec<f32> = (0..32 * 128).map(|i| i as f32 - 100.5).collect();
    let call = rows_call(shift_rows_kernel, shape);
    let mut want = xs.clone();
    want[..8 * 128].fill(7.0);
    for r in 8..24 {
        // The left half of row r is row r - 8's as the copy began: 7 from rows 0..8, else the input.
        for c in 0..64 {
            want[r * 128 + c] = if r < 16 { 7.0 } else { xs[(r - 8) * 128 + c] };
        }
    }
    for r in 24..32 {
        for c in 0..128 {
            want[r * 128 + c] = want[(r - 16) * 128 + c] + 1.0;
        }
    }
    for seed in [None, Some(3)] {
        let opts = InterpretOptions {
            dma_seed: seed,
            ..InterpretOptions::default()
        };
        let x = HostArray::from_vec(shape, xs.clone()).unwrap();
        let owned = call
            .interpret_with(std::slice::from_ref(&x), &opts)
            .expect("owned run");
        assert_eq!(
            differ(owned[0].as_slice::<f32>().unwrap(), &want),
            None,
            "owned"
        );
        assert_eq!(differ(x.as_slice::<f32>().unwrap(), &xs), None, "the input");
        // SAFETY (each call): live, aligned f32 buffers of the shape that nobody else touches.
        let run = |input: *const f32, out: *mut f32| unsafe {
            on_raw(&call, &shape, (input, out), &opts)
        };
        let input = xs.clone();
        let mut out = vec![f32::NAN; xs.len()];
        run(input.as_ptr(), out.as_mut_ptr()).expect("two buffers");
        assert_eq!(differ(&out, &want), None, "two buffers, seed {seed:?}");
        assert_eq!(differ(&input, &xs), None, "the input buffer, seed {seed:?}");
        let mut one = xs.clone();
        let p = one.as_mut_ptr();
        run(p.cast_const(), p).expect("one buffer");
        assert_eq!(differ(&one, &want), None, "one buffer, seed {seed:?}");
    }
}

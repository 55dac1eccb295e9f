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

//! The kernel language, construct by construct: what each one traces to (kernel IR) and that the result
//! lowers to verified Mosaic. Compile-time values must fold away; traced ones must become ops.

#[path = "common/kernels.rs"]
mod kernels;

use kernels::*;
use tpu_kernel::ir::{Func, OpKind};
use tpu_kernel::prelude::*;

fn count(f: &Func, pred: impl Fn(&OpKind) -> bool) -> usize {
    let mut n = 0;
    f.walk(&mut |op| n += pred(&op.kind) as usize);
    n
}

fn one_block(kernel_build: impl FnOnce() -> Result<PallasCall, KernelError>) -> PallasCall {
    let call = kernel_build().unwrap_or_else(|e| panic!("build failed: {e}"));
    call.mosaic_mlir()
        .unwrap_or_else(|e| panic!("lowering failed: {e}"));
    call
}

fn f32_8x128() -> ArrayType {
    ArrayType::new([8, 128], F32)
}

#[tpu_kernel]
fn const_generic_kernel<const SCALE: usize, const BIAS: bool>(x: Ref<f32>, o: RefMut<f32>) {
    let mut v = x.load() * (SCALE as f32);
    if BIAS {
        v += 1.0;
    }
    o.store(v);
}

#[test]
fn const_generics_and_rust_conditions_fold_at_trace_time() {
    let build = |bias: bool| {
        let spec = || BlockSpec::new([8, 128], |[_]| (0, 0));
        let b = pallas_call(const_generic_kernel::<3, true>);
        let b2 = pallas_call(const_generic_kernel::<3, false>);
        if bias {
            b.grid([1])
                .input(f32_8x128(), spec())
                .output(f32_8x128(), spec())
                .build()
        } else {
            b2.grid([1])
                .input(f32_8x128(), spec())
                .output(f32_8x128(), spec())
                .build()
        }
    };
    let with = one_block(|| build(true));
    let without = one_block(|| build(false));
    let body = |c: &PallasCall| c.ir().body.clone();
    // No scf.if: the condition was a Rust bool.
    assert_eq!(count(&body(&with), |k| matches!(k, OpKind::If)), 0);
    let adds = |c: &PallasCall| {
        count(&body(c), |k| {
            matches!(k, OpKind::Binary(tpu_kernel::ir::BinaryOp::Add))
        })
    };
    assert_eq!((adds(&with), adds(&without)), (1, 0));
    assert_eq!(with.name(), "const_generic_kernel");
}

#[kernel_fn]
fn softplus(x: Array<f32>) -> Array<f32> {
    (x.exp() + 1.0).log()
}

#[tpu_kernel]
fn helper_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(softplus(softplus(x.load())));
}

#[test]
fn kernel_fn_helpers_are_traced_inline() {
    let spec = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let call = one_block(|| {
        pallas_call(helper_kernel)
            .grid([1])
            .input(f32_8x128(), spec())
            .output(f32_8x128(), spec())
            .build()
    });
    let exps = count(&call.ir().body, |k| {
        matches!(k, OpKind::Unary(tpu_kernel::ir::UnaryOp::Exp))
    });
    assert_eq!(exps, 2);
    // The helper's ops carry the helper's source line, not the call site.
    let src = include_str!("dsl.rs");
    let helper_line = src
        .lines()
        .position(|l| l.contains("(x.exp() + 1.0).log()"))
        .unwrap() as u32
        + 1;
    let mut located = false;
    call.ir().body.walk(&mut |op| {
        located |= matches!(op.kind, OpKind::Unary(_)) && op.loc.line == helper_line
    });
    assert!(
        located,
        "exp/log should be located at tests/dsl.rs:{helper_line}"
    );
}

#[test]
fn traced_control_flow_becomes_scf() {
    let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let arr = ArrayType::new([24, 128], F32);
    let call = one_block(|| {
        pallas_call(control_flow_kernel)
            .grid([3])
            .input(arr.clone(), spec())
            .output(arr.clone(), spec())
            .build()
    });
    let body = &call.ir().body;
    assert_eq!(
        count(body, |k| matches!(k, OpKind::If)),
        2,
        "else-if chain = two nested scf.if"
    );
    assert_eq!(count(body, |k| matches!(k, OpKind::For)), 1);
    assert_eq!(count(body, |k| matches!(k, OpKind::While)), 1);
    // The for loop carries (acc, steps); the while carries (acc, n) — results = carried values.
    body.walk(&mut |op| match op.kind {
        OpKind::For | OpKind::While => assert_eq!(op.results.len(), 2, "{:?}", op.kind),
        OpKind::If => assert_eq!(op.results.len(), 1),
        _ => {}
    });
    let mlir = call.mosaic_mlir().unwrap();
    assert!(mlir.contains("scf.for") && mlir.contains("scf.while") && mlir.contains("scf.if"));
}

#[test]
fn squeezed_block_dimensions() {
    let call = one_block(|| {
        pallas_call(squeezed_kernel)
            .grid([4])
            .input(
                ArrayType::new([4, 8, 128], F32),
                BlockSpec::new([1, 8, 128], |[i]| (i, 0, 0)).squeeze(0),
            )
            .output(
                ArrayType::new([32, 128], F32),
                BlockSpec::new([8, 128], |[i]| (i, 0)),
            )
            .build()
    });
    let mlir = call.mosaic_mlir().unwrap();
    assert!(
        mlir.contains("%arg1: memref<8x128xf32, #tpu.memory_space<vmem>>"),
        "{mlir}"
    );
    assert!(
        mlir.contains("window_bounds = array<i64: 1, 8, 128>"),
        "{mlir}"
    );
}

#[test]
fn static_windows_swap_halves() {
    let spec = || BlockSpec::new([16, 128], |[_]| (0, 0));
    let arr = ArrayType::new([16, 128], F32);
    let call = one_block(|| {
        pallas_call(window_kernel)
            .grid([1])
            .input(arr.clone(), spec())
            .output(arr.clone(), spec())
            .build()
    });
    let mut windows = Vec::new();
    call.ir().body.walk(&mut |op| {
        if let OpKind::Load(w) | OpKind::Store { window: w, .. } = &op.kind {
            windows.push((w.starts.clone(), w.sizes.clone()));
        }
    });
    use tpu_kernel::ir::Start::Static;
    assert_eq!(
        windows,
        vec![
            (vec![Static(0), Static(0)], vec![8, 128]),
            (vec![Static(8), Static(0)], vec![8, 128]),
            (vec![Static(0), Static(0)], vec![8, 128]),
            (vec![Static(8), Static(0)], vec![8, 128]),
        ]
    );
}

#[test]
fn casts_integer_ops_and_select() {
    let spec = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let call = one_block(|| {
        pallas_call(mixed_dtype_kernel)
            .grid([1])
            .input(ArrayType::new([8, 128], BF16), spec())
            .input(ArrayType::new([8, 128], I32), spec())
            .output(ArrayType::new([8, 128], F32), spec())
            .output(ArrayType::new([8, 128], I32), spec())
            .build()
    });
    let mlir = call.mosaic_mlir().unwrap();
    for op in [
        "arith.extf",
        "arith.sitofp",
        "arith.remsi",
        "arith.divsi",
        "arith.maxsi",
        "math.absi",
        "arith.select",
        "math.tanh",
    ] {
        assert!(mlir.contains(op), "missing {op}");
    }
}

#[test]
fn ir_printer_shows_ops_with_locations() {
    let spec = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let call = one_block(|| {
        pallas_call(helper_kernel)
            .grid([1])
            .input(f32_8x128(), spec())
            .output(f32_8x128(), spec())
            .build()
    });
    let text = call.ir().to_string();
    assert!(text.starts_with("kernel helper_kernel grid=[1]"), "{text}");
    assert!(
        text.contains("exp %") && text.contains("// tests/dsl.rs:"),
        "{text}"
    );
}

#[tpu_kernel]
fn bool_scalar_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let on = scalar(true) & (program_id(0) == 0);
    let off = scalar(false) | (program_id(0) > 0);
    let v = if on | off { x.load() * 2.0 } else { x.load() };
    o.store(v);
}

#[test]
fn bool_scalar_constants_lower() {
    let call = pallas_call(bool_scalar_kernel)
        .grid([2])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
        .expect("build");
    let text = call
        .mosaic_mlir()
        .expect("a bool scalar constant lowers and verifies");
    assert!(
        text.contains("arith.constant true") && text.contains("arith.constant false"),
        "{text}"
    );
    let x = HostArray::from_vec([16, 128], vec![1.5f32; 16 * 128]).unwrap();
    let out = call.interpret(&[x]).expect("interpret");
    assert!(out[0].as_slice::<f32>().unwrap().iter().all(|&v| v == 3.0));
}

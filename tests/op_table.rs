//! The elementwise op table (`kernel-ops`) and its consumers' columns: every row lowers for every dtype
//! it accepts (the lowering's column, `lower/rules/elementwise.rs`), and the ops added through the table
//! compute what
//! jax computes — in the interpreter here; through libtpu for v5e/v6e in the Python suite (the
//! `activations` example); as Mosaic, by `tests/bytecode.rs`'s coverage of every table row.

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::runtime::ir::{Accepts, BinaryOp, Operands, UnaryOp};
use tpu_kernel::runtime::lower::{
    mosaic_binary, mosaic_unary_float, mosaic_unary_int, IntLowering,
};

#[test]
fn every_row_lowers_for_every_dtype_it_accepts() {
    use tpu_kernel::DType::*;
    for u in UnaryOp::ALL {
        assert!(!u.name().is_empty());
        if u.operands().accepts(F32) {
            assert!(
                mosaic_unary_float(*u).is_some(),
                "{u:?} takes floats but has no float lowering"
            );
        }
        if u.operands().accepts(I32) {
            assert!(
                mosaic_unary_int(*u) != IntLowering::None,
                "{u:?} takes integers but has no integer lowering"
            );
        }
    }
    for b in BinaryOp::ALL {
        for d in [F32, BF16, I32, U32, I8, U8, BOOL] {
            if b.operands().accepts(d) {
                assert!(
                    mosaic_binary(*b, d).is_some(),
                    "{b:?} takes {d} but has no lowering for it"
                );
            }
        }
    }
    assert!(
        Operands::Int.accepts(U32) && !Operands::Int.accepts(BOOL) && !Operands::Float.accepts(I32)
    );
}

// ------------------------------------------------------------------------ the new ops, computed

macro_rules! f32_kernels {
    ($($name:ident => |$x:ident| $e:expr;)*) => {$(
        #[tpu_kernel]
        fn $name(x: Ref<f32>, o: RefMut<f32>) {
            let $x = x.load();
            o.store($e);
        }
    )*};
}
f32_kernels! {
    erf_k => |x| x.erf();
    log1p_k => |x| x.log1p();
    expm1_k => |x| x.expm1();
    logistic_k => |x| x.logistic();
    floor_k => |x| x.floor();
    ceil_k => |x| x.ceil();
    round_k => |x| x.round();
    sign_k => |x| x.sign();
    clamp_k => |x| x.clamp(-1.0, 1.0);
    isnan_k => |x| x.isnan().cast::<f32>();
}

/// `kernel` on `xs` (padded to a [8, 128] block) in the interpreter.
fn run_f32(kernel: fn(Ref<f32>, RefMut<f32>), xs: &[f32]) -> Vec<f32> {
    let mut v = xs.to_vec();
    v.resize(1024, 0.0);
    let x = HostArray::from_vec([8, 128], v).expect("input");
    let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let call = pallas_call(kernel)
        .grid([1])
        .input(ArrayType::new([8, 128], F32), spec())
        .output(ArrayType::new([8, 128], F32), spec())
        .build()
        .expect("builds");
    let out = call.interpret(&[x]).expect("runs");
    out[0].as_slice::<f32>().expect("f32")[..xs.len()].to_vec()
}

/// Sample points: a sweep over [-6, 6], tiny and huge magnitudes, halves, and the specials.
fn points() -> Vec<f32> {
    let mut v: Vec<f32> = (0..700).map(|i| -6.0 + 12.0 * i as f32 / 699.0).collect();
    v.extend([
        1e-7, -1e-7, 1e-4, -3e-5, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, -0.0, 88.0, -100.0, 1e30,
    ]);
    v.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
    ]);
    v
}

/// `got` within `ulps` units in the last place of the f64 reference (rounded to f32); NaN where it is.
fn assert_close(op: &str, xs: &[f32], got: &[f32], want: impl Fn(f64) -> f64, ulps: f32) {
    for (x, g) in xs.iter().zip(got) {
        let w = want(f64::from(*x)) as f32;
        if w.is_nan() || g.is_nan() {
            assert!(w.is_nan() && g.is_nan(), "{op}({x:e}) = {g:e}, want {w:e}");
            continue;
        }
        if w.abs() < f32::MIN_POSITIVE {
            // Subnormal results may flush to zero (the TPU has no subnormals; nor does our exp's range).
            assert!(
                g.abs() < f32::MIN_POSITIVE,
                "{op}({x:e}) = {g:e}, want {w:e}"
            );
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g.to_bits(), w.to_bits(), "{op}({x:e}) = {g:e}, want {w:e}");
            continue;
        }
        let ulp = f32::from_bits(w.abs().to_bits() + 1) - w.abs();
        assert!(
            (g - w).abs() <= ulps * ulp,
            "{op}({x:e}) = {g:e}, want {w:e} (±{ulps} ulp)"
        );
    }
}

/// Bit-exact ops: every bit of the result, the sign of zero and NaN included.
fn assert_bits(op: &str, xs: &[f32], got: &[f32], want: impl Fn(f32) -> f32) {
    for (x, g) in xs.iter().zip(got) {
        let w = want(*x);
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{op}({x:e}) = {g:e} ({:#x}), want {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
fn transcendental_table_ops_are_accurate() {
    let xs = points();
    assert_close("erf", &xs, &run_f32(erf_k, &xs), libm::erf, 2.0);
    let pos: Vec<f32> = xs.iter().map(|x| x.abs()).collect();
    assert_close("log1p", &pos, &run_f32(log1p_k, &pos), f64::ln_1p, 2.0);
    assert_close(
        "logistic",
        &xs,
        &run_f32(logistic_k, &xs),
        |x| 1.0 / (1.0 + (-x).exp()),
        4.0,
    );
    // expm1 composes exp and log (Kahan): a few ulps, and exact near 0 where e^x - 1 would cancel.
    assert_close("expm1", &xs, &run_f32(expm1_k, &xs), f64::exp_m1, 8.0);
}

#[test]
fn rounding_sign_clamp_and_isnan_are_exact() {
    let xs = points();
    assert_bits("floor", &xs, &run_f32(floor_k, &xs), f32::floor);
    assert_bits("ceil", &xs, &run_f32(ceil_k, &xs), f32::ceil);
    // Half to even, like jnp.round: 0.5 → 0, 1.5 → 2, 2.5 → 2, -0.5 → -0.
    assert_bits("round", &xs, &run_f32(round_k, &xs), f32::round_ties_even);
    let sign = |x: f32| {
        if x > 0.0 {
            1.0
        } else if x < 0.0 {
            -1.0
        } else {
            x
        }
    };
    assert_bits("sign", &xs, &run_f32(sign_k, &xs), sign);
    assert_bits("clamp", &xs, &run_f32(clamp_k, &xs), |x| {
        if x.is_nan() {
            x
        } else {
            x.clamp(-1.0, 1.0)
        }
    });
    assert_bits("isnan", &xs, &run_f32(isnan_k, &xs), |x| {
        if x.is_nan() {
            1.0
        } else {
            0.0
        }
    });
}

#[tpu_kernel]
fn shifts_i32(x: Ref<i32>, n: Ref<i32>, l: RefMut<i32>, r: RefMut<i32>) {
    l.store(x.load() << n.load());
    r.store(x.load() >> n.load());
}

#[tpu_kernel]
fn shifts_u32(x: Ref<u32>, n: Ref<u32>, l: RefMut<u32>, r: RefMut<u32>) {
    l.store(x.load() << n.load());
    r.store(x.load() >> n.load());
}

fn run_shifts<
    T: tpu_kernel::dtype::Element + tpu_kernel::runtime::interpret::HostElement + Copy + Default,
>(
    kernel: fn(Ref<T>, Ref<T>, RefMut<T>, RefMut<T>),
    d: tpu_kernel::DType,
    xs: &[T],
    ns: &[T],
) -> (Vec<T>, Vec<T>) {
    let pad = |v: &[T]| {
        let mut v = v.to_vec();
        v.resize(1024, T::default());
        HostArray::from_vec([8, 128], v).expect("input")
    };
    let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let call = pallas_call(kernel)
        .grid([1])
        .input(ArrayType::new([8, 128], d), spec())
        .input(ArrayType::new([8, 128], d), spec())
        .output(ArrayType::new([8, 128], d), spec())
        .output(ArrayType::new([8, 128], d), spec())
        .build()
        .expect("builds");
    let out = call.interpret(&[pad(xs), pad(ns)]).expect("runs");
    let take = |a: &HostArray| a.as_slice::<T>().expect("dtype")[..xs.len()].to_vec();
    (take(&out[0]), take(&out[1]))
}

#[test]
fn shifts_follow_xla_at_and_past_the_bit_width() {
    // XLA: shift_left by >= bits is 0; shift_right_arithmetic by >= bits is the sign fill;
    // shift_right_logical by >= bits is 0. Negative amounts count as >= bits.
    let (xs, ns): (Vec<i32>, Vec<i32>) = [
        (-8, 0),
        (-8, 1),
        (-8, 31),
        (-8, 32),
        (-8, 40),
        (-8, -1),
        (5, 3),
        (5, 32),
        (i32::MIN, 31),
    ]
    .into_iter()
    .unzip();
    let (l, r) = run_shifts(shifts_i32, I32, &xs, &ns);
    assert_eq!(l, [-8, -16, 0, 0, 0, 0, 40, 0, 0]);
    assert_eq!(r, [-8, -4, -1, -1, -1, -1, 0, 0, -1]);
    let (xs, ns): (Vec<u32>, Vec<u32>) = [
        (0xF000_0000, 4),
        (0xF000_0000, 31),
        (0xF000_0000, 32),
        (7, 33),
        (1, 0),
    ]
    .into_iter()
    .unzip();
    let (l, r) = run_shifts(shifts_u32, U32, &xs, &ns);
    assert_eq!(l, [0, 0, 0, 0, 1]);
    assert_eq!(r, [0x0F00_0000, 1, 0, 0, 1]);
}

// ------------------------------------------------------------------------ composites

/// `expm1` written out by hand as its recipe gives it (Kahan's formulation), on a bf16 array.
#[tpu_kernel]
fn expm1_by_hand(x: Ref<bf16>, o: RefMut<bf16>) {
    let x = x.load();
    let u = x.exp();
    let um1 = u - 1.0;
    let general = um1 * (x / u.log());
    let inf = bf16::INFINITY;
    let (is_one, is_neg, is_inf) = (u == 1.0, um1 == -1.0, u == inf);
    let at_inf = select(is_inf, u, general);
    let at_neg = select(is_neg, -1.0, at_inf);
    o.store(select(is_one, x, at_neg));
}

#[tpu_kernel]
fn expm1_composite(x: Ref<bf16>, o: RefMut<bf16>) {
    o.store(x.load().expm1());
}

/// `sign` written out by hand, between other ops (so the values after it are renumbered too).
#[tpu_kernel]
fn sign_by_hand(x: Ref<i32>, o: RefMut<i32>) {
    let x = x.load() * 3;
    let (pos, neg) = (x > 0, x < 0);
    let s = select(pos, 1, select(neg, -1, x));
    o.store(s + x);
}

#[tpu_kernel]
fn sign_composite(x: Ref<i32>, o: RefMut<i32>) {
    let x = x.load() * 3;
    o.store(x.sign() + x);
}

/// The kernel body's ops (kind, operands, results; not their Rust lines: the kernels sit on different
/// lines) and value types.
fn ir_without_lines<A>(
    kernel: impl tpu_kernel::runtime::launch::KernelFn<A>,
    dtype: DType,
) -> String {
    let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let call = pallas_call(kernel)
        .name("k")
        .grid([1])
        .input(ArrayType::new([8, 128], dtype), spec())
        .output(ArrayType::new([8, 128], dtype), spec())
        .build()
        .expect("builds");
    let f = &call.ir().body;
    let mut ops = Vec::new();
    f.walk(&mut |op| {
        ops.push(format!(
            "{:?} {:?} -> {:?}",
            op.kind, op.operands, op.results
        ))
    });
    assert!(ops.len() > 8, "{ops:?}");
    format!("{}\n{:?}", ops.join("\n"), f.values)
}

/// A composite op is traced as one op and expanded by `build()` for the launch's target into exactly
/// the ops (and value numbering) of its composition written by hand — so it lowers, runs and counts
/// bundles as the hand-written kernel does.
#[test]
fn composites_expand_to_their_hand_written_composition() {
    assert_eq!(
        ir_without_lines(expm1_composite, BF16),
        ir_without_lines(expm1_by_hand, BF16)
    );
    assert_eq!(
        ir_without_lines(sign_composite, I32),
        ir_without_lines(sign_by_hand, I32)
    );
    for c in tpu_kernel::runtime::ir::CompositeOp::ALL {
        assert!(!c.name().is_empty());
    }
}

//! The vectorized transcendentals end to end: every op of the table that has vector loops, alone and
//! inside fused chains, in f32 and bf16, gives the same bits fused and unfused (the fused path runs
//! whole chunks through the vector loops, the unfused one whole rows; both fall back to the padded
//! tail), and stays within its ulp bound of f64 through the interpreter.

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;

#[tpu_kernel]
fn unary_ops(x: Ref<f32>, a: RefMut<f32>, b: RefMut<f32>, c: RefMut<f32>, d: RefMut<f32>) {
    let x = x.load();
    a.store(x.tanh());
    b.store(x.sin() + x.cos());
    c.store((x.abs() + 1.0).log() * x.log1p());
    d.store(x.erf() - x.logistic() + x.exp().rsqrt());
}

#[tpu_kernel]
fn chained_ops(x: Ref<f32>, y: Ref<f32>, a: RefMut<f32>, b: RefMut<bf16>, c: RefMut<f32>) {
    let x = x.load();
    let y = y.load();
    // A chain through several vector ops and a broadcast operand, an f32 → bf16 chain, and pow with
    // an array, a scalar and a reversed operand, and rem.
    a.store(((x * 0.5 - 1.0).tanh() * 3.0).sin().erf());
    b.store((x.cast::<bf16>() * 2.0).logistic().cos());
    c.store(pow(x.abs(), y) + pow(x, 3.0) + pow(y.abs(), x * 0.1) + x.abs().log() + (x * 3.0) % y);
}

#[tpu_kernel]
fn leading_ops(
    x: Ref<f32>,
    y: Ref<f32>,
    a: RefMut<f32>,
    b: RefMut<f32>,
    c: RefMut<f32>,
    d: RefMut<f32>,
) {
    let x = x.load();
    let y = y.load();
    // Chains that open with a vector function, after `v op scalar` or not: the fused path runs both
    // in one pass over the input.
    a.store((x * 0.1).tanh() * 30.0);
    b.store((x / 3.0).erf() + y);
    c.store((x - 0.5).logistic() * y);
    d.store((x + 2.0).log1p() - x.sin() * y);
}

/// Inputs: a spread of magnitudes with the specials mixed in, rows of an odd length.
fn inputs(rows: usize, n: usize, seed: u64) -> HostArray {
    let mut v = HostArray::random([rows, n], F32, seed)
        .unwrap()
        .into_vec::<f32>()
        .expect("f32");
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE / 8.0,
        -1.0,
        1.0,
        1e30,
        -3e5,
        f32::MAX,
    ];
    for (i, x) in v.iter_mut().enumerate() {
        *x *= [1.0, 4.0, 40.0, 1e3, 1e-3][i % 5];
        if i % 37 == 5 {
            *x = specials[(i / 37) % specials.len()];
        }
    }
    HostArray::from_vec([rows, n], v).expect("shape")
}

fn bits(outs: &[HostArray]) -> Vec<Vec<u64>> {
    outs.iter()
        .map(|a| a.to_f64_vec().iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn run(call: &tpu_kernel::PallasCall, ins: &[HostArray], fuse: bool) -> Vec<HostArray> {
    let opts = InterpretOptions {
        fuse,
        ..InterpretOptions::default()
    };
    call.interpret_with(ins, &opts).expect("runs")
}

#[test]
fn vector_ops_give_the_same_bits_fused_and_unfused() {
    // 203 columns: 12 whole 16-lane vectors, an 8-lane one and a padded tail of 3.
    for n in [203usize, 128, 5] {
        let spec = || BlockSpec::new([8, n], |[i]| (i, 0));
        let f = || ArrayType::new([16, n], F32);
        let unary = pallas_call(unary_ops)
            .grid([2])
            .input(f(), spec())
            .output(f(), spec())
            .output(f(), spec())
            .output(f(), spec())
            .output(f(), spec())
            .build()
            .expect("builds");
        let x = inputs(16, n, 3);
        let ins = [x.clone()];
        assert_eq!(
            bits(&run(&unary, &ins, true)),
            bits(&run(&unary, &ins, false)),
            "unary, {n} columns"
        );
        let chained = pallas_call(chained_ops)
            .grid([2])
            .input(f(), spec())
            .input(f(), spec())
            .output(f(), spec())
            .output(ArrayType::new([16, n], BF16), spec())
            .output(f(), spec())
            .build()
            .expect("builds");
        let ins = [x, inputs(16, n, 9)];
        assert_eq!(
            bits(&run(&chained, &ins, true)),
            bits(&run(&chained, &ins, false)),
            "chained, {n} columns"
        );
        let leading = pallas_call(leading_ops)
            .grid([2])
            .input(f(), spec())
            .input(f(), spec())
            .output(f(), spec())
            .output(f(), spec())
            .output(f(), spec())
            .output(f(), spec())
            .build()
            .expect("builds");
        assert_eq!(
            bits(&run(&leading, &ins, true)),
            bits(&run(&leading, &ins, false)),
            "leading, {n} columns"
        );
    }
}

#[tpu_kernel]
fn one_op(x: Ref<f32>, t: RefMut<f32>, s: RefMut<f32>, l: RefMut<f32>, p: RefMut<f32>) {
    let x = x.load();
    t.store(x.tanh());
    s.store(x.sin());
    l.store(x.log());
    p.store(pow(x, 1.5));
}

/// `|got - want|` in units of the f32 spacing at `want`.
fn ulps(got: f32, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if (want as f32).is_infinite() || got.is_infinite() {
        return if want as f32 == got {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let e = want.abs().max(f64::from(f32::MIN_POSITIVE)).log2().floor();
    (f64::from(got) - want).abs() / (e - 23.0).exp2()
}

#[test]
fn interpreted_transcendentals_are_within_their_bounds() {
    let n = 1000;
    let spec = || BlockSpec::new([8, n], |[i]| (i, 0));
    let f = || ArrayType::new([8, n], F32);
    let call = pallas_call(one_op)
        .grid([1])
        .input(f(), spec())
        .output(f(), spec())
        .output(f(), spec())
        .output(f(), spec())
        .output(f(), spec())
        .build()
        .expect("builds");
    let x = inputs(8, n, 5);
    let xs = x.as_slice::<f32>().expect("f32").to_vec();
    let out = run(&call, &[x], true);
    type Check = (&'static str, fn(f64) -> f64, f64);
    let checks: [Check; 4] = [
        ("tanh", f64::tanh, 2.0),
        ("sin", f64::sin, 1.6),
        ("log", f64::ln, 1.0),
        ("pow", |x| x.powf(1.5), 1.0),
    ];
    for ((name, want, bound), got) in checks.iter().zip(&out) {
        for (x, g) in xs.iter().zip(got.as_slice::<f32>().expect("f32")) {
            let e = ulps(*g, want(f64::from(*x)));
            assert!(e <= *bound, "{name}({x:e}) = {g:e}: {e} ulp");
        }
    }
}

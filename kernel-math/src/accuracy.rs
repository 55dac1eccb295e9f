//! The vectorized transcendentals: every lane width gives the scalar reference's bits (a dense sweep of
//! f32 bit patterns plus the edges), the reference is within its documented ulps of f64, and the
//! specials are jnp's. `cargo test --release -p tpu-kernel-math -- --ignored exhaustive` measures the
//! ulp bounds over all 2^32 inputs.

use super::elementfn::{
    drive, Cos, Erf, Kernel1, Kernel2, Log, Log1p, Logistic, Pow, Rem, Rsqrt, Sin, Tanh,
};
use super::lanes::Lanes;

/// Every 997th f32 bit pattern (all signs, exponents, subnormals, NaNs) and the edges of every range.
fn sweep() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..u32::MAX / 997)
        .map(|i| f32::from_bits(i * 997))
        .collect();
    let edges = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
        0.625,
        -0.625,
        3.9375,
        9.02,
        10.0,
        88.72,
        -87.34,
        -103.9,
        super::trig::FAST_MAX,
        -super::trig::FAST_MAX,
        f32::from_bits(super::trig::FAST_MAX.to_bits() + 1),
        std::f32::consts::FRAC_PI_4,
        std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        -0.999_999_94,
        -1.000_000_1,
        1e-30,
        -1e-30,
    ];
    xs.extend(edges);
    // A stretch of consecutive values around 1 (log1p, log), and near multiples of π/2.
    xs.extend((0..4096).map(|i| f32::from_bits(1.0f32.to_bits() - 2048 + i)));
    xs.extend((0..4096).map(|i| f32::from_bits(std::f32::consts::PI.to_bits() - 2048 + i)));
    xs
}

/// `K` over `xs` with one lane, eight and sixteen; panics naming the first input whose bits differ.
fn assert_widths_agree<K: Kernel1>(name: &str, xs: &[f32]) {
    let want: Vec<f32> = xs.iter().map(|&x| K::apply(x)).collect();
    // Odd lengths, so the padded tail of each loop is covered too.
    for (width, run) in [
        (8, drive::unary8::<K> as fn(&mut [f32]) -> bool),
        (16, drive::unary16::<K>),
    ] {
        let mut v = xs.to_vec();
        v.push(0.5);
        if !run(&mut v) {
            eprintln!("{name}: this CPU has no {width}-lane loops; not compared");
            continue;
        }
        for ((x, got), w) in xs.iter().zip(&v).zip(&want) {
            assert_eq!(
                got.to_bits(),
                w.to_bits(),
                "{name}({x:e} = {:#x}) with {width} lanes: {got:e} vs {w:e}",
                x.to_bits()
            );
        }
    }
}

#[test]
fn vector_transcendentals_are_bit_identical_to_their_scalar_reference() {
    let xs = sweep();
    assert_widths_agree::<Tanh>("tanh", &xs);
    assert_widths_agree::<Logistic>("logistic", &xs);
    assert_widths_agree::<Log>("log", &xs);
    assert_widths_agree::<Log1p>("log1p", &xs);
    assert_widths_agree::<Erf>("erf", &xs);
    assert_widths_agree::<Sin>("sin", &xs);
    assert_widths_agree::<Cos>("cos", &xs);
    assert_widths_agree::<Rsqrt>("rsqrt", &xs);
    assert_widths_agree::<ExpGeneric>("exp (generic)", &xs);
}

/// The generic `exp` the others build on, as a kernel.
#[derive(Clone, Copy)]
struct ExpGeneric;
impl Kernel1 for ExpGeneric {
    fn apply<V: Lanes>(x: V) -> V {
        super::approx::exp(x)
    }
}

#[test]
fn generic_exp_and_rsqrt_keep_their_former_bits() {
    // With every f32 in [-110, -100]: across `ZERO_BELOW`, where lanes are zeroed before the product.
    let dense = (100f32.to_bits()..=110f32.to_bits()).map(|b| -f32::from_bits(b));
    for x in sweep().into_iter().chain(dense) {
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits();
        assert!(same(super::approx::exp(x), super::exp_f32(x)), "exp({x:e})");
        let rsqrt = (1.0 / (x as f64).sqrt()) as f32;
        assert!(same(Rsqrt::apply(x), rsqrt) || x.is_nan(), "rsqrt({x:e})");
    }
}

/// `|got - want|` in units of the f32 spacing at `want` (2^-149 below the normal range); 0 when both
/// are NaN or the same infinity, infinite when only one is.
pub(super) fn ulps(got: f32, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let w32 = want as f32;
    if w32.is_infinite() || got.is_infinite() {
        // Beyond f32's range: right if it rounds to the same infinity.
        return if w32 == got { 0.0 } else { f64::INFINITY };
    }
    let e = (want.abs().max(f64::from(f32::MIN_POSITIVE)))
        .log2()
        .floor();
    let spacing = (e - 23.0).exp2();
    (f64::from(got) - want).abs() / spacing
}

/// The worst error of `f` against `want` over `xs` (and the input where it is).
fn worst(xs: &[f32], f: impl Fn(f32) -> f32, want: impl Fn(f64) -> f64) -> (f64, f32) {
    let mut w = (0.0, 0.0);
    for &x in xs {
        let e = ulps(f(x), want(f64::from(x)));
        if e > w.0 {
            w = (e, x);
        }
    }
    w
}

/// Each unary function, its f64 reference and its documented bound in ulps.
type Case = (&'static str, fn(f32) -> f32, fn(f64) -> f64, f64);
fn cases() -> [Case; 7] {
    [
        ("tanh", Tanh::apply::<f32>, f64::tanh, 2.0),
        ("log", Log::apply::<f32>, f64::ln, 0.9),
        ("log1p", Log1p::apply::<f32>, f64::ln_1p, 1.0),
        ("erf", Erf::apply::<f32>, libm::erf, 1.1),
        ("sin", Sin::apply::<f32>, f64::sin, 1.6),
        ("cos", Cos::apply::<f32>, f64::cos, 1.6),
        (
            "logistic",
            Logistic::apply::<f32>,
            |x| 1.0 / (1.0 + (-x).exp()),
            4.0,
        ),
    ]
}

/// The documented bounds (see each function's doc), checked over the sweep.
#[test]
fn transcendentals_are_within_their_documented_ulps() {
    let xs = sweep();
    for (name, f, want, bound) in cases() {
        let (e, x) = worst(&xs, f, want);
        eprintln!("{name}: worst {e:.3} ulp at {x:e}");
        assert!(e <= bound, "{name}: {e} ulp at {x:e} ({:#x})", x.to_bits());
    }
}

/// x, y pairs for pow: a sweep of bases against integers, halves, small and large exponents, specials.
fn pow_pairs() -> (Vec<f32>, Vec<f32>) {
    let ys = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        2.0,
        -2.0,
        3.0,
        -3.0,
        0.5,
        -0.5,
        1.5,
        2.5,
        1e-7,
        -1e-7,
        7.25,
        31.0,
        -40.5,
        127.0,
        150.0,
        -150.0,
        3e5,
        16_777_215.0,
        16_777_216.0,
        -16_777_217.0,
        1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.333_333_34,
        11.0,
    ];
    let xs: Vec<f32> = (0..u32::MAX / 99_991)
        .map(|i| f32::from_bits(i * 99_991))
        .chain([
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.0,
            -2.0,
            0.5,
            -0.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MAX,
            0.999_999_94,
            1.000_000_1,
        ])
        .collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &y in &ys {
        a.extend(&xs);
        b.extend(std::iter::repeat_n(y, xs.len()));
    }
    // And random-ish exponents.
    for (i, &x) in xs.iter().enumerate() {
        a.push(x);
        b.push(f32::from_bits(
            (i as u32).wrapping_mul(2_654_435_761) & 0xC1FF_FFFF,
        ));
    }
    (a, b)
}

#[test]
fn pow_is_bit_identical_across_widths_within_one_ulp_and_follows_c99() {
    let (xs, ys) = pow_pairs();
    let want: Vec<f32> = xs
        .iter()
        .zip(&ys)
        .map(|(&x, &y)| Pow::apply(x, y))
        .collect();
    for (width, run) in [
        (8, drive::binary8::<Pow> as fn(&mut [f32], &[f32]) -> bool),
        (16, drive::binary16::<Pow>),
    ] {
        let mut v = xs.clone();
        if !run(&mut v, &ys) {
            continue;
        }
        for (i, (g, w)) in v.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "pow({:e}, {:e}), {width} lanes",
                xs[i],
                ys[i]
            );
        }
    }
    let mut worst: (f64, f32, f32) = (0.0, 0.0, 0.0);
    for ((&x, &y), &got) in xs.iter().zip(&ys).zip(&want) {
        // C99 powf (glibc, correctly rounded in practice) for the special cases, bit for bit up to
        // the NaN payload; f64 for the rest.
        let libm = x.powf(y);
        let special = !x.is_finite() || !y.is_finite() || x == 0.0 || y == 0.0 || x == 1.0;
        if special || libm.is_nan() || got.is_nan() {
            assert!(
                got.to_bits() == libm.to_bits() || (got.is_nan() && libm.is_nan()),
                "pow({x:e}, {y:e}) = {got:e}, powf says {libm:e}"
            );
            continue;
        }
        let e = ulps(got, f64::from(x).powf(f64::from(y)));
        if e > worst.0 {
            worst = (e, x, y);
        }
    }
    eprintln!(
        "pow: worst {:.3} ulp at ({:e}, {:e})",
        worst.0, worst.1, worst.2
    );
    assert!(worst.0 <= 1.0, "pow: {worst:?}");
}

#[test]
fn rem_is_exact_and_bit_identical_across_widths() {
    let (mut xs, mut ys) = pow_pairs();
    // Quotients past 2^29 (the one-lane path), and the other way round.
    let (a, b) = (xs.clone(), ys.clone());
    xs.extend(&b);
    ys.extend(&a);
    xs.extend([1e30, -7.5, 3.0e38, 0.0, -0.0, 5.0, 5.0, f32::MIN_POSITIVE]);
    ys.extend([
        3.0,
        2.0,
        1e-30,
        1.0,
        1.0,
        -0.0,
        f32::INFINITY,
        f32::from_bits(3),
    ]);
    let want: Vec<f32> = xs
        .iter()
        .zip(&ys)
        .map(|(&x, &y)| Rem::apply(x, y))
        .collect();
    for ((&x, &y), &w) in xs.iter().zip(&ys).zip(&want) {
        let fmod = x % y;
        assert!(
            w.to_bits() == fmod.to_bits() || (w.is_nan() && fmod.is_nan()),
            "rem({x:e}, {y:e}) = {w:e}, fmod says {fmod:e}"
        );
    }
    for (width, run) in [
        (8, drive::binary8::<Rem> as fn(&mut [f32], &[f32]) -> bool),
        (16, drive::binary16::<Rem>),
    ] {
        let mut v = xs.clone();
        if !run(&mut v, &ys) {
            continue;
        }
        for (i, (g, w)) in v.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "rem({:e}, {:e}), {width} lanes",
                xs[i],
                ys[i]
            );
        }
    }
}

#[test]
fn specials_follow_jnp() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let bits = |a: f32| a.to_bits();
    for (name, f) in [
        ("tanh", Tanh::apply::<f32> as fn(f32) -> f32),
        ("erf", Erf::apply::<f32>),
        ("sin", Sin::apply::<f32>),
        ("log1p", Log1p::apply::<f32>),
    ] {
        // Odd functions keep the sign of zero, and are the identity on subnormals.
        assert_eq!(bits(f(0.0)), bits(0.0), "{name}(0)");
        assert_eq!(bits(f(-0.0)), bits(-0.0), "{name}(-0)");
        let tiny = f32::from_bits(3);
        if name != "erf" {
            assert_eq!(f(tiny), tiny, "{name}(subnormal)");
            assert_eq!(f(-tiny), -tiny, "{name}(-subnormal)");
        }
        // A NaN comes back quieted, its sign and payload kept (`x + x`), signaling ones included.
        for n in [
            nan,
            -nan,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFFA0_0F00),
        ] {
            assert_eq!(bits(f(n)), bits(n + n), "{name}({:#x})", n.to_bits());
        }
    }
    assert_eq!((Tanh::apply(inf), Tanh::apply(-inf)), (1.0, -1.0));
    assert_eq!((Erf::apply(inf), Erf::apply(-inf)), (1.0, -1.0));
    assert_eq!((Erf::apply(4.0), Erf::apply(-100.0)), (1.0, -1.0));
    assert_eq!((Tanh::apply(9.5), Tanh::apply(30.0)), (1.0, 1.0));
    assert_eq!(Log::apply(0.0), -inf);
    assert_eq!(Log::apply(-0.0), -inf);
    assert_eq!(Log::apply(inf), inf);
    assert_eq!(Log::apply(1.0), 0.0);
    assert!(Log::apply(-1.0).is_nan() && Log::apply(-inf).is_nan());
    assert_eq!(Log::apply(f32::from_bits(1)), -103.278_93);
    assert_eq!(Log1p::apply(-1.0), -inf);
    assert_eq!(Log1p::apply(inf), inf);
    assert!(Log1p::apply(-2.0).is_nan() && Log1p::apply(-inf).is_nan());
    for f in [Sin::apply::<f32> as fn(f32) -> f32, Cos::apply::<f32>] {
        assert!(f(inf).is_nan() && f(-inf).is_nan() && f(nan).is_nan());
    }
    assert_eq!(Cos::apply(0.0), 1.0);
    assert_eq!(Cos::apply(-0.0), 1.0);
    assert_eq!(
        (
            Logistic::apply(0.0),
            Logistic::apply(inf),
            Logistic::apply(-inf)
        ),
        (0.5, 1.0, 0.0)
    );
    assert_eq!(
        (Rsqrt::apply(0.0), Rsqrt::apply(-0.0), Rsqrt::apply(inf)),
        (inf, -inf, 0.0)
    );
    assert!(Rsqrt::apply(-1.0).is_nan());
    // Huge arguments are reduced exactly: sin and cos of f32::MAX and friends against f64.
    for x in [f32::MAX, 1e38, 3.0e30, 1e20, 12_345_679.0, 131_073.0, 2.5e6] {
        for (f, w) in [
            (
                Sin::apply::<f32> as fn(f32) -> f32,
                f64::sin as fn(f64) -> f64,
            ),
            (Cos::apply, f64::cos),
        ] {
            assert!(ulps(f(x), w(f64::from(x))) <= 1.0, "at {x:e}");
            assert!(ulps(f(-x), w(f64::from(-x))) <= 1.0, "at {:e}", -x);
        }
    }
}

/// All 2^32 inputs of each unary function against f64: the bounds documented on the functions.
#[test]
#[ignore = "minutes in release mode: cargo test --release -p tpu-kernel-math -- --ignored exhaustive"]
fn exhaustive_ulp_bounds() {
    use rayon::prelude::*;
    // `EXHAUSTIVE_OPS=tanh,erf` limits the run to those functions.
    let only = std::env::var("EXHAUSTIVE_OPS").ok();
    for (name, f, want, _) in cases() {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|n| n == name))
        {
            continue;
        }
        let (e, x) = (0..1u64 << 16)
            .into_par_iter()
            .map(|hi| {
                let xs: Vec<f32> = (0..1u32 << 16)
                    .map(|lo| f32::from_bits((hi as u32) << 16 | lo))
                    .collect();
                worst(&xs, f, want)
            })
            .reduce(|| (0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
        println!("{name}: worst {e:.4} ulp at {x:e} ({:#x})", x.to_bits());
    }
}

/// All 2^32 inputs of rsqrt against the former `(1/sqrt(x as f64)) as f32`.
#[test]
#[ignore = "a minute in release mode"]
fn exhaustive_rsqrt_vs_f64() {
    use rayon::prelude::*;
    let diffs: Vec<u32> = (0..1u32 << 16)
        .into_par_iter()
        .flat_map_iter(|hi| {
            (0..1u32 << 16).filter_map(move |lo| {
                let x = f32::from_bits(hi << 16 | lo);
                let (a, b) = (Rsqrt::apply(x), (1.0 / (x as f64).sqrt()) as f32);
                (a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())).then_some(x.to_bits())
            })
        })
        .collect();
    println!(
        "rsqrt differs from the f64 formula at {} inputs: {:x?}",
        diffs.len(),
        &diffs[..diffs.len().min(20)]
    );
    for d in diffs.iter().take(5) {
        let x = f32::from_bits(*d);
        println!(
            "{x:e}: new {:e} old {:e} exact {:e}",
            Rsqrt::apply(x),
            (1.0 / (x as f64).sqrt()) as f32,
            1.0 / (x as f64).sqrt()
        );
    }
}

/// Every loop on short rows of every length, each row in a buffer of exactly its length: the vector
/// body, the padded tail and the splat operand stay inside their rows (what `scripts/memcheck.sh` runs
/// under valgrind, where any read or write past a row is an error), with the scalar reference's bits.
#[test]
fn vector_loops_stay_inside_short_rows_of_every_length() {
    fn unary<K: Kernel1>(name: &str) {
        for n in 0..=40 {
            let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 3.1).collect();
            let want: Vec<u32> = xs.iter().map(|&x| K::apply(x).to_bits()).collect();
            let mut got = xs.clone();
            if drive::unary8::<K>(&mut got) {
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{name}, {n} elements, 8 lanes");
            }
            let mut got = xs.clone();
            if drive::unary16::<K>(&mut got) {
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{name}, {n} elements, 16 lanes");
            }
            // The dispatching entry, out of place: `src` and `dst` each exactly `n` long.
            let mut dst = vec![0f32; n];
            // SAFETY: both hold `n` elements and are disjoint.
            unsafe {
                drive::unary::<K>(super::elementfn::Pre::Id, xs.as_ptr(), dst.as_mut_ptr(), n)
            };
            let got: Vec<u32> = dst.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{name}, {n} elements, dispatched");
        }
    }
    fn binary<K: Kernel2>(name: &str) {
        for n in 0..=40 {
            let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 + 0.1).collect();
            let ys: Vec<f32> = (0..n).map(|i| 2.5 - i as f32 * 0.11).collect();
            let want: Vec<u32> = xs
                .iter()
                .zip(&ys)
                .map(|(&x, &y)| K::apply(x, y).to_bits())
                .collect();
            let mut got = xs.clone();
            if drive::binary8::<K>(&mut got, &ys) {
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{name}, {n} elements, 8 lanes");
            }
            let mut got = xs.clone();
            if drive::binary16::<K>(&mut got, &ys) {
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{name}, {n} elements, 16 lanes");
            }
            // A splat second operand, through the dispatching entry.
            let want: Vec<u32> = xs.iter().map(|&x| K::apply(x, 1.5).to_bits()).collect();
            let mut dst = vec![0f32; n];
            // SAFETY: `xs` and `dst` hold `n` elements and are disjoint.
            unsafe {
                drive::binary::<K>(
                    drive::Arg::Ptr(xs.as_ptr()),
                    drive::Arg::Splat(1.5),
                    dst.as_mut_ptr(),
                    n,
                )
            };
            let got: Vec<u32> = dst.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{name}, {n} elements, splat");
        }
    }
    unary::<Tanh>("tanh");
    unary::<Logistic>("logistic");
    unary::<Log>("log");
    unary::<Log1p>("log1p");
    unary::<Erf>("erf");
    unary::<Sin>("sin");
    unary::<Cos>("cos");
    unary::<Rsqrt>("rsqrt");
    unary::<ExpGeneric>("exp (generic)");
    binary::<Pow>("pow");
    binary::<Rem>("rem");
}

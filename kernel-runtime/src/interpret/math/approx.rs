//! exp, logistic, tanh, log, log1p and erf, each written once over [`Lanes`]: the f32 instantiation is
//! the op's scalar reference, the 8- and 16-lane ones give the same bits. Range reductions are exact,
//! polynomials are evaluated with fused multiply-adds, and NaN, ±0, ±inf and subnormals are handled by
//! selects, so no lane ever takes a different path than the scalar reference would.
//!
//! The polynomial coefficients were fitted here: discrete weighted minimax (an LP on a 3000-point
//! Chebyshev grid, `minimax.py`) against mpmath values, on the reduced ranges stated per function, then
//! rounded to f32. The accuracies quoted are the worst errors over every f32 input against f64, in
//! units of the f32 spacing at the exact value (`accuracy.rs`: a dense sweep in every test run, all
//! 2^32 inputs with `cargo test --release -p kernel-runtime -- --ignored exhaustive`).

use super::exp_consts;
use super::lanes::{IntLanes, Lanes};

/// `c[0]·x^(n-1) + … + c[n-1]` by Horner's rule with fused multiply-adds.
#[inline(always)]
pub(crate) fn horner<V: Lanes>(x: V, c: &[f32]) -> V {
    let mut p = x.splat(c[0]);
    for k in &c[1..] {
        p = p.fma(x, x.splat(*k));
    }
    p
}

/// `x` with the sign bit of `s` (`x` non-negative).
#[inline(always)]
fn with_sign_of<V: Lanes>(x: V, s: V) -> V {
    let sign = s.bits().and(s.splat_int(i32::MIN));
    V::from_bits(x.bits().or(sign))
}

/// [`super::exp_f32`] for every lane width, op for op: the same clamp, reduction, polynomial, scaling
/// (one factor when `2^n` is a normal f32 in every lane, which gives the same bits as two) and NaN rule.
#[inline(always)]
pub(crate) fn exp<V: Lanes>(x: V) -> V {
    use exp_consts::*;
    let c = |k: f32| x.splat(k);
    let xc = c(HI).min(c(LO).max(x));
    let t = xc.fma(c(LOG2E), c(ROUND));
    let n = t - c(ROUND);
    let ni = t.bits().sub(x.splat_int(ROUND_BITS));
    let r = n.fma(c(-LN2_HI), xc);
    let r = n.fma(c(-LN2_LO), r);
    let y = horner(r, &POLY).fma(r * r, r) + c(1.0);
    let bias = x.splat_int(127);
    let y = if V::any(n.lt(c(-126.0)) | c(127.0).lt(n)) {
        let n1 = ni.sra::<1>();
        let n2 = ni.sub(n1);
        let s1 = V::from_bits(n1.add(bias).shl::<23>());
        let s2 = V::from_bits(n2.add(bias).shl::<23>());
        y * s1 * s2
    } else {
        y * V::from_bits(ni.add(bias).shl::<23>())
    };
    V::select(x.is_nan(), x + x, y)
}

/// `e^x` for `x` in `[-87, 0]` (so `2^n` is a normal f32): [`exp`] without the clamp, the
/// two-factor scaling and the NaN rule, for the reductions below that bound their argument.
#[inline(always)]
fn exp_bounded<V: Lanes>(x: V) -> V {
    use exp_consts::*;
    let c = |k: f32| x.splat(k);
    let t = x.fma(c(LOG2E), c(ROUND));
    let n = t - c(ROUND);
    let ni = t.bits().sub(x.splat_int(ROUND_BITS));
    let r = n.fma(c(-LN2_HI), x);
    let r = n.fma(c(-LN2_LO), r);
    let y = horner(r, &POLY).fma(r * r, r) + c(1.0);
    y * V::from_bits(ni.add(x.splat_int(127)).shl::<23>())
}

/// `1 / (1 + e^-x)` (`tpu.logistic`), ≤ 3 ulp: with `e = e^-|x|` (never overflows), `1/(1 + e)` for
/// `x ≥ 0` and `e/(1 + e)` below, so tiny results keep their (subnormal) value.
#[inline(always)]
pub(crate) fn logistic<V: Lanes>(x: V) -> V {
    let one = x.splat(1.0);
    let e = exp(-x.abs());
    let r = one / (one + e);
    let r = V::select(x.lt(x.splat(0.0)), e * r, r);
    V::select(x.is_nan(), x + x, r)
}

/// tanh(x) on [0, 0.625] is `x + x·z·P(z)`, `z = x²` (fit error 0.07 ulp).
const TANH_P: [f32; 5] = [
    -5.704_987e-3,
    2.063_908_8e-2,
    -5.373_971_5e-2,
    1.333_144_2e-1,
    -3.333_328e-1,
];

/// `tanh(x)`, ≤ 1.5 ulp: `|x| + |x|·z·P(z)` below 0.625, else `1 - 2e/(1 + e)` with `e = e^(-2|x|)`
/// (|x| clamped to 10, where tanh has rounded to 1 since 9.02), the sign copied from `x`.
#[inline(always)]
pub(crate) fn tanh<V: Lanes>(x: V) -> V {
    let c = |k: f32| x.splat(k);
    let ax = x.abs();
    let small = ax.lt(c(0.625));
    let zero = c(0.0);
    let poly = if V::any(small) {
        let z = ax * ax;
        (ax * z).fma(horner(z, &TANH_P), ax)
    } else {
        zero
    };
    let quot = if V::any(!small) {
        let e = exp_bounded(c(-2.0) * c(10.0).min(ax));
        c(1.0) - (e + e) / (c(1.0) + e)
    } else {
        zero
    };
    let r = with_sign_of(V::select(small, poly, quot), x);
    V::select(x.is_nan(), x + x, r)
}

/// `ln(1 + f) = f - f²/2 + f³·P(f)` for `1 + f` in `[√½, √2)` (fit error 0.1 ulp).
const LOG_P: [f32; 8] = [
    -7.634_499e-2,
    1.276_157_8e-1,
    -1.316_018_3e-1,
    1.420_175_7e-1,
    -1.662_335_7e-1,
    2.000_122_7e-1,
    -2.500_082e-1,
    3.333_333e-1,
];
/// ln 2 in two parts; `k·LN2_HI` is exact for every exponent `k` of an f32.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// The bits of f32 √½: `x / 2^k` is brought into `[√½, √2)`.
const SQRT_HALF_BITS: i32 = 0x3F35_04F3;

/// `u = 2^k · (1 + f)` with `1 + f` in `[√½, √2)`: `(k, f)`, both exact (`u` positive and normal).
#[inline(always)]
fn log_reduce<V: Lanes>(u: V) -> (V, V) {
    let ix = u.bits().sub(u.splat_int(SQRT_HALF_BITS));
    let k = ix.sra::<23>();
    let m = ix
        .and(u.splat_int(0x007F_FFFF))
        .add(u.splat_int(SQRT_HALF_BITS));
    (V::from_int(k), V::from_bits(m) - u.splat(1.0))
}

/// `k·ln 2 + ln(1 + f) + lo`, with `lo` a small correction added before the leading terms.
#[inline(always)]
fn log_finish<V: Lanes>(k: V, f: V, lo: V) -> V {
    let z = f * f;
    let tail = (f * z).fma(horner(f, &LOG_P), f.splat(-0.5) * z) + lo;
    k.fma(f.splat(LN2_HI), f + k.fma(f.splat(LN2_LO), tail))
}

/// `ln x`, ≤ 0.9 ulp: subnormals scaled by 2^23 first; `ln 0 = -inf`, `ln(x < 0) = NaN`, `ln inf = inf`.
#[inline(always)]
pub(crate) fn log<V: Lanes>(x: V) -> V {
    let c = |k: f32| x.splat(k);
    let tiny = x.lt(c(f32::MIN_POSITIVE));
    let (k, f) = log_reduce(V::select(tiny, x * c(8_388_608.0), x));
    let k = k - V::select(tiny, c(23.0), c(0.0));
    let r = log_finish(k, f, c(0.0));
    let r = V::select(x.eq(c(f32::INFINITY)), x, r);
    let r = V::select(x.eq(c(0.0)), c(f32::NEG_INFINITY), r);
    let r = V::select(x.lt(c(0.0)), c(f32::NAN), r);
    V::select(x.is_nan(), x + x, r)
}

/// `ln(1 + x)`, ≤ 1 ulp: `u = 1 + x` and its exact rounding error `err` (two-sum), then `ln u` as
/// in [`log`] plus `err / u`. `log1p(±0) = ±0`, `log1p(-1) = -inf`, below -1 NaN.
#[inline(always)]
pub(crate) fn log1p<V: Lanes>(x: V) -> V {
    let c = |k: f32| x.splat(k);
    let one = c(1.0);
    let u = one + x;
    let b = u - one;
    let err = (one - (u - b)) + (x - b);
    let (k, f) = log_reduce(u);
    let r = log_finish(k, f, err / u);
    let r = V::select(x.eq(c(f32::INFINITY)), x, r);
    let r = V::select(x.eq(c(0.0)), x, r);
    let r = V::select(x.eq(c(-1.0)), c(f32::NEG_INFINITY), r);
    let r = V::select(x.lt(c(-1.0)), c(f32::NAN), r);
    V::select(x.is_nan(), x + x, r)
}

/// erf(x) on [0, 1] is `x + x·Q(x²)` (fit error 0.02 ulp; `Q(0) = 2/√π - 1`, so its rounding errors
/// weigh 8× less than a leading 1.128's would).
const ERF_Q: [f32; 7] = [
    7.853_861_5e-5,
    -8.010_193_7e-4,
    5.188_327_7e-3,
    -2.685_381_3e-2,
    1.128_358_54e-1,
    -3.761_262_6e-1,
    1.283_791_7e-1,
];
/// ln(erfc(x)) on [1, 3.9375] as a polynomial in `t = x - 1` (fit error 0.0004 ulp of erf; its f32
/// evaluation 0.35 ulp).
const ERFC_LOG: [f32; 8] = [
    -2.168_674_7e-5,
    2.895_278_7e-4,
    -2.011_966_2e-3,
    1.004_645_2e-2,
    -4.156_348e-2,
    -8.431_071e-1,
    -2.638_967_5,
    -1.849_605_6,
];
/// erf rounds to 1 from 3.92 on.
const ERF_ONE: f32 = 3.9375;

/// `erf(x)`, ≤ 1.1 ulp: `|x| + |x|·Q(x²)` below 1, else `1 - e^L(|x| - 1)` with `L` ≈ ln erfc; the sign
/// copied from `x`.
#[inline(always)]
pub(crate) fn erf<V: Lanes>(x: V) -> V {
    let c = |k: f32| x.splat(k);
    let ax = x.abs();
    let small = ax.lt(c(1.0));
    let zero = c(0.0);
    let poly = if V::any(small) {
        ax.fma(horner(ax * ax, &ERF_Q), ax)
    } else {
        zero
    };
    let tail = if V::any(!small) {
        let t = c(ERF_ONE).min(ax) - c(1.0);
        c(1.0) - exp_bounded(horner(t, &ERFC_LOG))
    } else {
        zero
    };
    let r = with_sign_of(V::select(small, poly, tail), x);
    V::select(x.is_nan(), x + x, r)
}

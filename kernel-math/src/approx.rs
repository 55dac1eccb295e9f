//! exp, logistic, tanh, log, log1p and erf, each written once over [`Lanes`]: the f32 instantiation is
//! the op's scalar reference, the 8- and 16-lane ones give the same bits. Range reductions are exact,
//! polynomials are evaluated with fused multiply-adds, and NaN, ±0, ±inf and subnormals are handled by
//! selects, so no lane ever takes a different path than the scalar reference would.
//!
//! The polynomial coefficients were fitted here: discrete weighted minimax (an LP on a 3000-point
//! Chebyshev grid, `minimax.py`) against mpmath values, on the reduced ranges stated per function, then
//! rounded to f32. The accuracies quoted are the worst errors over every f32 input against f64, in
//! units of the f32 spacing at the exact value (`accuracy.rs`: a dense sweep in every test run, all
//! 2^32 inputs with `cargo test --release -p tpu-kernel-math -- --ignored exhaustive`).

use super::lanes::{IntLanes, Lanes};
use crate::exp::exp_consts;

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

/// [`crate::exp_f32`] for every lane width, op for op: the same clamp, reduction, polynomial, scaling
/// (one factor when `2^n` is a normal f32 in every lane, which gives the same bits as two) and NaN rule.
/// The tests hold it to `exp_f32`, which vouches for [`exp_core`] under logistic (the op `exp` itself
/// runs `exp_run`, with the fused softmax forms).
#[cfg(test)]
#[inline(always)]
pub(crate) fn exp<V: Lanes>(x: V) -> V {
    V::select(x.is_nan(), x + x, exp_core::<V, false>(x))
}

/// [`exp`] without its NaN rule; for `NONPOSITIVE` arguments (`x ≤ 0` or NaN) also without the upper
/// clamp and overflow check, which cannot matter there (the same bits for every such `x`).
#[inline(always)]
fn exp_core<V: Lanes, const NONPOSITIVE: bool>(x: V) -> V {
    use exp_consts::*;
    let c = |k: f32| x.splat(k);
    let xc = if NONPOSITIVE {
        c(LO).max(x)
    } else {
        c(HI).min(c(LO).max(x))
    };
    let t = xc.fma(c(LOG2E), c(ROUND));
    let n = t - c(ROUND);
    let ni = t.bits().sub(x.splat_int(ROUND_BITS));
    let r = n.fma(c(-LN2_HI), xc);
    let r = n.fma(c(-LN2_LO), r);
    let y = horner(r, &POLY).fma(r * r, r) + c(1.0);
    let bias = x.splat_int(127);
    let outside = if NONPOSITIVE {
        n.lt(c(-126.0))
    } else {
        n.lt(c(-126.0)) | c(127.0).lt(n)
    };
    if V::any(outside) {
        let n1 = ni.sra::<1>();
        let n2 = ni.sub(n1);
        let s1 = V::from_bits(n1.add(bias).shl::<23>());
        let s2 = V::from_bits(n2.add(bias).shl::<23>());
        // As in `exp_run`: lanes whose product is certainly +0 are zeroed before it (an underflowing
        // multiply costs Intel a microcode assist).
        let y = V::select(n.lt(c(ZERO_BELOW as f32)), c(0.0), y);
        y * s1 * s2
    } else {
        y * V::from_bits(ni.add(bias).shl::<23>())
    }
}

/// `1 / (1 + e^-x)` (`tpu.logistic`), ≤ 3 ulp: with `e = e^-|x|` (never overflows), `1/(1 + e)` for
/// `x ≥ 0` and `e/(1 + e)` below, so tiny results keep their (subnormal) value.
#[inline(always)]
pub(crate) fn logistic<V: Lanes>(x: V) -> V {
    let one = x.splat(1.0);
    let e = exp_core::<V, true>(-x.abs());
    let r = one / (one + e);
    let r = V::select(x.lt(x.splat(0.0)), e * r, r);
    V::select(x.is_nan(), x + x, r)
}

/// `e^r - 1 = r + r²/2 + r³·P(r)` for `|r| ≤ ln2/2` (fit error 0.007 ulp).
const EXPM1_P: [f32; 5] = [
    1.982_411_9e-4,
    1.393_327e-3,
    8.333_419e-3,
    4.166_648e-2,
    1.666_666_6e-1,
];

/// `tanh(x) = u / (u + 2)`, ≤ 2 ulp, with `u = e^(2|x|) - 1` (|x| clamped to 10, where tanh has
/// rounded to 1 since 9.02): `2|x| = n·ln2 + r`, `u = 2^n·expm1(r) + (2^n - 1)` in one rounding,
/// exact at `n = 0` so small arguments keep their relative accuracy; the sign copied from `x`.
#[inline(always)]
pub(crate) fn tanh<V: Lanes>(x: V) -> V {
    use exp_consts::{LN2_HI, LN2_LO, LOG2E, ROUND, ROUND_BITS};
    let c = |k: f32| x.splat(k);
    let y = c(10.0).min(x.abs());
    let y = y + y;
    let t = y.fma(c(LOG2E), c(ROUND));
    let n = t - c(ROUND);
    let ni = t.bits().sub(x.splat_int(ROUND_BITS));
    let r = n.fma(c(-LN2_HI), y);
    let r = n.fma(c(-LN2_LO), r);
    let p = (r * r).fma(r.fma(horner(r, &EXPM1_P), c(0.5)), r);
    let s = V::from_bits(ni.add(x.splat_int(127)).shl::<23>());
    let u = s.fma(p, s - c(1.0));
    // u / (u + 2), with the rounding error `e` of `v = u + 2` (fast two-sum) put back: to first
    // order the quotient loses `q·e/v`, and `1/v = (1 - q)/2`.
    let two = c(2.0);
    let v = u + two;
    let e = (u.max(two) - v) + u.min(two);
    let q = u / v;
    let q = (q * q.fma(c(-0.5), c(0.5))).fma(-e, q);
    let r = with_sign_of(q, x);
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

/// erf on [0, 4) in 8 intervals of 0.5, interval `i` = `[i/2, (i+1)/2)`: with `t = |x| - ERF_CENTER[i]`,
/// `erf = ERF_BASE[i] + t·(ERF_SLOPE[i] + q_i(t))`, `q_i` of degree 6 (`ERF_Q[k][i]`: the coefficient
/// of `t^(6-k)`). Interval 0 is `t + t·q_0(t)` around 0 (relative accuracy down to the subnormals),
/// the others a polynomial around the midpoint. Fit error 0.14 ulp (`minimax.py`, `erf_table`).
const ERF_CENTER: [f32; 8] = [0.0, 0.75, 1.25, 1.75, 2.25, 2.75, 3.25, 3.75];
const ERF_SLOPE: [f32; 8] = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
const ERF_BASE: [f32; 8] = [
    0.0,
    0.711_155_65,
    0.922_900_14,
    0.986_671_7,
    0.998_537_3,
    0.999_899_4,
    0.999_995_7,
    0.999_999_9,
];
const ERF_Q: [[f32; 8]; 7] = [
    [
        -0.017_976_964,
        0.017_754_301,
        0.003_804_845,
        -0.005_920_939,
        -7.273_687e-4,
        6.347_013_4e-4,
        1.739_933_4e-4,
        1.724_248_6e-5,
    ],
    [
        -0.008_006_055,
        -0.026_585_653,
        0.020_597_277,
        0.009_049_175,
        -0.002_779_593_5,
        -0.001_667_821_9,
        -2.737_57e-4,
        -2.069_223_2e-5,
    ],
    [
        0.115_878_41,
        -0.053_202_79,
        -0.047_193_084,
        0.006_617_151,
        0.010_660_699,
        0.002_756_412_1,
        3.135_854_5e-4,
        1.831_936_4e-5,
    ],
    [
        -5.649_169e-4,
        0.150_675_9,
        -0.006_131_991_7,
        -0.048_105_493,
        -0.019_088_253,
        -0.003_257_713,
        -2.861_695_5e-4,
        -1.378_542_7e-5,
    ],
    [
        -0.376_077_38,
        0.026_787_907,
        0.167_536_1,
        0.090_157_43,
        0.021_724_492,
        0.002_760_376_5,
        1.958_139_9e-4,
        7.970_662e-6,
    ],
    [
        -1.580_990_6e-6,
        -0.482_198_18,
        -0.295_651_73,
        -0.092_356_205,
        -0.016_070_157,
        -0.001_612_267_3,
        -9.486_933e-5,
        -3.306_070_5e-6,
    ],
    [
        0.128_379_18,
        0.642_931_1,
        0.236_521_12,
        0.052_774_996,
        0.007_142_319_3,
        5.862_773_4e-4,
        2.918_900_1e-5,
        8.814_262e-7,
    ],
];
/// Arguments are clamped here: erf has rounded to 1 since 3.92, and the last polynomial gives 1 at
/// 3.99 (checked by the tests, `erf(inf) = 1`).
const ERF_CLAMP: f32 = 3.99;

/// `erf(x)`, ≤ 1.1 ulp: a piecewise polynomial of `|x|` (16 table lookups, no branch), the sign
/// copied from `x`. A NaN needs no select: it flows from `|x|` through every operation as the only
/// NaN (one payload, so no operand order can change it) and gets its sign back, i.e. `x + x`.
#[inline(always)]
pub(crate) fn erf<V: Lanes>(x: V) -> V {
    let c = |k: f32| x.splat(k);
    let ax = c(ERF_CLAMP).min(x.abs());
    let i = (ax * c(2.0)).trunc_int();
    let t = ax - x.lookup8(i, &ERF_CENTER);
    let mut q = x.lookup8(i, &ERF_Q[0]);
    for row in &ERF_Q[1..] {
        q = q.fma(t, x.lookup8(i, row));
    }
    let base = x.lookup8(i, &ERF_SLOPE).fma(t, x.lookup8(i, &ERF_BASE));
    with_sign_of(t.fma(q, base), x)
}

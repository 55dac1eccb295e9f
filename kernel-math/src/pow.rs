//! pow, rsqrt and rem, written once over [`Lanes`] and computed in f64 lanes ([`Lanes64`]): every
//! f32 is exact in f64, and the f64 arithmetic keeps the error far below half an f32 ulp, so the one
//! rounding back to f32 makes pow ≤ 1 ulp (correctly rounded but for results within ~1e-11 relative
//! of a rounding boundary), overflow, underflow and subnormal results included; rem is exact.

use super::lanes::{IntLanes, Lanes, Lanes64, WideFn};

/// `ln m = 2s + s·z·Q(z)` with `s = (m - 1)/(m + 1)`, `z = s²`: Q's Taylor coefficients
/// `2/(2k + 1)`, k = 1..9, highest first (for `|s| ≤ 0.172` the rest weighs < 1e-16).
const LN_Q: [f64; 9] = {
    let mut c = [0.0; 9];
    let mut k = 0;
    while k < 9 {
        c[8 - k] = 2.0 / (2 * k + 3) as f64;
        k += 1;
    }
    c
};
/// `2^f = Σ (f ln 2)^k / k!`, k = 0..=12, highest first (for `|f| ≤ 1/2` the rest weighs < 1e-16).
const EXP2: [f64; 13] = {
    let mut c = [1.0; 13];
    let mut k = 1;
    while k < 13 {
        c[12 - k] = c[13 - k] * std::f64::consts::LN_2 / k as f64;
        k += 1;
    }
    c
};
/// 1.5 · 2^52: adding it rounds an f64 to an integer (ties to even) held in its low bits.
const ROUND52: f64 = 6_755_399_441_055_744.0;

#[inline(always)]
fn horner64<D: Lanes64>(x: D, c: &[f64]) -> D {
    let mut p = x.splat(c[0]);
    for k in &c[1..] {
        p = p.fma(x, x.splat(*k));
    }
    p
}

/// `a^y` for a finite `a > 0` (an f32 value) and an f32 `y` other than NaN; `y = ±inf` comes out right
/// as a limit (`2^(y·log2 a)` with the exponent clamped to ±200) except for `a = 1`.
#[inline(always)]
fn pow_abs<D: Lanes64>(a: D, y: D) -> D {
    let c = |k: f64| a.splat(k);
    // a = 2^e · m, m in [√½, √2): the exponent field read as a number, the mantissa with exponent 0.
    let e = a.bits_shr::<52>().bits_or(0x4330_0000_0000_0000) - c(4_503_599_627_370_496.0 + 1023.0);
    let m = a
        .bits_and(0x000F_FFFF_FFFF_FFFF)
        .bits_or(0x3FF0_0000_0000_0000);
    let big = c(std::f64::consts::SQRT_2).lt(m);
    let m = D::select(big, m * c(0.5), m);
    let e = e + D::select(big, c(1.0), c(0.0));
    let s = (m - c(1.0)) / (m + c(1.0));
    let z = s * s;
    let ln_m = (s * z).fma(horner64(z, &LN_Q), s + s);
    let t = y * ln_m.fma(c(std::f64::consts::LOG2_E), e);
    let t = c(-200.0).max(c(200.0).min(t));
    let tr = t + c(ROUND52);
    let n = tr - c(ROUND52);
    // 2^n from the integer in `tr`'s low bits: + 1023, shifted into the exponent field.
    let scale = tr.bits_add(c(f64::from_bits(1023))).bits_shl::<52>();
    horner64(t - n, &EXP2) * scale
}

/// `x^y` as C99 `powf` / `jnp.power`: `x^±0 = 1` and `1^y = 1` (a quiet NaN included), `(-1)^±inf = 1`, a
/// negative finite `x` to a non-integer `y` is NaN, an odd integer `y` keeps the sign of `x` (±0 and
/// ±inf included); ≤ 1 ulp.
#[inline(always)]
pub(crate) fn pow<V: Lanes>(x: V, y: V) -> V {
    let c = |k: f32| x.splat(k);
    let ax = x.abs();
    let inf = c(f32::INFINITY);
    let mag = ax.map_wide::<PowAbs>(y);
    // 0^y and inf^y: 0 or inf by the signs (0^-y = inf^y).
    let (is_inf, y_neg) = (ax.eq(inf), y.lt(c(0.0)));
    let huge = (is_inf & !y_neg) | (!is_inf & y_neg);
    let edge = V::select(huge, inf, c(0.0));
    let mag = V::select(ax.eq(c(0.0)) | is_inf, edge, mag);
    // From 2^24 on every f32 is an even integer; below, truncation is exact.
    let (ay, two24) = (y.abs(), c(16_777_216.0));
    let yi = V::select(ay.lt(two24), y, c(0.0)).trunc_int();
    let is_int = !ay.lt(two24) | V::from_int(yi).eq(y);
    let one_i = x.splat_int(1);
    let odd = is_int & V::int_eq(yi.and(one_i), one_i);
    let x_neg = V::int_eq(x.bits().sra::<31>(), x.splat_int(-1));
    let r = V::select(x_neg & odd, -mag, mag);
    let r = V::select(x.lt(c(0.0)) & ax.lt(inf) & !is_int, c(f32::NAN), r);
    let r = V::select(
        x.is_nan() | y.is_nan(),
        V::select(x.is_nan(), x + x, y + y),
        r,
    );
    // ... but a signaling NaN stays NaN (as glibc's powf).
    let one = (x.eq(c(1.0)) | y.eq(c(0.0)) | (ax.eq(c(1.0)) & ay.eq(inf)))
        & !signaling(x)
        & !signaling(y);
    V::select(one, c(1.0), r)
}

/// NaN with the quiet bit clear.
#[inline(always)]
fn signaling<V: Lanes>(x: V) -> V::Mask {
    let quiet_bits = x.bits().and(x.splat_int(0x7FC0_0000));
    x.is_nan() & V::int_eq(quiet_bits, x.splat_int(0x7F80_0000))
}

/// `1/√x`, correctly rounded (the same bits as `1/√x` in f64 rounded to f32, on all 2^32 inputs):
/// `y = 1/√x` in f32 (two roundings, < 1 ulp), then one second-order Newton step in f64 (error
/// ~2^-69) and one rounding back; `±0 → ±inf`, `inf → 0`, NaN for negative `x`, as `1/√x` itself.
#[inline(always)]
pub(crate) fn rsqrt<V: Lanes>(x: V) -> V {
    let y = x.splat(1.0) / x.sqrt();
    let refined = x.map_wide::<RsqrtNewton>(y);
    // Where `y` is 0, inf or NaN it is the answer (the Newton step would make NaN of 0·inf).
    let finite = y.lt(x.splat(f32::INFINITY)) & x.splat(0.0).lt(y);
    V::select(finite, refined, y)
}

struct PowAbs;
impl WideFn for PowAbs {
    #[inline(always)]
    fn apply<D: Lanes64>(x: D, y: D) -> D {
        pow_abs(x, y)
    }
}

/// One second-order Newton step for `1/√x` in f64 from the estimate `y` (`e = 1 - x·y²`, exact in
/// the fma but for a last rounding far below its ~2^-23 size).
struct RsqrtNewton;
impl WideFn for RsqrtNewton {
    #[inline(always)]
    fn apply<D: Lanes64>(x: D, y: D) -> D {
        let e = (x * x.splat(-1.0) * y).fma(y, x.splat(1.0));
        // y·(1 - e)^(-1/2) to second order: y + y·e·(1/2 + 3e/8).
        (y * e).fma(e.fma(x.splat(0.375), x.splat(0.5)), y)
    }
}

/// `x % y` (C `fmodf`, `arith.remf`: the sign of `x`), exact. For `|x| < 2^29·|y|` (both finite, `y`
/// nonzero) in f64: `q = round(|x|/|y|)` is at most one too big, so `|x| - q·|y|` (exact in one fma:
/// `q·|y|` has at most 53 bits) plus `|y|` when negative is the remainder; other lanes (huge
/// quotients, specials) take `x % y` one at a time — the same bits, the remainder being exact.
#[inline(always)]
pub(crate) fn rem<V: Lanes>(x: V, y: V) -> V {
    let (ax, ay) = (x.abs(), y.abs());
    let r = ax.map_wide::<RemAbs>(ay);
    let sign = x.bits().and(x.splat_int(i32::MIN));
    let r = V::from_bits(r.bits().or(sign));
    if !V::any(!rem_in_f64(ax, ay)) {
        return r;
    }
    let (mut xs, mut ys, mut rs) = ([0f32; 16], [0f32; 16], [0f32; 16]);
    x.store(&mut xs);
    y.store(&mut ys);
    r.store(&mut rs);
    for i in 0..V::N {
        if !rem_in_f64(xs[i].abs(), ys[i].abs()) {
            rs[i] = xs[i] % ys[i];
        }
    }
    x.load(&rs)
}

/// The lanes [`rem`] computes in f64: finite `|x| < 2^29·|y|`, `y` nonzero and finite.
#[inline(always)]
fn rem_in_f64<V: Lanes>(ax: V, ay: V) -> V::Mask {
    let inf = ax.splat(f32::INFINITY);
    ax.lt(ay * ax.splat(536_870_912.0)) & ax.lt(inf) & ax.splat(0.0).lt(ay) & ay.lt(inf)
}

/// `a mod b` for `0 ≤ a < 2^29·b` (see [`rem`]).
struct RemAbs;
impl WideFn for RemAbs {
    #[inline(always)]
    fn apply<D: Lanes64>(a: D, b: D) -> D {
        let q = (a / b + a.splat(ROUND52)) - a.splat(ROUND52);
        let r = (q * a.splat(-1.0)).fma(b, a);
        D::select(r.lt(a.splat(0.0)), r + b, r)
    }
}

//! sin and cos, written once over [`Lanes`] (see `approx.rs` for the scheme): `|x| = j·π/2 + r` with
//! `|r| ≤ 0.79`, then a sine or cosine polynomial of `r` by the quadrant `j mod 4`. Up to
//! [`FAST_MAX`] the reduction is three fused multiply-adds (Cody–Waite); beyond it, lane by lane, an
//! exact Payne–Hanek reduction against 320 bits of 2/π, so huge arguments are as accurate as small ones.

use super::approx::horner;
use super::lanes::{IntLanes, Lanes};

/// sin(r) = `r + r·z·S(z)`, `z = r²`, on [0, 0.79] (fit error 0.07 ulp).
const SIN_S: [f32; 3] = [-1.951_145_8e-4, 8.332_133e-3, -1.666_665_4e-1];
/// cos(r) = `1 - z/2 + z²·C(z)` on [0, 0.79] (fit error 0.002 ulp).
const COS_C: [f32; 3] = [2.442_878_6e-5, -1.388_727_8e-3, 4.166_664_6e-2];
/// 2/π rounded to f32: `j` is the nearest integer to `|x|·FRAC_2_PI`, so `|r|` stays below 0.79.
const FRAC_2_PI: f32 = 0.636_619_75;
/// π/2 = P1 + P2 + P3 (+ 1e-23), each the f32 nearest to what the previous ones leave.
const P1: f32 = 1.570_796_4;
const P2: f32 = -4.371_139e-8;
const P3: f32 = -1.715_124_5e-15;
/// 1.5 · 2^23: adding it rounds to an integer, whose bits minus `ROUND_BITS` are that integer.
const ROUND: f32 = 12_582_912.0;
const ROUND_BITS: i32 = 0x4B40_0000;
/// The largest `|x|` reduced by the fast path (measured: its reduction error stays far below an ulp of
/// the result up to here).
pub(crate) const FAST_MAX: f32 = 131_072.0;

/// `(j, r)` with `|x| = j·π/2 + r`.
#[inline(always)]
fn reduce<V: Lanes>(ax: V) -> (V::Int, V) {
    let c = |k: f32| ax.splat(k);
    let t = ax.fma(c(FRAC_2_PI), c(ROUND));
    let jf = t - c(ROUND);
    let j = t.bits().sub(ax.splat_int(ROUND_BITS));
    let r = jf.fma(c(-P1), ax);
    let r = jf.fma(c(-P2), r);
    let r = jf.fma(c(-P3), r);
    if !V::any(c(FAST_MAX).lt(ax)) {
        return (j, r);
    }
    // Lanes beyond the fast range (inf included), one at a time.
    let (mut xs, mut js, mut rs) = ([0f32; 16], [0i32; 16], [0f32; 16]);
    ax.store(&mut xs);
    V::store_int(j, &mut js);
    r.store(&mut rs);
    for i in 0..V::N {
        if xs[i] > FAST_MAX {
            (js[i], rs[i]) = reduce_big(xs[i]);
        }
    }
    (ax.load_int(&js), ax.load(&rs))
}

/// 2/π to 320 bits, most significant first, after a zero word for the bits above the binary point.
const TWO_OVER_PI: [u64; 6] = [
    0,
    0xa2f9_836e_4e44_1529,
    0xfc27_57d1_f534_ddc0,
    0xdb62_9599_3c43_9041,
    0xfe51_63ab_debb_c561,
    0xb724_6e3a_424d_d2e0,
];

/// `(j mod 4, r)` with `x = j·π/2 + r` for a finite `x > FAST_MAX` (NaN for inf): `x = m·2^e` with
/// an integer `m < 2^24`, so `x·2/π` mod 4 needs only the bits of 2/π from `2^-(e-1)` on; 128 of them
/// times `m` give the quadrant and 64 fraction bits exactly (the bits left out weigh < 2^-100).
pub(crate) fn reduce_big(x: f32) -> (i32, f32) {
    let bits = x.to_bits();
    let biased = (bits >> 23) as i32;
    if biased == 0xFF {
        return (0, f32::NAN);
    }
    let m = ((bits & 0x007F_FFFF) | 0x0080_0000) as u128;
    let e = biased - 150;
    // Bit `i` of 2/π (weight 2^-i, i ≥ 1) is bit `i + 63` of TWO_OVER_PI read as one number; the
    // window starts at `i = e - 1` (lower `i` contribute multiples of 4).
    let p = (e - 1 + 63) as usize;
    let (w, sh) = (p / 64, p % 64);
    let hi = ((TWO_OVER_PI[w] as u128) << 64) | TWO_OVER_PI[w + 1] as u128;
    let window = if sh == 0 {
        hi
    } else {
        (hi << sh) | (TWO_OVER_PI[w + 2] >> (64 - sh)) as u128
    };
    // x·2/π ≡ m·window·2^-126 (mod 4): 2 integer bits, then the fraction.
    let lo = m * (window as u64 as u128);
    let top = m * (window >> 64) + (lo >> 64);
    let quadrant = ((top >> 62) & 3) as i32;
    let frac = ((top << 2) as u64) | ((lo as u64) >> 62);
    // Round to the nearest quadrant: a fraction of at least one half counts as -(1 - fraction).
    let (j, f) = if frac >> 63 == 1 {
        (quadrant + 1, frac as i64 as f64)
    } else {
        (quadrant, frac as f64)
    };
    let r = f * (std::f64::consts::FRAC_PI_2 / 18_446_744_073_709_551_616.0);
    (j & 3, r as f32)
}

/// `sin |x|` (`COS` false) or `cos |x|` for finite `x`: the polynomial the quadrant calls for, its
/// sign flipped in quadrants 2 and 3 (of `j + 1` for cos).
#[inline(always)]
fn sin_cos<V: Lanes, const COS: bool>(ax: V) -> V {
    let c = |k: f32| ax.splat(k);
    let (j, r) = reduce(ax);
    let z = r * r;
    let s = (r * z).fma(horner(z, &SIN_S), r);
    // 1 - z/2 rounds; its rounding error `(1 - w) - z/2` is exact and joins the small terms.
    let (hz, one) = (c(0.5) * z, c(1.0));
    let w = one - hz;
    let co = w + (z * z).fma(horner(z, &COS_C), (one - w) - hz);
    let j = if COS { j.add(ax.splat_int(1)) } else { j };
    let odd = V::int_eq(j.and(ax.splat_int(1)), ax.splat_int(1));
    let flip = j.and(ax.splat_int(2)).shl::<30>();
    V::from_bits(V::select(odd, co, s).bits().xor(flip))
}

/// NaN for ±inf, `x + x` for NaN.
#[inline(always)]
fn specials<V: Lanes>(x: V, v: V) -> V {
    let v = V::select(x.abs().eq(x.splat(f32::INFINITY)), x.splat(f32::NAN), v);
    V::select(x.is_nan(), x + x, v)
}

/// `sin x`, ≤ 1.6 ulp (odd: computed on `|x|`, the sign of `x` put back).
#[inline(always)]
pub(crate) fn sin<V: Lanes>(x: V) -> V {
    let sign = x.bits().and(x.splat_int(i32::MIN));
    let v = sin_cos::<V, false>(x.abs());
    specials(x, V::from_bits(v.bits().xor(sign)))
}

/// `cos x`, ≤ 1.6 ulp.
#[inline(always)]
pub(crate) fn cos<V: Lanes>(x: V) -> V {
    specials(x, sin_cos::<V, true>(x.abs()))
}

//! Scalar ops as the rewritten code computes them. Upstream `arith`/`math` ops are written as they are;
//! a few leave some inputs undefined (LLVM `poison` or a trap) where XLA — and so the interpreter and
//! the TPU — define the result. Those are guarded: the inputs MLIR leaves undefined are replaced by
//! safe ones and the defined result selected, so the engine never traps and agrees with the interpreter.
//! The ops the vector math defines (`exp`, `tanh`, `powf`, ..., `math.rs`) are calls of its functions,
//! and an op on bf16 runs in f32, its result rounded once by the vector math's rounding — what the
//! interpreter computes (MLIR's own bf16 emulation would round the same but make every NaN `0x7fc0`).

use super::rewrite::{Rewriter, Ty, Val};
use crate::error::{kerr, Result};

pub(super) use super::math::round_to_bf16;

type Guard = fn(&mut Rewriter<'_>, &str, &[Val], &str, &str) -> Result<String>;

/// Ops with undefined inputs, and how they are guarded.
const GUARDS: &[(&str, Guard)] = &[
    // x / 0 = -1 (all ones), x % 0 = x; MIN / -1 = MIN, MIN % -1 = 0 (wrapping).
    ("arith.divsi", division),
    ("arith.remsi", division),
    ("arith.divui", division),
    ("arith.remui", division),
    // Saturating, NaN → 0.
    ("arith.fptosi", float_to_int),
    ("arith.fptoui", float_to_int),
    // Shifts by the bit width or more: 0 (logical), the sign (arithmetic).
    ("arith.shli", shift),
    ("arith.shrui", shift),
    ("arith.shrsi", shift),
];

/// `name(operands) {attrs} -> result` on scalars: a call of the vector math if it defines `name`,
/// guarded if `name` is in [`GUARDS`].
pub(super) fn scalar_op(
    rw: &mut Rewriter<'_>,
    name: &str,
    operands: &[Val],
    result: &str,
    attrs: &str,
) -> Result<String> {
    if let Some(r) = float8(rw, name, operands, result)? {
        return Ok(r);
    }
    if let Some(r) = through_f32(rw, name, operands, result, attrs)? {
        return Ok(r);
    }
    if let Some(f) = super::math::function(name) {
        return super::math::call(rw, f, operands, result);
    }
    match GUARDS.iter().find(|(n, _)| *n == name) {
        Some((_, guard)) => guard(rw, name, operands, result, attrs),
        None => {
            let refs: Vec<&Val> = operands.iter().collect();
            Ok(rw.op1(name, &refs, result, attrs))
        }
    }
}

/// An op with an 8-bit float operand or result: the casts (`extf` from one, `truncf` to one) as the
/// dtype table converts (through f32, which holds every such value exactly); selects and bitcasts as
/// they are; nothing else (kernels compute nothing in them: `check` refuses their arithmetic).
fn float8(
    rw: &mut Rewriter<'_>,
    name: &str,
    operands: &[Val],
    result: &str,
) -> Result<Option<String>> {
    let is8 = |t: &str| super::math::FLOAT8.iter().any(|f| f.0 == t);
    if !(operands.iter().any(|v| is8(v.ty.elem())) || is8(result)) {
        return Ok(None);
    }
    let r = match (name, operands) {
        ("arith.select" | "arith.bitcast", _) => return Ok(None),
        ("arith.extf", [x]) => {
            let w = super::math::float8_to_f32(rw, &x.name, x.ty.elem())?;
            match result {
                "f32" => w,
                "bf16" => round_to_bf16(rw, &w), // exact: bf16 holds every 8-bit float
                _ => return Err(kerr!(Unsupported, "mosaic_cpu: `arith.extf` to {result}")),
            }
        }
        ("arith.truncf", [x]) => {
            let w = match x.ty.elem() {
                "f32" => x.name.clone(),
                "bf16" => {
                    let w = rw.fresh();
                    rw.line(format!("{w} = arith.extf {} : bf16 to f32", x.name));
                    w
                }
                t => return Err(kerr!(Unsupported, "mosaic_cpu: `arith.truncf` from {t}")),
            };
            super::math::f32_to_float8(rw, &w, result)?
        }
        _ => {
            return Err(kerr!(
                Unsupported,
                "mosaic_cpu: `{name}` on an 8-bit float (kernels only load, store, cast and multiply them)"
            ))
        }
    };
    Ok(Some(r))
}

/// Ops that compute nothing on bf16 values (they pass or widen bits exactly): written as they are.
const BF16_EXACT: &[&str] = &[
    "arith.extf",
    "arith.select",
    "arith.bitcast",
    "arith.constant",
];

/// An op with a bf16 operand or result, as the interpreter computes it: on the bf16 operands widened
/// to f32, a bf16 result computed in f32 and rounded once ([`round_to_bf16`]; `arith.truncf` to bf16
/// is that rounding; an integer's cast rounds once from the integer). `None` for the ops without bf16
/// and those of [`BF16_EXACT`].
fn through_f32(
    rw: &mut Rewriter<'_>,
    name: &str,
    operands: &[Val],
    result: &str,
    attrs: &str,
) -> Result<Option<String>> {
    let bf16 = |v: &Val| v.ty.elem() == "bf16";
    if !(operands.iter().any(bf16) || result == "bf16") || BF16_EXACT.contains(&name) {
        return Ok(None);
    }
    let args: Vec<Val> = operands
        .iter()
        .map(|v| {
            if !bf16(v) {
                return v.clone();
            }
            let w = rw.fresh();
            rw.line(format!("{w} = arith.extf {} : bf16 to f32", v.name));
            scalar(w, "f32")
        })
        .collect();
    if result != "bf16" {
        return scalar_op(rw, name, &args, result, attrs).map(Some);
    }
    let r = match (name, &args[..]) {
        ("arith.sitofp" | "arith.uitofp", [x]) => {
            let signed = name == "arith.sitofp";
            return Ok(Some(super::math::int_to_bf16(
                rw,
                &x.name,
                x.ty.elem(),
                signed,
            )));
        }
        ("arith.truncf", [x]) if x.ty.elem() == "f32" => x.name.clone(),
        ("arith.truncf", _) => {
            return Err(kerr!(
                Unsupported,
                "mosaic_cpu: `arith.truncf` to bf16 from anything but f32"
            ))
        }
        _ => scalar_op(rw, name, &args, "f32", attrs)?,
    };
    Ok(Some(round_to_bf16(rw, &r)))
}

/// Bits of an integer type (`index` is 64 bits).
fn width(ty: &str) -> Result<u32> {
    if ty == "index" {
        return Ok(64);
    }
    ty.strip_prefix('i')
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| kerr!(Lowering, "mosaic_cpu: `{ty}` is not an integer type"))
}

fn two(operands: &[Val], name: &str) -> Result<(Val, Val)> {
    match operands {
        [a, b] => Ok((a.clone(), b.clone())),
        _ => Err(kerr!(
            Lowering,
            "mosaic_cpu: `{name}` takes two operands, got {}",
            operands.len()
        )),
    }
}

fn cmpi(rw: &mut Rewriter<'_>, pred: &str, a: &str, b: &str, ty: &str) -> String {
    let r = rw.fresh();
    rw.line(format!("{r} = arith.cmpi {pred}, {a}, {b} : {ty}"));
    r
}

fn select(rw: &mut Rewriter<'_>, c: &str, a: &str, b: &str, ty: &str) -> String {
    let r = rw.fresh();
    rw.line(format!("{r} = arith.select {c}, {a}, {b} : {ty}"));
    r
}

fn bool_op(rw: &mut Rewriter<'_>, op: &str, a: &str, b: &str) -> String {
    let r = rw.fresh();
    rw.line(format!("{r} = arith.{op} {a}, {b} : i1"));
    r
}

fn scalar(name: String, ty: &str) -> Val {
    Val {
        name,
        ty: Ty::Scalar(ty.to_string()),
    }
}

fn division(
    rw: &mut Rewriter<'_>,
    name: &str,
    operands: &[Val],
    ty: &str,
    attrs: &str,
) -> Result<String> {
    let (x, y) = two(operands, name)?;
    let w = width(ty)?;
    let signed = name.ends_with("si");
    let zero = rw.int(0, ty);
    let one = rw.int(1, ty);
    let by_zero = cmpi(rw, "eq", &y.name, &zero, ty);
    let mut bad = by_zero.clone();
    if signed {
        let min = rw.int(
            if w >= 64 {
                i64::MIN
            } else {
                -(1i64 << (w - 1))
            },
            ty,
        );
        let minus_one = rw.int(-1, ty);
        let x_min = cmpi(rw, "eq", &x.name, &min, ty);
        let y_m1 = cmpi(rw, "eq", &y.name, &minus_one, ty);
        let overflow = bool_op(rw, "andi", &x_min, &y_m1);
        bad = bool_op(rw, "ori", &bad, &overflow);
    }
    // MIN / 1 = MIN and MIN % 1 = 0 are the wrapping results of MIN / -1 and MIN % -1.
    let safe_y = select(rw, &bad, &one, &y.name, ty);
    let r = rw.op1(name, &[&x, &scalar(safe_y, ty)], ty, attrs);
    let on_zero = if name.contains("div") {
        rw.int(-1, ty)
    } else {
        x.name.clone()
    };
    Ok(select(rw, &by_zero, &on_zero, &r, ty))
}

fn float_to_int(
    rw: &mut Rewriter<'_>,
    name: &str,
    operands: &[Val],
    ty: &str,
    attrs: &str,
) -> Result<String> {
    let [x] = operands else {
        return Err(kerr!(Lowering, "mosaic_cpu: `{name}` takes one operand"));
    };
    let fty = x.ty.elem().to_string();
    let w = width(ty)?;
    let signed = name.ends_with("si");
    // The representable range is [lo, hi): powers of two, exact in every float type.
    let (lo, hi, min, max) = if signed {
        let h = 2f64.powi(w as i32 - 1);
        let min = if w >= 64 {
            i64::MIN
        } else {
            -(1i64 << (w - 1))
        };
        (
            -h,
            h,
            min,
            if w >= 64 {
                i64::MAX
            } else {
                (1i64 << (w - 1)) - 1
            },
        )
    } else {
        (-1.0, 2f64.powi(w as i32), 0, -1)
    };
    let flt = |v: f64| format!("{v:?} : {fty}");
    let (lo_c, hi_c) = (rw.constant(&flt(lo), &fty), rw.constant(&flt(hi), &fty));
    let f = |rw: &mut Rewriter<'_>, pred: &str, a: &str, b: &str| {
        let r = rw.fresh();
        rw.line(format!("{r} = arith.cmpf {pred}, {a}, {b} : {fty}"));
        r
    };
    let nan = f(rw, "uno", &x.name, &x.name);
    let big = f(rw, "oge", &x.name, &hi_c);
    // Signed: below -2^(w-1) saturates to MIN; unsigned: -1 or below saturates to 0.
    let small = f(rw, if signed { "olt" } else { "ole" }, &x.name, &lo_c);
    let out = bool_op(rw, "ori", &nan, &big);
    let out = bool_op(rw, "ori", &out, &small);
    let zero_f = rw.constant(&flt(0.0), &fty);
    let safe = select(rw, &out, &zero_f, &x.name, &fty);
    let r = rw.op1(name, &[&scalar(safe, &fty)], ty, attrs);
    let (min_c, max_c, zero) = (rw.int(min, ty), rw.int(max, ty), rw.int(0, ty));
    let r = select(rw, &big, &max_c, &r, ty);
    let r = select(rw, &small, &min_c, &r, ty);
    Ok(select(rw, &nan, &zero, &r, ty))
}

fn shift(
    rw: &mut Rewriter<'_>,
    name: &str,
    operands: &[Val],
    ty: &str,
    attrs: &str,
) -> Result<String> {
    let (x, n) = two(operands, name)?;
    let w = width(ty)?;
    let bits = rw.int(w as i64, ty);
    let too_far = cmpi(rw, "uge", &n.name, &bits, ty);
    let arithmetic = name == "arith.shrsi";
    let fallback = if arithmetic { w as i64 - 1 } else { 0 };
    let fb = rw.int(fallback, ty);
    let safe_n = select(rw, &too_far, &fb, &n.name, ty);
    let r = rw.op1(name, &[&x, &scalar(safe_n, ty)], ty, attrs);
    if arithmetic {
        // Shifting by w-1 already gives the sign fill.
        return Ok(r);
    }
    let zero = rw.int(0, ty);
    Ok(select(rw, &too_far, &zero, &r, ty))
}

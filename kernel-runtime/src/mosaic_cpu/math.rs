//! The emitted ops whose meaning is a function of the vector math (`kernel_math`, the crate the
//! interpreter computes them with): the rewrite writes a call of that function, so both engines give
//! the same bits and no system libm is involved. Which function an op calls is this table — MLIR's
//! meaning of the op name (`math.exp` is `e^x`), read independently of the op table the lowering
//! derives the names from, so a row lowered to the wrong op still disagrees with the interpreter.
//! The table holds the transcendentals and the element functions whose last bits LLVM would choose
//! otherwise: `arith.maximumf`/`minimumf` (MLIR's expansion orders neither `-0 < +0` nor NaNs as
//! XLA does), `math.floor`/`ceil`/`roundeven` (signaling NaNs). The rounding of an f32 result to bf16
//! is the crate's too ([`ROUND_BF16`], used by `scalar.rs`): MLIR's makes every NaN `0x7fc0`; and so
//! is an integer's cast to bf16 ([`INT_TO_BF16`]: rounded once, where MLIR's goes through f32).
//!
//! A call is `func.call @tpu_kernel_math_<fn>(...) : (f32, ...) -> f32` to a `func.func private`
//! declaration the module gains; `jit.rs` binds each symbol to the `extern "C"` shim below
//! ([`symbols`]). Calls take f32: `scalar.rs` runs a bf16 op on its operands widened to f32 and
//! rounds the result once, as the interpreter computes a bf16 op.
//!
//! May depend on: `rewrite` (the [`Rewriter`] and its types) and `kernel_math`; the rules reach it
//! through `scalar.rs`, the JIT through [`symbols`].

use super::rewrite::{Rewriter, Val};
use crate::error::{kerr, Result};
use std::ffi::c_void;

/// A function of the vector math as the JIT'd code calls it (the C ABI: f32 in and out).
#[derive(Clone, Copy)]
pub(super) enum Shim {
    Unary(extern "C" fn(f32) -> f32),
    Binary(extern "C" fn(f32, f32) -> f32),
}

impl Shim {
    fn arity(self) -> usize {
        match self {
            Shim::Unary(_) => 1,
            Shim::Binary(_) => 2,
        }
    }

    fn address(self) -> *mut c_void {
        match self {
            Shim::Unary(f) => f as *mut c_void,
            Shim::Binary(f) => f as *mut c_void,
        }
    }
}

/// One op the vector math defines.
pub(super) struct MathFn {
    /// The emitted op's name.
    pub op: &'static str,
    /// The symbol the rewritten module calls.
    pub symbol: &'static str,
    pub shim: Shim,
}

/// `op => name = path(args)`: a row of [`FUNCTIONS`] calling the crate's function `path`, through the
/// shim `name`.
macro_rules! functions {
    ($($op:literal => $name:ident = $f:path, ($($a:ident),+) $kind:ident;)*) => {
        /// Every op the rewrite calls the vector math for.
        pub(super) const FUNCTIONS: &[MathFn] = &[$(MathFn {
            op: $op,
            symbol: concat!("tpu_kernel_math_", stringify!($name)),
            shim: Shim::$kind(shims::$name),
        }),*];

        /// The C-ABI entries of the JIT'd calls: each forwards to the crate's function — for a
        /// transcendental its scalar form, the definition its vector loops reproduce. None unwinds
        /// (plain arithmetic).
        mod shims {
            $(pub(super) extern "C" fn $name($($a: f32),+) -> f32 {
                $f($($a),+)
            })*
        }
    };
}

functions! {
    "math.exp" => exp = kernel_math::scalar::exp, (x) Unary;
    "math.log" => log = kernel_math::scalar::log, (x) Unary;
    "math.log1p" => log1p = kernel_math::scalar::log1p, (x) Unary;
    "math.tanh" => tanh = kernel_math::scalar::tanh, (x) Unary;
    "math.erf" => erf = kernel_math::scalar::erf, (x) Unary;
    "math.sin" => sin = kernel_math::scalar::sin, (x) Unary;
    "math.cos" => cos = kernel_math::scalar::cos, (x) Unary;
    "math.rsqrt" => rsqrt = kernel_math::scalar::rsqrt, (x) Unary;
    "tpu.logistic" => logistic = kernel_math::scalar::logistic, (x) Unary;
    "math.powf" => pow = kernel_math::scalar::pow, (x, y) Binary;
    "arith.remf" => rem = kernel_math::scalar::rem, (x, y) Binary;
    "arith.maximumf" => max = kernel_math::max_f32, (x, y) Binary;
    "arith.minimumf" => min = kernel_math::min_f32, (x, y) Binary;
    "math.floor" => floor = kernel_math::floor_f32, (x) Unary;
    "math.ceil" => ceil = kernel_math::ceil_f32, (x) Unary;
    "math.roundeven" => roundeven = kernel_math::round_even_f32, (x) Unary;
}

/// The symbol of the rounding of an f32 to bf16 (`kernel_math::bf16_bits`: `(f32) -> i16`).
pub(super) const ROUND_BF16: &str = "tpu_kernel_math_bf16_bits";

extern "C" fn round_bf16(x: f32) -> u16 {
    kernel_math::bf16_bits(x)
}

/// The symbol of an integer's cast to bf16 (`kernel_math::bf16_bits_of_i64`: `(i64) -> i16`).
pub(super) const INT_TO_BF16: &str = "tpu_kernel_math_bf16_bits_of_i64";

extern "C" fn int_to_bf16_shim(v: i64) -> u16 {
    kernel_math::bf16_bits_of_i64(v)
}

/// The 8-bit floats (MLIR type, Rust type): their conversions to and from f32 are calls of the dtype
/// table's functions (`crate::dtype::f8e4m3fn`, ...), as the interpreter converts; LLVM has no 8-bit
/// float type (the values travel as `i8` bits).
macro_rules! float8_shims {
    ($( $mlir:literal => $T:ident, $to:ident / $to_sym:literal, $from:ident / $from_sym:literal; )*) => {
        $(
            extern "C" fn $to(bits: u8) -> f32 {
                crate::dtype::$T::from_bits(bits).to_f32()
            }
            extern "C" fn $from(x: f32) -> u8 {
                crate::dtype::$T::from_f32(x).to_bits()
            }
        )*
        /// `(mlir type, to-f32 symbol, from-f32 symbol)` of each 8-bit float.
        pub(super) const FLOAT8: &[(&str, &str, &str)] = &[$( ($mlir, $to_sym, $from_sym), )*];
        fn float8_symbols() -> impl Iterator<Item = (&'static str, *mut c_void)> {
            [$( ($to_sym, $to as *mut c_void), ($from_sym, $from as *mut c_void), )*].into_iter()
        }
    };
}
float8_shims! {
    "f8E4M3FN" => f8e4m3fn, e4m3fn_to_f32 / "tpu_kernel_f8e4m3fn_to_f32",
        e4m3fn_from_f32 / "tpu_kernel_f8e4m3fn_from_f32";
    "f8E5M2" => f8e5m2, e5m2_to_f32 / "tpu_kernel_f8e5m2_to_f32",
        e5m2_from_f32 / "tpu_kernel_f8e5m2_from_f32";
}

/// `x` (a scalar of 8-bit float type `ty`) widened to f32 exactly; returns the f32 value.
pub(super) fn float8_to_f32(rw: &mut Rewriter<'_>, x: &str, ty: &str) -> Result<String> {
    let sym = FLOAT8.iter().find(|f| f.0 == ty).map(|f| f.1);
    let sym = sym.ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: no 8-bit float `{ty}`"))?;
    rw.declare(format!("func.func private @{sym}(i8) -> f32"));
    let (bits, r) = (rw.fresh(), rw.fresh());
    rw.line(format!("{bits} = arith.bitcast {x} : {ty} to i8"));
    rw.line(format!("{r} = func.call @{sym}({bits}) : (i8) -> f32"));
    Ok(r)
}

/// `x` (an f32 scalar) rounded to the 8-bit float type `ty`; returns the value.
pub(super) fn f32_to_float8(rw: &mut Rewriter<'_>, x: &str, ty: &str) -> Result<String> {
    let sym = FLOAT8.iter().find(|f| f.0 == ty).map(|f| f.2);
    let sym = sym.ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: no 8-bit float `{ty}`"))?;
    rw.declare(format!("func.func private @{sym}(f32) -> i8"));
    let (bits, r) = (rw.fresh(), rw.fresh());
    rw.line(format!("{bits} = func.call @{sym}({x}) : (f32) -> i8"));
    rw.line(format!("{r} = arith.bitcast {bits} : i8 to {ty}"));
    Ok(r)
}

/// Every symbol the rewritten module may call, and the address of its shim.
pub(super) fn symbols() -> impl Iterator<Item = (&'static str, *mut c_void)> {
    FUNCTIONS
        .iter()
        .map(|f| (f.symbol, f.shim.address()))
        .chain([
            (ROUND_BF16, round_bf16 as *mut c_void),
            (INT_TO_BF16, int_to_bf16_shim as *mut c_void),
        ])
        .chain(float8_symbols())
}

/// The vector math's function for op `name`, if it defines one.
pub(super) fn function(name: &str) -> Option<&'static MathFn> {
    FUNCTIONS.iter().find(|f| f.op == name)
}

/// The call of `f` on f32 scalar `operands`; returns the result.
pub(super) fn call(
    rw: &mut Rewriter<'_>,
    f: &MathFn,
    operands: &[Val],
    ty: &str,
) -> Result<String> {
    let n = f.shim.arity();
    if ty != "f32" || operands.len() != n || operands.iter().any(|v| v.ty.elem() != ty) {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: `{}` on {} operand(s) of {ty} (the vector math defines it on {n} f32)",
            f.op,
            operands.len()
        ));
    }
    let types = vec!["f32"; n].join(", ");
    rw.declare(format!("func.func private @{}({types}) -> f32", f.symbol));
    let args: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
    let r = rw.fresh();
    rw.line(format!(
        "{r} = func.call @{}({}) : ({types}) -> f32",
        f.symbol,
        args.join(", ")
    ));
    Ok(r)
}

/// `x` (an f32 scalar) rounded to bf16 by the vector math's rounding; returns the bf16 value.
pub(super) fn round_to_bf16(rw: &mut Rewriter<'_>, x: &str) -> String {
    rw.declare(format!("func.func private @{ROUND_BF16}(f32) -> i16"));
    let (bits, r) = (rw.fresh(), rw.fresh());
    rw.line(format!(
        "{bits} = func.call @{ROUND_BF16}({x}) : (f32) -> i16"
    ));
    rw.line(format!("{r} = arith.bitcast {bits} : i16 to bf16"));
    r
}

/// The integer `x` of type `ty` (`iN`, `signed` or not) cast to bf16 by the vector math's rounding;
/// returns the bf16 value.
pub(super) fn int_to_bf16(rw: &mut Rewriter<'_>, x: &str, ty: &str, signed: bool) -> String {
    let wide = if ty == "i64" {
        x.to_string()
    } else {
        let (w, ext) = (rw.fresh(), if signed { "extsi" } else { "extui" });
        rw.line(format!("{w} = arith.{ext} {x} : {ty} to i64"));
        w
    };
    rw.declare(format!("func.func private @{INT_TO_BF16}(i64) -> i16"));
    let (bits, r) = (rw.fresh(), rw.fresh());
    rw.line(format!(
        "{bits} = func.call @{INT_TO_BF16}({wide}) : (i64) -> i16"
    ));
    rw.line(format!("{r} = arith.bitcast {bits} : i16 to bf16"));
    r
}

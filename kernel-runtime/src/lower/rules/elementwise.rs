//! The lowering's column of the op table (`kernel-ops`): the Mosaic op of each elementwise op per
//! dtype class, as exhaustive `match`es — a new row is a compile error here until it is given a
//! lowering (or explicitly none) — and the unary/binary rules that emit them.
//!
//! Before offering an op, compile it through libtpu for v5e and v6e: `math.expm1` and `cmpf une` are
//! verified by jaxlib but rejected by libtpu (so `expm1` and float `!=` are compositions).

use super::*;

/// How an integer unary op lowers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntLowering {
    /// Not defined on integers.
    None,
    /// One Mosaic op.
    Op(&'static str),
    /// `0 - x` (`arith.subi`; Mosaic has no integer negate).
    SubFromZero,
    /// `x ^ -1` (`arith.xori`).
    XorAllOnes,
}

/// The Mosaic op of unary op `u` on float operands.
pub fn mosaic_unary_float(u: UnaryOp) -> Option<&'static str> {
    use UnaryOp as U;
    Some(match u {
        U::Neg => "arith.negf",
        U::Not => return None,
        U::Exp => "math.exp",
        U::Log => "math.log",
        U::Tanh => "math.tanh",
        U::Rsqrt => "math.rsqrt",
        U::Sqrt => "math.sqrt",
        U::Abs => "math.absf",
        U::Sin => "math.sin",
        U::Cos => "math.cos",
        U::Erf => "math.erf",
        U::Log1p => "math.log1p",
        // As Pallas lowers `lax.logistic` (v6e has a native instruction; v5e expands it).
        U::Logistic => "tpu.logistic",
        U::Floor => "math.floor",
        U::Ceil => "math.ceil",
        // Half to even (`jnp.round`).
        U::Round => "math.roundeven",
    })
}

/// How unary op `u` lowers on integer (and bool) operands.
pub fn mosaic_unary_int(u: UnaryOp) -> IntLowering {
    use UnaryOp as U;
    match u {
        U::Neg => IntLowering::SubFromZero,
        U::Not => IntLowering::XorAllOnes,
        U::Abs => IntLowering::Op("math.absi"),
        U::Exp
        | U::Log
        | U::Tanh
        | U::Rsqrt
        | U::Sqrt
        | U::Sin
        | U::Cos
        | U::Erf
        | U::Log1p
        | U::Logistic
        | U::Floor
        | U::Ceil
        | U::Round => IntLowering::None,
    }
}

/// The Mosaic op of binary op `b` on operands of dtype `d` (bool takes the signed column).
pub fn mosaic_binary(b: BinaryOp, d: DType) -> Option<&'static str> {
    use BinaryOp as B;
    // (float, signed, unsigned)
    let (float, signed, unsigned) = match b {
        B::Add => (Some("arith.addf"), "arith.addi", "arith.addi"),
        B::Sub => (Some("arith.subf"), "arith.subi", "arith.subi"),
        B::Mul => (Some("arith.mulf"), "arith.muli", "arith.muli"),
        B::Div => (Some("arith.divf"), "arith.divsi", "arith.divui"),
        B::Rem => (Some("arith.remf"), "arith.remsi", "arith.remui"),
        B::Max => (Some("arith.maximumf"), "arith.maxsi", "arith.maxui"),
        B::Min => (Some("arith.minimumf"), "arith.minsi", "arith.minui"),
        B::Pow => return d.is_float().then_some("math.powf"),
        B::And => (None, "arith.andi", "arith.andi"),
        B::Or => (None, "arith.ori", "arith.ori"),
        B::Xor => (None, "arith.xori", "arith.xori"),
        B::Shl => (None, "arith.shli", "arith.shli"),
        B::Shr => (None, "arith.shrsi", "arith.shrui"),
    };
    if d.is_float() {
        float
    } else if d.is_unsigned() {
        Some(unsigned)
    } else {
        Some(signed)
    }
}

pub(super) fn unary(lw: &mut Lowerer<'_>, block: &mut Vec<MOp>, op: &Op, u: UnaryOp) -> Result<()> {
    let ty = lw.func.ty(op.results[0]).clone();
    let d = ty.dtype();
    let no_rule = || kerr!(Lowering, "`{}` on {d} has no Mosaic lowering", u.name());
    if d.is_float() {
        return simple(
            lw,
            block,
            op,
            mosaic_unary_float(u).ok_or_else(no_rule)?,
            &[],
        );
    }
    let (lit, name) = match mosaic_unary_int(u) {
        IntLowering::Op(name) => return simple(lw, block, op, name, &[]),
        IntLowering::None => return Err(no_rule()),
        // -x = 0 - x; !x = x ^ all-ones.
        IntLowering::SubFromZero => (Literal::zero(d), "arith.subi"),
        IntLowering::XorAllOnes => (Literal::from_i64(d, -1), "arith.xori"),
    };
    let c = const_value(lw, block, op, &ty, lit)?;
    let x = lw.v(op.operands[0])?;
    let args = if name == "arith.subi" { [c, x] } else { [x, c] };
    let mty = lw.ty(&ty)?;
    let r = emit(lw, block, op, name, &args, &[mty], &[])?[0];
    lw.bind(op.results[0], r);
    Ok(())
}

pub(super) fn binary(
    lw: &mut Lowerer<'_>,
    block: &mut Vec<MOp>,
    op: &Op,
    b: BinaryOp,
) -> Result<()> {
    let d = lw.func.ty(op.results[0]).dtype();
    let name = mosaic_binary(b, d)
        .ok_or_else(|| kerr!(Lowering, "`{}` on {d} has no Mosaic lowering", b.name()))?;
    simple(lw, block, op, name, &[])
}

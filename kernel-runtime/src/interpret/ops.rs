//! The interpreter's column of the op table (`kernel-ops`): what each elementwise op computes on the
//! CPU. [`unary_fn`], [`binary_fn`] and [`int_fn`] are exhaustive `match`es on the op enums — a new row is
//! a compile error here (and only here, for the interpreter) until it is given a meaning or explicitly
//! none. The dispatch macros match on the interpreter's own closed sets of functions.
//!
//! Each macro binds `$f` to the function and expands `$body` with it (one closure or function object
//! per arm, so every loop is monomorphized and the fused and unfused paths share one definition), or
//! expands `$other` for an op without that meaning. Floats compute in f32 (bf16 through f32); integers
//! wrap and follow XLA at the edges (`math::IntOps`).

use crate::ir::{BinaryOp, UnaryOp};

/// The interpreter's unary f32 functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnaryFn {
    Neg,
    Exp,
    Log,
    Tanh,
    Rsqrt,
    Sqrt,
    Abs,
    Sin,
    Cos,
    Erf,
    Log1p,
    Logistic,
    Floor,
    Ceil,
    RoundEven,
}

/// The f32 meaning of unary op `u` (`None`: not defined on floats).
pub(crate) const fn unary_fn(u: UnaryOp) -> Option<UnaryFn> {
    use UnaryFn as F;
    use UnaryOp as U;
    Some(match u {
        U::Neg => F::Neg,
        U::Not => return None,
        U::Exp => F::Exp,
        U::Log => F::Log,
        U::Tanh => F::Tanh,
        U::Rsqrt => F::Rsqrt,
        U::Sqrt => F::Sqrt,
        U::Abs => F::Abs,
        U::Sin => F::Sin,
        U::Cos => F::Cos,
        U::Erf => F::Erf,
        U::Log1p => F::Log1p,
        U::Logistic => F::Logistic,
        U::Floor => F::Floor,
        U::Ceil => F::Ceil,
        U::Round => F::RoundEven,
    })
}

/// The interpreter's binary f32 functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinaryFn {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    /// NaN-propagating (`jnp.maximum`).
    Max,
    /// NaN-propagating (`jnp.minimum`).
    Min,
    Pow,
}

/// The f32 meaning of binary op `b` (`None`: not defined on floats).
pub(crate) const fn binary_fn(b: BinaryOp) -> Option<BinaryFn> {
    use BinaryFn as F;
    use BinaryOp as B;
    Some(match b {
        B::Add => F::Add,
        B::Sub => F::Sub,
        B::Mul => F::Mul,
        B::Div => F::Div,
        B::Rem => F::Rem,
        B::Max => F::Max,
        B::Min => F::Min,
        B::Pow => F::Pow,
        B::And | B::Or | B::Xor | B::Shl | B::Shr => return None,
    })
}

/// The interpreter's binary integer functions (`math::IntOps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntFn {
    Add,
    Sub,
    Mul,
    /// Truncating; by zero -1 (all ones), as XLA.
    Div,
    /// The dividend's sign; by zero the dividend, as XLA.
    Rem,
    Max,
    Min,
    And,
    Or,
    Xor,
    /// By the bit width or more: 0 (XLA's `shift_left`).
    Shl,
    /// Arithmetic for signed, logical for unsigned; by the bit width or more the sign fill or 0.
    Shr,
}

/// The integer meaning of binary op `b` (`None`: float-only).
pub(crate) const fn int_fn(b: BinaryOp) -> Option<IntFn> {
    use BinaryOp as B;
    use IntFn as F;
    Some(match b {
        B::Add => F::Add,
        B::Sub => F::Sub,
        B::Mul => F::Mul,
        B::Div => F::Div,
        B::Rem => F::Rem,
        B::Max => F::Max,
        B::Min => F::Min,
        B::Pow => return None,
        B::And => F::And,
        B::Or => F::Or,
        B::Xor => F::Xor,
        B::Shl => F::Shl,
        B::Shr => F::Shr,
    })
}

/// `$body` with `$f` bound to the f32 meaning of unary op `$op`, or `$other`.
macro_rules! unary_f32 {
    ($op:expr, $f:ident => $body:expr, else $other:expr) => {{
        use $crate::interpret::ops::UnaryFn as F;
        #[allow(unused_imports)]
        use $crate::math::*;
        macro_rules! with {
            ($fun:expr) => {{
                let $f = $fun;
                $body
            }};
        }
        match $crate::interpret::ops::unary_fn($op) {
            Some(F::Neg) => with!(|x: f32| -x),
            Some(F::Exp) => with!(Exp),
            Some(F::Log) => with!(Log),
            Some(F::Tanh) => with!(Tanh),
            Some(F::Rsqrt) => with!(Rsqrt),
            Some(F::Sqrt) => with!(f32::sqrt),
            Some(F::Abs) => with!(f32::abs),
            Some(F::Sin) => with!(Sin),
            Some(F::Cos) => with!(Cos),
            Some(F::Erf) => with!(Erf),
            Some(F::Log1p) => with!(Log1p),
            Some(F::Logistic) => with!(Logistic),
            Some(F::Floor) => with!(floor_f32),
            Some(F::Ceil) => with!(ceil_f32),
            Some(F::RoundEven) => with!(round_even_f32),
            None => $other,
        }
    }};
}
pub(crate) use unary_f32;

/// `$body` with `$f` bound to the f32 meaning of binary op `$op`, or `$other`.
macro_rules! binary_f32 {
    ($op:expr, $f:ident => $body:expr, else $other:expr) => {{
        use $crate::interpret::ops::BinaryFn as F;
        #[allow(unused_imports)]
        use $crate::math::*;
        macro_rules! with {
            ($fun:expr) => {{
                let $f = $fun;
                $body
            }};
        }
        match $crate::interpret::ops::binary_fn($op) {
            Some(F::Add) => with!(add_f32),
            Some(F::Sub) => with!(|x: f32, y: f32| x - y),
            Some(F::Mul) => with!(mul_f32),
            Some(F::Div) => with!(|x: f32, y: f32| x / y),
            Some(F::Rem) => with!(Rem),
            Some(F::Max) => with!(max_f32),
            Some(F::Min) => with!(min_f32),
            Some(F::Pow) => with!(Pow),
            None => $other,
        }
    }};
}
pub(crate) use binary_f32;

/// `$body` with `$f` bound to the integer meaning of binary op `$op` on element type `$T` (an
/// `IntOps` type), or `$other` for a float-only op.
macro_rules! binary_int {
    ($op:expr, $T:ty, $f:ident => $body:expr, else $other:expr) => {{
        use $crate::interpret::ops::IntFn as F;
        #[allow(unused_imports)]
        use $crate::math::IntOps;
        macro_rules! with {
            ($m:ident) => {{
                let $f = |x: $T, y: $T| -> $T { x.$m(y) };
                $body
            }};
        }
        match $crate::interpret::ops::int_fn($op) {
            Some(F::Add) => with!(wadd),
            Some(F::Sub) => with!(wsub),
            Some(F::Mul) => with!(wmul),
            Some(F::Div) => with!(xdiv),
            Some(F::Rem) => with!(xrem),
            Some(F::Max) => with!(imax),
            Some(F::Min) => with!(imin),
            Some(F::And) => with!(and),
            Some(F::Or) => with!(or),
            Some(F::Xor) => with!(xor),
            Some(F::Shl) => with!(shl),
            Some(F::Shr) => with!(shr),
            None => $other,
        }
    }};
}
pub(crate) use binary_int;

//! The elementwise op table: every unary and binary elementwise op of the IR, declared once.
//!
//! Each row gives the op's traced method (if it has one), the dtypes it takes, the Mosaic op it lowers
//! to per dtype class, its f32 meaning (the interpreter's, for f32 and — through f32 — bf16), its
//! integer meaning, and its cost class. From the rows come: the [`UnaryOp`] / [`BinaryOp`] enums, their
//! printed names, the lowering lookup (`lower/rules.rs`), the trace-time dtype check, the interpreter's
//! dispatch ([`unary_f32!`], [`binary_f32!`], [`binary_int!`] — one closure per arm, so every loop is
//! monomorphized and the fused and unfused paths share one definition), and the list of traced method
//! names, which `tests/op_table.rs` holds equal to the `#[tpu_kernel]` macro's list.
//!
//! Adding an elementwise op = one row here (plus a scalar function if `std` lacks it), the traced method
//! in `trace/` when it has one, and tests. Ops that Pallas lowers as a composition of others
//! (`sign`, `clamp`, `isnan`) are compositions at trace time too (`trace/array.rs`), so they
//! lower exactly as Pallas lowers them; so is `expm1`, whose `math.expm1` libtpu cannot legalize.

/// The dtypes an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// f32, bf16.
    Float,
    /// Floats and signed integers.
    Signed,
    /// Floats and integers (not bool).
    Numeric,
    /// Integers (signed and unsigned).
    Int,
    /// Integers and bool.
    IntOrBool,
}

impl Operands {
    pub fn accepts(self, d: crate::dtype::DType) -> bool {
        use crate::dtype::DType;
        match self {
            Operands::Float => d.is_float(),
            Operands::Signed => d.is_float() || (d.is_int() && !d.is_unsigned()),
            Operands::Numeric => d != DType::Bool,
            Operands::Int => d.is_int(),
            Operands::IntOrBool => d.is_int() || d == DType::Bool,
        }
    }
    /// Whether the op has an f32 meaning (the interpreter's fused f32 chains may hold it).
    pub fn has_float(self) -> bool {
        matches!(self, Operands::Float | Operands::Signed | Operands::Numeric)
    }
}

/// What an op costs on the VPU/EUP (the cost estimate's `transcendentals`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// One VPU op per element.
    Simple,
    /// An EUP (transcendental) op per element.
    Transcendental,
}

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

macro_rules! unary_table {
    ($d:tt $(
        $(#[doc = $doc:literal])*
        $V:ident { method: $method:tt, operands: $ops:ident, float: $mf:expr, int: $mi:expr,
                   f32: $f:tt, cost: $cost:ident }
    )*) => {
        /// A unary elementwise op (see the module docs: one row of the op table each).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp { $( $(#[doc = $doc])* $V, )* }

        impl UnaryOp {
            /// Every unary op, in table order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$V),*];
            /// The traced method (`x.exp()`), or `None` for an operator-only op (`-x`, `!x`).
            pub fn method(self) -> Option<&'static str> {
                match self { $(UnaryOp::$V => method_str!($method),)* }
            }
            /// The printed name (`exp`, `neg`).
            pub fn name(self) -> &'static str {
                match self { $(UnaryOp::$V => paste_lower!($V),)* }
            }
            pub fn operands(self) -> Operands {
                match self { $(UnaryOp::$V => Operands::$ops,)* }
            }
            /// The Mosaic op for float operands.
            pub fn mosaic_float(self) -> Option<&'static str> {
                match self { $(UnaryOp::$V => $mf,)* }
            }
            /// How integer operands lower.
            pub fn mosaic_int(self) -> IntLowering {
                match self { $(UnaryOp::$V => $mi,)* }
            }
            pub fn cost(self) -> Cost {
                match self { $(UnaryOp::$V => Cost::$cost,)* }
            }
        }

        /// Expands `$body` with `$f` bound to the f32 meaning of unary op `$op` (`$other` for the ops
        /// without one). The one definition the interpreter's paths share.
        macro_rules! unary_f32 {
            ($d op:expr, $d f:ident => $d body:expr, else $d other:expr) => {{
                #[allow(unused_imports)]
                use $crate::math::*;
                match $d op {
                    $( $crate::ir::UnaryOp::$V => $crate::ir::op_arm!($f, $d f, $d body, $d other), )*
                }
            }};
        }
        pub(crate) use unary_f32;

        /// Calls `$m! { (Variant, method, Operands, [docs]) ... }` with every unary row (`-` for an
        /// operator-only op): how `trace/` defines the traced methods from the table.
        macro_rules! for_each_unary {
            ($d m:ident) => {
                $d m! { $( ($V, $method, $ops, [$($doc),*]) )* }
            };
        }
        pub(crate) use for_each_unary;
    };
}

macro_rules! method_str {
    (-) => {
        None
    };
    ($m:ident) => {
        Some(stringify!($m))
    };
}

/// One arm of a dispatch macro: `$body` with `$f` bound to the op's function, or `$other` (`none`).
macro_rules! op_arm {
    (none, $f:ident, $body:expr, $other:expr) => {
        $other
    };
    ($fun:tt, $f:ident, $body:expr, $other:expr) => {{
        let $f = $fun;
        $body
    }};
}
pub(crate) use op_arm;

/// One arm of [`binary_int!`]: `$f` is `IntOps::$m` on `$T`, or `$other` (`none`).
macro_rules! int_arm {
    (none, $T:ty, $f:ident, $body:expr, $other:expr) => {
        $other
    };
    ($m:ident, $T:ty, $f:ident, $body:expr, $other:expr) => {{
        let $f = |x: $T, y: $T| -> $T { x.$m(y) };
        $body
    }};
}
pub(crate) use int_arm;

/// The printed name of a variant: its name in lower case (a tiny stand-in for `paste`).
macro_rules! paste_lower {
    (Neg) => {
        "neg"
    };
    (Not) => {
        "not"
    };
    (Exp) => {
        "exp"
    };
    (Log) => {
        "log"
    };
    (Tanh) => {
        "tanh"
    };
    (Rsqrt) => {
        "rsqrt"
    };
    (Sqrt) => {
        "sqrt"
    };
    (Abs) => {
        "abs"
    };
    (Sin) => {
        "sin"
    };
    (Cos) => {
        "cos"
    };
    (Erf) => {
        "erf"
    };
    (Log1p) => {
        "log1p"
    };
    (Logistic) => {
        "logistic"
    };
    (Expm1) => {
        "expm1"
    };
    (Floor) => {
        "floor"
    };
    (Ceil) => {
        "ceil"
    };
    (Round) => {
        "round"
    };
    (Add) => {
        "add"
    };
    (Sub) => {
        "sub"
    };
    (Mul) => {
        "mul"
    };
    (Div) => {
        "div"
    };
    (Rem) => {
        "rem"
    };
    (Max) => {
        "max"
    };
    (Min) => {
        "min"
    };
    (Pow) => {
        "pow"
    };
    (And) => {
        "and"
    };
    (Or) => {
        "or"
    };
    (Xor) => {
        "xor"
    };
    (Shl) => {
        "shl"
    };
    (Shr) => {
        "shr"
    };
}

unary_table! { $
    /// Elementwise negation (`-x`).
    Neg { method: -, operands: Signed, float: Some("arith.negf"), int: IntLowering::SubFromZero,
          f32: (|x: f32| -x), cost: Simple }
    /// Bitwise / logical not (`!x`).
    Not { method: -, operands: IntOrBool, float: None, int: IntLowering::XorAllOnes,
          f32: none, cost: Simple }
    /// Elementwise `e^x`.
    Exp { method: exp, operands: Float, float: Some("math.exp"), int: IntLowering::None,
          f32: Exp, cost: Transcendental }
    /// Elementwise natural logarithm.
    Log { method: log, operands: Float, float: Some("math.log"), int: IntLowering::None,
          f32: Log, cost: Transcendental }
    /// Elementwise hyperbolic tangent.
    Tanh { method: tanh, operands: Float, float: Some("math.tanh"), int: IntLowering::None,
           f32: Tanh, cost: Transcendental }
    /// Elementwise `1/sqrt(x)`.
    Rsqrt { method: rsqrt, operands: Float, float: Some("math.rsqrt"), int: IntLowering::None,
            f32: Rsqrt, cost: Transcendental }
    /// Elementwise square root.
    Sqrt { method: sqrt, operands: Float, float: Some("math.sqrt"), int: IntLowering::None,
           f32: (f32::sqrt), cost: Transcendental }
    /// Elementwise absolute value.
    Abs { method: abs, operands: Signed, float: Some("math.absf"),
          int: IntLowering::Op("math.absi"), f32: (f32::abs), cost: Simple }
    /// Elementwise sine.
    Sin { method: sin, operands: Float, float: Some("math.sin"), int: IntLowering::None,
          f32: Sin, cost: Transcendental }
    /// Elementwise cosine.
    Cos { method: cos, operands: Float, float: Some("math.cos"), int: IntLowering::None,
          f32: Cos, cost: Transcendental }
    /// Elementwise error function (`jax.lax.erf`).
    Erf { method: erf, operands: Float, float: Some("math.erf"), int: IntLowering::None,
          f32: Erf, cost: Transcendental }
    /// Elementwise `ln(1 + x)`, accurate near 0.
    Log1p { method: log1p, operands: Float, float: Some("math.log1p"), int: IntLowering::None,
            f32: Log1p, cost: Transcendental }
    /// Elementwise `1 / (1 + e^-x)` (`jax.nn.sigmoid`, `lax.logistic`): `tpu.logistic`, as Pallas lowers
    /// it (v6e has a native instruction; v5e expands it).
    Logistic { method: logistic, operands: Float, float: Some("tpu.logistic"), int: IntLowering::None,
               f32: Logistic, cost: Transcendental }
    /// Elementwise floor.
    Floor { method: floor, operands: Float, float: Some("math.floor"), int: IntLowering::None,
            f32: floor_f32, cost: Simple }
    /// Elementwise ceiling.
    Ceil { method: ceil, operands: Float, float: Some("math.ceil"), int: IntLowering::None,
           f32: ceil_f32, cost: Simple }
    /// Elementwise rounding, half to even (`jnp.round`, `lax.round(.., TO_NEAREST_EVEN)`).
    Round { method: round, operands: Float, float: Some("math.roundeven"),
            int: IntLowering::None, f32: round_even_f32, cost: Simple }
}

macro_rules! binary_table {
    ($d:tt $(
        $(#[doc = $doc:literal])*
        $V:ident { operands: $ops:ident, float: $mf:expr, signed: $ms:expr, unsigned: $mu:expr,
                   f32: $f:tt, int: $i:tt }
    )*) => {
        /// A binary elementwise op (see the module docs: one row of the op table each).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp { $( $(#[doc = $doc])* $V, )* }

        impl BinaryOp {
            /// Every binary op, in table order.
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$V),*];
            /// The printed name (`add`).
            pub fn name(self) -> &'static str {
                match self { $(BinaryOp::$V => paste_lower!($V),)* }
            }
            pub fn operands(self) -> Operands {
                match self { $(BinaryOp::$V => Operands::$ops,)* }
            }
            /// The Mosaic op for operands of dtype `d` (bool takes the signed column).
            pub fn mosaic(self, d: crate::dtype::DType) -> Option<&'static str> {
                match self {
                    $(BinaryOp::$V => if d.is_float() { $mf } else if d.is_unsigned() { $mu } else { $ms },)*
                }
            }
        }

        /// Expands `$body` with `$f` bound to the f32 meaning of binary op `$op` (`$other` for the ops
        /// without one). The one definition the interpreter's paths share.
        macro_rules! binary_f32 {
            ($d op:expr, $d f:ident => $d body:expr, else $d other:expr) => {{
                #[allow(unused_imports)]
                use $crate::math::*;
                match $d op {
                    $( $crate::ir::BinaryOp::$V => $crate::ir::op_arm!($f, $d f, $d body, $d other), )*
                }
            }};
        }
        pub(crate) use binary_f32;

        /// Expands `$body` with `$f` bound to the integer meaning of binary op `$op` for element type
        /// `$T` (an `IntOps` type; `$other` for float-only ops).
        macro_rules! binary_int {
            ($d op:expr, $d T:ty, $d f:ident => $d body:expr, else $d other:expr) => {{
                #[allow(unused_imports)]
                use $crate::math::IntOps;
                match $d op {
                    $( $crate::ir::BinaryOp::$V => $crate::ir::int_arm!($i, $d T, $d f, $d body, $d other), )*
                }
            }};
        }
        pub(crate) use binary_int;
    };
}

binary_table! { $
    Add { operands: Numeric, float: Some("arith.addf"), signed: Some("arith.addi"),
          unsigned: Some("arith.addi"), f32: (|x: f32, y: f32| x + y), int: wadd }
    Sub { operands: Numeric, float: Some("arith.subf"), signed: Some("arith.subi"),
          unsigned: Some("arith.subi"), f32: (|x: f32, y: f32| x - y), int: wsub }
    Mul { operands: Numeric, float: Some("arith.mulf"), signed: Some("arith.muli"),
          unsigned: Some("arith.muli"), f32: (|x: f32, y: f32| x * y), int: wmul }
    /// Integer division truncates; by zero gives -1 (all ones), as XLA.
    Div { operands: Numeric, float: Some("arith.divf"), signed: Some("arith.divsi"),
          unsigned: Some("arith.divui"), f32: (|x: f32, y: f32| x / y), int: xdiv }
    /// The remainder takes the dividend's sign; by zero gives the dividend, as XLA.
    Rem { operands: Numeric, float: Some("arith.remf"), signed: Some("arith.remsi"),
          unsigned: Some("arith.remui"), f32: Rem, int: xrem }
    /// NaN-propagating for floats (`jnp.maximum`).
    Max { operands: Numeric, float: Some("arith.maximumf"), signed: Some("arith.maxsi"),
          unsigned: Some("arith.maxui"), f32: max_f32, int: imax }
    Min { operands: Numeric, float: Some("arith.minimumf"), signed: Some("arith.minsi"),
          unsigned: Some("arith.minui"), f32: min_f32, int: imin }
    Pow { operands: Float, float: Some("math.powf"), signed: None, unsigned: None,
          f32: Pow, int: none }
    And { operands: IntOrBool, float: None, signed: Some("arith.andi"), unsigned: Some("arith.andi"),
          f32: none, int: and }
    Or { operands: IntOrBool, float: None, signed: Some("arith.ori"), unsigned: Some("arith.ori"),
         f32: none, int: or }
    Xor { operands: IntOrBool, float: None, signed: Some("arith.xori"), unsigned: Some("arith.xori"),
          f32: none, int: xor }
    /// `x << n`; a shift by the bit width or more gives 0 (XLA's `shift_left`).
    Shl { operands: Int, float: None, signed: Some("arith.shli"), unsigned: Some("arith.shli"),
          f32: none, int: shl }
    /// `x >> n`: arithmetic for signed, logical for unsigned types; a shift by the bit width or more
    /// gives the sign fill (signed) or 0 (unsigned), as XLA's `shift_right_*`.
    Shr { operands: Int, float: None, signed: Some("arith.shrsi"), unsigned: Some("arith.shrui"),
          f32: none, int: shr }
}

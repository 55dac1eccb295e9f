//! The op definitions: what each elementwise op of tpu-kernel **is** — its name, its traced method (if
//! any) and the dtypes it takes — and nothing about what any consumer does with it.
//!
//! One row per op, in [`for_each_unary!`] and [`for_each_binary!`]. From the rows come the [`UnaryOp`] /
//! [`BinaryOp`] enums and their names here, and the traced methods and free functions in
//! `kernel-runtime`'s `trace/` (which calls the same macros with its own callbacks).
//!
//! Architecture invariant: this crate has no dependencies and names no consumer. Each consumer owns
//! its column as an exhaustive `match` on these enums — the Mosaic op in `kernel-runtime/src/lower/
//! rules/elementwise.rs`, the CPU meaning in `kernel-runtime/src/interpret/ops.rs` — so a new row is a
//! compile error (E0004) at every consumer until it says what the op means there
//! (`tests/architecture.rs` adds a row behind the `__probe_new_row` feature and checks exactly that).
//!
//! An op that is a composition of table ops on TPU (`expm1`, `sign`) is a row of [`for_each_composite!`]:
//! traced as one op, expanded for the launch's target before either engine sees it (its one column, the
//! recipes in `kernel-runtime/src/expand.rs`). Sugar that is one table op or a fixed pair (`sigmoid` is
//! `logistic`, `clamp` is `max` then `min`, `isnan` is `x != x`) stays sugar in `trace/`.

#![no_std]

/// The dtypes an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operands {
    /// Floats (f32, bf16).
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

/// The classes of element type an op's operand class is defined over (a consumer maps its dtypes
/// onto them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementClass {
    Float,
    SignedInt,
    UnsignedInt,
    Bool,
}

impl Operands {
    /// Whether the op takes elements of class `c`.
    pub const fn accepts_class(self, c: ElementClass) -> bool {
        use ElementClass as C;
        match self {
            Operands::Float => matches!(c, C::Float),
            Operands::Signed => matches!(c, C::Float | C::SignedInt),
            Operands::Numeric => !matches!(c, C::Bool),
            Operands::Int => matches!(c, C::SignedInt | C::UnsignedInt),
            Operands::IntOrBool => !matches!(c, C::Float),
        }
    }
    /// Whether the op has a float meaning.
    pub const fn has_float(self) -> bool {
        matches!(self, Operands::Float | Operands::Signed | Operands::Numeric)
    }
}

/// Calls `$m! { (Variant, "name", method, Operands, [docs]) ... }` with every unary row (`-` as the
/// method of an operator-only op: `-x`, `!x`). **The unary op table.**
#[macro_export]
macro_rules! for_each_unary {
    ($m:ident) => {
        $crate::__with_probe_row! { $m;
            (Neg, "neg", -, Signed, [" Elementwise negation (`-x`)."])
            (Not, "not", -, IntOrBool, [" Bitwise / logical not (`!x`)."])
            (Exp, "exp", exp, Float, [" Elementwise `e^x`."])
            (Log, "log", log, Float, [" Elementwise natural logarithm."])
            (Tanh, "tanh", tanh, Float, [" Elementwise hyperbolic tangent."])
            (Rsqrt, "rsqrt", rsqrt, Float, [" Elementwise `1/sqrt(x)`."])
            (Sqrt, "sqrt", sqrt, Float, [" Elementwise square root."])
            (Abs, "abs", abs, Signed, [" Elementwise absolute value."])
            (Sin, "sin", sin, Float, [" Elementwise sine."])
            (Cos, "cos", cos, Float, [" Elementwise cosine."])
            (Erf, "erf", erf, Float, [" Elementwise error function (`jax.lax.erf`)."])
            (Log1p, "log1p", log1p, Float, [" Elementwise `ln(1 + x)`, accurate near 0."])
            (Logistic, "logistic", logistic, Float, [
                " Elementwise `1 / (1 + e^-x)` (`jax.nn.sigmoid`, `lax.logistic`)."
            ])
            (Floor, "floor", floor, Float, [" Elementwise floor."])
            (Ceil, "ceil", ceil, Float, [" Elementwise ceiling."])
            (Round, "round", round, Float, [
                " Elementwise rounding, half to even (`jnp.round`, `lax.round(.., TO_NEAREST_EVEN)`)."
            ])
        }
    };
}

/// Calls `$m! { (Variant, "name", Operands, [docs]) ... }` with every binary row. **The binary op
/// table.**
#[macro_export]
macro_rules! for_each_binary {
    ($m:ident) => {
        $m! {
            (Add, "add", Numeric, [])
            (Sub, "sub", Numeric, [])
            (Mul, "mul", Numeric, [])
            (Div, "div", Numeric, [
                " Integer division truncates; by zero gives -1 (all ones), as XLA."
            ])
            (Rem, "rem", Numeric, [
                " The remainder takes the dividend's sign; by zero gives the dividend, as XLA."
            ])
            (Max, "max", Numeric, [" NaN-propagating for floats (`jnp.maximum`)."])
            (Min, "min", Numeric, [])
            (Pow, "pow", Float, [])
            (And, "and", IntOrBool, [])
            (Or, "or", IntOrBool, [])
            (Xor, "xor", IntOrBool, [])
            (Shl, "shl", Int, [
                " `x << n`; a shift by the bit width or more gives 0 (XLA's `shift_left`)."
            ])
            (Shr, "shr", Int, [
                " `x >> n`: arithmetic for signed, logical for unsigned types; a shift by the bit width or",
                " more gives the sign fill (signed) or 0 (unsigned), as XLA's `shift_right_*`."
            ])
        }
    };
}

/// Calls `$m! { (Variant, "name", method, Operands, [docs]) ... }` with every composite row: a unary op
/// with a traced method whose meaning on TPU is a composition of table ops, chosen per target when the
/// kernel is built (`kernel-runtime`'s `expand`). **The composite op table.**
#[macro_export]
macro_rules! for_each_composite {
    ($m:ident) => {
        $m! {
            (Expm1, "expm1", expm1, Float, [
                " `e^x - 1`, accurate near 0 (`jnp.expm1`). libtpu cannot legalize `math.expm1` (and",
                " Pallas has no TPU lowering for it): Kahan's formulation on `exp` and `log`."
            ])
            (Sign, "sign", sign, Signed, [
                " `-1`, `0` or `1` by the sign of `x` (`jnp.sign`); `±0` and NaN give themselves."
            ])
        }
    };
}

/// The rows as given, or with the probe row (`Tan`) appended under the test-only `__probe_new_row`
/// feature.
#[doc(hidden)]
#[cfg(not(feature = "__probe_new_row"))]
#[macro_export]
macro_rules! __with_probe_row {
    ($m:ident; $($rows:tt)*) => { $m! { $($rows)* } };
}

#[doc(hidden)]
#[cfg(feature = "__probe_new_row")]
#[macro_export]
macro_rules! __with_probe_row {
    ($m:ident; $($rows:tt)*) => {
        $m! { $($rows)* (Tan, "tan", tan, Float, [" Elementwise tangent (the probe row)."]) }
    };
}

macro_rules! unary_enum {
    ($( ($V:ident, $name:literal, $method:tt, $ops:ident, [$($doc:literal),*]) )*) => {
        /// A unary elementwise op: one row of [`for_each_unary!`] each.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp { $( $(#[doc = $doc])* $V, )* }

        impl UnaryOp {
            /// Every unary op, in table order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$V),*];
            /// The printed name (`exp`, `neg`).
            pub const fn name(self) -> &'static str {
                match self { $(UnaryOp::$V => $name,)* }
            }
            /// The traced method (`x.exp()`), or `None` for an operator-only op (`-x`, `!x`).
            pub const fn method(self) -> Option<&'static str> {
                match self { $(UnaryOp::$V => method_str!($method),)* }
            }
            /// The dtypes the op takes.
            pub const fn operands(self) -> Operands {
                match self { $(UnaryOp::$V => Operands::$ops,)* }
            }
        }
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

macro_rules! binary_enum {
    ($( ($V:ident, $name:literal, $ops:ident, [$($doc:literal),*]) )*) => {
        /// A binary elementwise op: one row of [`for_each_binary!`] each.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp { $( $(#[doc = $doc])* $V, )* }

        impl BinaryOp {
            /// Every binary op, in table order.
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$V),*];
            /// The printed name (`add`).
            pub const fn name(self) -> &'static str {
                match self { $(BinaryOp::$V => $name,)* }
            }
            /// The dtypes the op takes.
            pub const fn operands(self) -> Operands {
                match self { $(BinaryOp::$V => Operands::$ops,)* }
            }
        }
    };
}

macro_rules! composite_enum {
    ($( ($V:ident, $name:literal, $method:ident, $ops:ident, [$($doc:literal),*]) )*) => {
        /// A composite op: one row of [`for_each_composite!`] each.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum CompositeOp { $( $(#[doc = $doc])* $V, )* }

        impl CompositeOp {
            /// Every composite op, in table order.
            pub const ALL: &'static [CompositeOp] = &[$(CompositeOp::$V),*];
            /// The printed name and traced method (`expm1`).
            pub const fn name(self) -> &'static str {
                match self { $(CompositeOp::$V => $name,)* }
            }
            /// The dtypes the op takes.
            pub const fn operands(self) -> Operands {
                match self { $(CompositeOp::$V => Operands::$ops,)* }
            }
        }
    };
}

for_each_unary!(unary_enum);
for_each_binary!(binary_enum);
for_each_composite!(composite_enum);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_methods() {
        assert_eq!(UnaryOp::Exp.name(), "exp");
        assert_eq!(UnaryOp::Exp.method(), Some("exp"));
        assert_eq!(UnaryOp::Neg.method(), None);
        assert_eq!(BinaryOp::Shr.name(), "shr");
        for u in UnaryOp::ALL {
            assert!(u.method().is_none_or(|m| m == u.name()), "{u:?}");
        }
    }

    #[test]
    fn operand_classes() {
        use ElementClass as C;
        assert!(
            Operands::Int.accepts_class(C::UnsignedInt) && !Operands::Int.accepts_class(C::Bool)
        );
        assert!(
            !Operands::Float.accepts_class(C::SignedInt)
                && Operands::Signed.accepts_class(C::SignedInt)
        );
        assert!(
            Operands::IntOrBool.accepts_class(C::Bool) && !Operands::Numeric.accepts_class(C::Bool)
        );
    }
}

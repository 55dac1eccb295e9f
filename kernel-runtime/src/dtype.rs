//! Element types a kernel can use, and the compile-time traits that say which operations each supports.

use half::bf16;
use std::fmt;

/// An element type as the IR sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    I32,
    I8,
    U8,
    U32,
    Bool,
}

pub use DType::{Bool as BOOL, BF16, F32, I32, I8, U32, U8};

impl DType {
    /// Size of one element in bytes, as stored in VMEM (bool is stored as 32-bit masks; counted as 4).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 | DType::Bool => 4,
            DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }
    pub fn bit_width(self) -> u32 {
        match self {
            DType::Bool => 1,
            d => 8 * d.size_bytes() as u32,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16)
    }
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I8 | DType::U8 | DType::U32)
    }
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U32)
    }
    /// The MLIR element type (Mosaic uses signless integers; signedness lives in the ops).
    pub fn mlir(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::I32 | DType::U32 => "i32",
            DType::I8 | DType::U8 => "i8",
            DType::Bool => "i1",
        }
    }
    /// The dtype called `name` (the spelling of [`DType::name`]: `f32`, `bf16`, `i32`, `i8`, `u8`, `u32`, `bool`).
    pub fn from_name(name: &str) -> Option<DType> {
        [
            DType::F32,
            DType::BF16,
            DType::I32,
            DType::I8,
            DType::U8,
            DType::U32,
            DType::Bool,
        ]
        .into_iter()
        .find(|d| d.name() == name)
    }
    /// The name users write (and error messages print).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A constant of some dtype, kept as its exact bit pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Literal {
    pub dtype: DType,
    pub bits: u64,
}

impl Literal {
    pub fn zero(dtype: DType) -> Self {
        Literal { dtype, bits: 0 }
    }
    pub fn from_f64(dtype: DType, v: f64) -> Self {
        let bits = match dtype {
            DType::F32 => (v as f32).to_bits() as u64,
            DType::BF16 => bf16::from_f64(v).to_bits() as u64,
            DType::Bool => (v != 0.0) as u64,
            DType::I32 => (v as i32) as u32 as u64,
            DType::U32 => (v as u32) as u64,
            DType::I8 => (v as i8) as u8 as u64,
            DType::U8 => (v as u8) as u64,
        };
        Literal { dtype, bits }
    }
    pub fn from_i64(dtype: DType, v: i64) -> Self {
        if dtype.is_float() {
            return Self::from_f64(dtype, v as f64);
        }
        let mask = if dtype.bit_width() >= 64 {
            u64::MAX
        } else {
            (1u64 << dtype.bit_width()) - 1
        };
        Literal {
            dtype,
            bits: (v as u64) & mask,
        }
    }
    /// The same value as a constant of `dtype` (float literals convert by value, integers by value with
    /// wraparound).
    pub fn convert(self, dtype: DType) -> Self {
        if self.dtype == dtype {
            self
        } else if self.dtype.is_float() {
            Literal::from_f64(dtype, self.as_f64())
        } else {
            Literal::from_i64(dtype, self.as_i64())
        }
    }
    /// The value as f64 (exact for every supported dtype).
    pub fn as_f64(self) -> f64 {
        match self.dtype {
            DType::F32 => f32::from_bits(self.bits as u32) as f64,
            DType::BF16 => bf16::from_bits(self.bits as u16).to_f64(),
            DType::Bool => self.bits as f64,
            DType::I32 => self.bits as u32 as i32 as f64,
            DType::U32 => self.bits as u32 as f64,
            DType::I8 => self.bits as u8 as i8 as f64,
            DType::U8 => self.bits as u8 as f64,
        }
    }
    /// The value as i64 for integer and bool dtypes (signed per dtype).
    pub fn as_i64(self) -> i64 {
        match self.dtype {
            DType::I32 => self.bits as u32 as i32 as i64,
            DType::I8 => self.bits as u8 as i8 as i64,
            DType::U32 | DType::U8 | DType::Bool => self.bits as i64,
            DType::F32 | DType::BF16 => self.as_f64() as i64,
        }
    }
    /// MLIR literal text: floats as exact hex bit patterns, integers in decimal.
    pub fn mlir(self) -> String {
        match self.dtype {
            DType::F32 => format!("0x{:08X}", self.bits as u32),
            DType::BF16 => format!("0x{:04X}", self.bits as u16),
            DType::Bool => if self.bits != 0 { "true" } else { "false" }.to_string(),
            _ => self.as_i64().to_string(),
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dtype.is_float() {
            write!(f, "{:?}", self.as_f64())
        } else {
            write!(f, "{}", self.as_i64())
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be the element type of a kernel array or ref.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel element type",
    label = "not a kernel element type",
    note = "kernel element types are f32, bf16, i32, i8, u8, u32 and bool"
)]
pub trait Element: Copy + 'static + sealed::Sealed {
    const DTYPE: DType;
    fn literal(self) -> Literal;
}

/// Element types with arithmetic (`+ - * / %`, min/max, comparisons, reductions).
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no arithmetic in kernels",
    note = "arithmetic is defined for f32, bf16, i32, i8, u8 and u32; cast bool masks first (`.cast::<i32>()`) or use `select`"
)]
pub trait Numeric: Element {}

/// Floating-point element types: transcendental math (exp, log, tanh, rsqrt, sqrt).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a float type; this operation needs f32 or bf16",
    note = "cast first, e.g. `x.cast::<f32>()`"
)]
pub trait Float: Numeric {}

/// Signed element types (negation).
#[diagnostic::on_unimplemented(message = "`{Self}` is unsigned or bool and cannot be negated")]
pub trait Signed: Numeric {}

/// Integer element types (bitwise ops).
#[diagnostic::on_unimplemented(message = "`{Self}` is not an integer type")]
pub trait Integer: Numeric {}

/// Element types `dot` accepts, with the type it accumulates in (f32 for floats, i32 for i8).
#[diagnostic::on_unimplemented(
    message = "`dot` is not defined for `{Self}`",
    note = "the MXU multiplies bf16, f32 (accumulating in f32) and i8 (accumulating in i32)"
)]
pub trait DotElement: Element {
    type Acc: Numeric;
}

macro_rules! element {
    ($t:ty, $d:expr, |$v:ident| $bits:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            fn literal(self) -> Literal {
                let $v = self;
                Literal {
                    dtype: $d,
                    bits: $bits,
                }
            }
        }
    };
}
element!(f32, DType::F32, |v| v.to_bits() as u64);
element!(bf16, DType::BF16, |v| v.to_bits() as u64);
element!(i32, DType::I32, |v| v as u32 as u64);
element!(i8, DType::I8, |v| v as u8 as u64);
element!(u8, DType::U8, |v| v as u64);
element!(u32, DType::U32, |v| v as u64);
element!(bool, DType::Bool, |v| v as u64);

impl Numeric for f32 {}
impl Numeric for bf16 {}
impl Numeric for i32 {}
impl Numeric for i8 {}
impl Numeric for u8 {}
impl Numeric for u32 {}
impl Float for f32 {}
impl Float for bf16 {}
impl Signed for f32 {}
impl Signed for bf16 {}
impl Signed for i32 {}
impl Signed for i8 {}
impl Integer for i32 {}
impl Integer for i8 {}
impl Integer for u8 {}
impl Integer for u32 {}
impl DotElement for f32 {
    type Acc = f32;
}
impl DotElement for bf16 {
    type Acc = f32;
}
impl DotElement for i8 {
    type Acc = i32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_round_trips() {
        assert_eq!(Literal::from_f64(F32, -1.5).as_f64(), -1.5);
        assert_eq!(
            Literal::from_f64(F32, f64::NEG_INFINITY).mlir(),
            "0xFF800000"
        );
        assert_eq!(Literal::from_i64(I8, -1).bits, 0xFF);
        assert_eq!(Literal::from_i64(I8, -1).as_i64(), -1);
        assert_eq!(Literal::from_f64(BF16, 1.0).mlir(), "0x3F80");
        assert_eq!(2.5f32.literal().as_f64(), 2.5);
    }
}

//! Element types a kernel can use, and the compile-time traits that say which operations each supports.

mod float8;
pub mod int4;

pub use float8::{f8e4m3fn, f8e5m2};
use half::{bf16, f16};
pub use int4::i4;
use std::fmt;

/// Calls `$m! { (Variant, name, RustType, mlir, stablehlo, numpy, torch, xla_ffi, bits, vmem_bytes,
/// Class, Ops) ... }` with every row. **The dtype table**: one row per element type —
/// - `name`: what users write and messages print, and the ABI's name (`f32`);
/// - `RustType`: the host element type (`HostData`, `HostElement`);
/// - `mlir`: the element type inside a Mosaic kernel (signless integers: signedness lives in the ops);
/// - `stablehlo`: the element type of an array crossing the kernel boundary (unsigned stays unsigned);
/// - `numpy` / `torch`: the dtype names of the Python side (`bfloat16` is ml_dtypes' / torch's; int4
///   crosses torch as int8 tensors of -8..7, torchax's mapping of jax's int4);
/// - `xla_ffi`: XLA's `XLA_FFI_DataType` code (= `PrimitiveType`: PRED 1, S8 2, S32 4, U8 6, U32 8,
///   F16 10, F32 11, BF16 16, F8E5M2 19, F8E4M3FN 20, S4 21);
/// - `bits`: the element's bit width (bool: 1); `vmem_bytes`: its size in bytes on the host and as the
///   VMEM estimate counts it (bool is stored as 32-bit masks: 4; int4 is one byte on the host — see
///   `dtype/int4.rs` — and packed eight to a 32-bit word in VMEM: [`DType::vmem_bits`]);
/// - `Class`: `Float`, `SignedInt`, `UnsignedInt` or `Bool`;
/// - `Ops`: `Arith` (the op table's ops of its class) or `Storage` (loads, stores, casts, and `dot`
///   where the target's `matmul_dtypes` has it: the narrow floats and int4, whose arithmetic no TPU's
///   VPU does — a kernel casts them to f32/bf16/i32 first). Which generations compile a storage dtype at all
///   is the target table's (`TargetInfo::storage_dtypes`).
#[macro_export]
macro_rules! for_each_dtype {
    ($m:ident) => {
        $m! {
            (F32, "f32", f32, "f32", "f32", "float32", "float32", 11, 32, 4, Float, Arith)
            (BF16, "bf16", half::bf16, "bf16", "bf16", "bfloat16", "bfloat16", 16, 16, 2, Float, Arith)
            (I32, "i32", i32, "i32", "i32", "int32", "int32", 4, 32, 4, SignedInt, Arith)
            (I8, "i8", i8, "i8", "i8", "int8", "int8", 2, 8, 1, SignedInt, Arith)
            (U8, "u8", u8, "i8", "ui8", "uint8", "uint8", 6, 8, 1, UnsignedInt, Arith)
            (U32, "u32", u32, "i32", "ui32", "uint32", "uint32", 8, 32, 4, UnsignedInt, Arith)
            (Bool, "bool", bool, "i1", "i1", "bool", "bool", 1, 1, 4, Bool, Arith)
            (F16, "f16", half::f16, "f16", "f16", "float16", "float16", 10, 16, 2, Float, Storage)
            (F8E4M3FN, "float8_e4m3fn", $crate::dtype::f8e4m3fn, "f8E4M3FN", "f8E4M3FN",
                "float8_e4m3fn", "float8_e4m3fn", 20, 8, 1, Float, Storage)
            (F8E5M2, "float8_e5m2", $crate::dtype::f8e5m2, "f8E5M2", "f8E5M2",
                "float8_e5m2", "float8_e5m2", 19, 8, 1, Float, Storage)
            (I4, "int4", $crate::dtype::i4, "i4", "i4", "int4", "int8", 21, 4, 1, SignedInt, Storage)
        }
    };
}
pub use for_each_dtype;

/// The class of a dtype (a column of the dtype table): the op definitions' element classes, so an
/// op's operand check reads it directly.
pub use kernel_ops::ElementClass as DTypeClass;

/// What kernels may do with a dtype's values (a column of the dtype table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DTypeOps {
    /// The op table's ops of the dtype's class.
    Arith,
    /// Loads, stores, casts, and `dot` where the target's MXU takes it; no elementwise arithmetic,
    /// comparisons or reductions (cast to f32/bf16 first).
    Storage,
}

macro_rules! dtype_enum {
    ($( ($V:ident, $name:literal, $rust:ty, $mlir:literal, $shlo:literal, $numpy:literal,
         $torch:literal, $ffi:literal, $bits:literal, $vmem:literal, $class:ident,
         $ops:ident) )*) => {
        /// An element type as the IR sees it: one row of [`for_each_dtype!`] each.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum DType { $( $V, )* }

        impl DType {
            /// Every dtype, in table order.
            pub const ALL: &'static [DType] = &[$(DType::$V),*];
            /// The name users write (and error messages print): `f32`, `bf16`, ...
            pub const fn name(self) -> &'static str {
                match self { $(DType::$V => $name,)* }
            }
            /// The MLIR element type inside a kernel (Mosaic uses signless integers; signedness
            /// lives in the ops).
            pub const fn mlir(self) -> &'static str {
                match self { $(DType::$V => $mlir,)* }
            }
            /// The StableHLO element type of an array crossing the kernel boundary.
            pub const fn stablehlo(self) -> &'static str {
                match self { $(DType::$V => $shlo,)* }
            }
            /// The numpy / jax dtype name.
            pub const fn numpy_name(self) -> &'static str {
                match self { $(DType::$V => $numpy,)* }
            }
            /// The torch dtype name (`torch.<name>`).
            pub const fn torch_name(self) -> &'static str {
                match self { $(DType::$V => $torch,)* }
            }
            /// XLA's `XLA_FFI_DataType` code.
            pub const fn xla_ffi_code(self) -> u32 {
                match self { $(DType::$V => $ffi,)* }
            }
            /// The dtype of XLA's `XLA_FFI_DataType` code, if a kernel can take it.
            pub const fn from_xla_ffi_code(code: u32) -> Option<DType> {
                match code { $($ffi => Some(DType::$V),)* _ => None }
            }
            /// The element's bit width (bool: 1).
            pub const fn bit_width(self) -> u32 {
                match self { $(DType::$V => $bits,)* }
            }
            /// Size of one element in bytes, as stored in VMEM (bool is stored as 32-bit masks;
            /// counted as 4).
            pub const fn size_bytes(self) -> usize {
                match self { $(DType::$V => $vmem,)* }
            }
            /// The dtype's class.
            pub const fn class(self) -> DTypeClass {
                match self { $(DType::$V => DTypeClass::$class,)* }
            }
            /// What kernels may do with its values.
            pub const fn ops(self) -> DTypeOps {
                match self { $(DType::$V => DTypeOps::$ops,)* }
            }
        }
    };
}
for_each_dtype!(dtype_enum);

pub use DType::{Bool as BOOL, BF16, F16, F32, F8E4M3FN, F8E5M2, I32, I4, I8, U32, U8};

impl DType {
    pub const fn is_float(self) -> bool {
        matches!(self.class(), DTypeClass::Float)
    }
    pub const fn is_int(self) -> bool {
        matches!(
            self.class(),
            DTypeClass::SignedInt | DTypeClass::UnsignedInt
        )
    }
    pub const fn is_unsigned(self) -> bool {
        matches!(self.class(), DTypeClass::UnsignedInt)
    }
    /// Bits one element takes in VMEM: bool masks 32, int4 4 (packed), the others their width.
    pub const fn vmem_bits(self) -> u32 {
        match self.class() {
            DTypeClass::Bool => 32,
            _ => self.bit_width(),
        }
    }
    /// Elements per 32-bit VMEM word (f32 1, bf16 2, i8 4, int4 8): the factor Mosaic's tiles of
    /// packed types grow by.
    pub const fn packing(self) -> usize {
        (32 / self.vmem_bits()) as usize
    }
    /// The dtype called `name` (the spelling of [`DType::name`]: `f32`, `bf16`, `i32`, `i8`, `u8`,
    /// `u32`, `bool`).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == name)
    }
    /// The table as JSON rows (what a kernel library publishes, so the Python side reads its dtype map
    /// from the library instead of keeping its own).
    pub fn table_json() -> serde_json::Value {
        serde_json::Value::Array(
            DType::ALL
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "name": d.name(),
                        "numpy": d.numpy_name(),
                        "torch": d.torch_name(),
                        "xla_ffi": d.xla_ffi_code(),
                        "bits": d.bit_width(),
                    })
                })
                .collect(),
        )
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
            DType::F16 => f16::from_f64(v).to_bits() as u64,
            DType::F8E4M3FN => f8e4m3fn::from_f64(v).to_bits() as u64,
            DType::F8E5M2 => f8e5m2::from_f64(v).to_bits() as u64,
            DType::I4 => i4::saturating_from_f64(v).to_bits() as u64,
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
            DType::F16 => f16::from_bits(self.bits as u16).to_f64(),
            DType::F8E4M3FN => f8e4m3fn::from_bits(self.bits as u8).to_f64(),
            DType::F8E5M2 => f8e5m2::from_bits(self.bits as u8).to_f64(),
            DType::I4 => i4::from_bits(self.bits as u8).to_f64(),
        }
    }
    /// The value as i64 for integer and bool dtypes (signed per dtype).
    pub fn as_i64(self) -> i64 {
        match self.dtype {
            DType::I32 => self.bits as u32 as i32 as i64,
            DType::I8 => self.bits as u8 as i8 as i64,
            DType::I4 => i4::from_bits(self.bits as u8).get() as i64,
            DType::U32 | DType::U8 | DType::Bool => self.bits as i64,
            DType::F32 | DType::BF16 | DType::F16 | DType::F8E4M3FN | DType::F8E5M2 => {
                self.as_f64() as i64
            }
        }
    }
    /// MLIR literal text: floats as exact hex bit patterns, integers in decimal.
    pub fn mlir(self) -> String {
        match self.dtype {
            DType::F32 => format!("0x{:08X}", self.bits as u32),
            DType::BF16 | DType::F16 => format!("0x{:04X}", self.bits as u16),
            DType::F8E4M3FN | DType::F8E5M2 => format!("0x{:02X}", self.bits as u8),
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
    note = "kernel element types are f32, bf16, f16, f8e4m3fn, f8e5m2, i32, i8, i4, u8, u32 and bool"
)]
pub trait Element: Copy + 'static + sealed::Sealed {
    const DTYPE: DType;
    fn literal(self) -> Literal;
    /// The element whose bit pattern is `bits` (a [`Literal`]'s; bool: nonzero).
    fn from_literal_bits(bits: u64) -> Self;
}

/// Element types with arithmetic (`+ - * / %`, min/max, comparisons, reductions).
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no arithmetic in kernels",
    note = "arithmetic is defined for f32, bf16, i32, i8, u8 and u32; cast bool masks and the storage dtypes (f8e4m3fn, f8e5m2, i4) first (`.cast::<i32>()`, `.cast::<f32>()`) or use `select`"
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
    note = "the MXU multiplies bf16, f32, f8e4m3fn and f8e5m2 (accumulating in f32) and i8 and i4 (accumulating in i32)"
)]
pub trait DotElement: Element {
    type Acc: Numeric;
}

macro_rules! element {
    ($t:ty, $d:expr, |$v:ident| $bits:expr, |$b:ident| $from:expr) => {
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
            #[inline]
            fn from_literal_bits($b: u64) -> Self {
                $from
            }
        }
    };
}
element!(f32, DType::F32, |v| v.to_bits() as u64, |b| f32::from_bits(
    b as u32
));
element!(bf16, DType::BF16, |v| v.to_bits() as u64, |b| {
    bf16::from_bits(b as u16)
});
element!(i32, DType::I32, |v| v as u32 as u64, |b| b as u32 as i32);
element!(i8, DType::I8, |v| v as u8 as u64, |b| b as u8 as i8);
element!(u8, DType::U8, |v| v as u64, |b| b as u8);
element!(u32, DType::U32, |v| v as u64, |b| b as u32);
element!(bool, DType::Bool, |v| v as u64, |b| b != 0);
// The narrow floats are storage types: loads, stores, casts, `dot` where the target's MXU takes them;
// arithmetic needs a cast to f32/bf16 first (not `Numeric`: a type error at the user's token).
element!(f16, DType::F16, |v| v.to_bits() as u64, |b| f16::from_bits(
    b as u16
));
element!(f8e4m3fn, DType::F8E4M3FN, |v| v.to_bits() as u64, |b| {
    f8e4m3fn::from_bits(b as u8)
});
element!(f8e5m2, DType::F8E5M2, |v| v.to_bits() as u64, |b| {
    f8e5m2::from_bits(b as u8)
});
// int4 is a storage type too (libtpu: "Only vector<i16> and vector<i32> are supported, but got
// 'i4'"): cast to i32 (or a float) to compute.
element!(i4, DType::I4, |v| v.to_bits() as u64, |b| i4::from_bits(
    b as u8
));

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
impl DotElement for f8e4m3fn {
    type Acc = f32;
}
impl DotElement for f8e5m2 {
    type Acc = f32;
}
impl DotElement for i4 {
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

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn the_table_round_trips_its_columns() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(*d));
            assert_eq!(DType::from_xla_ffi_code(d.xla_ffi_code()), Some(*d));
            assert!(d.bit_width() <= 8 * d.size_bytes() as u32);
            assert_eq!(d.is_int(), d.mlir().starts_with('i') && *d != DType::Bool);
        }
        assert_eq!(DType::from_xla_ffi_code(10), Some(F16));
        assert_eq!(DType::from_xla_ffi_code(20), Some(F8E4M3FN));
        assert_eq!(DType::from_xla_ffi_code(19), Some(F8E5M2));
        assert_eq!(DType::from_xla_ffi_code(21), Some(I4));
        assert_eq!(I4.packing(), 8);
        assert_eq!(
            (F32.packing(), BF16.packing(), I8.packing(), BOOL.packing()),
            (1, 2, 4, 1)
        );
        let json = DType::table_json();
        assert_eq!(json.as_array().map(Vec::len), Some(DType::ALL.len()));
        assert_eq!(json[1]["numpy"], "bfloat16");
    }
}

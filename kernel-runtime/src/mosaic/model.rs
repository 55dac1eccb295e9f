//! The Mosaic module as plain data: what the lowering rules produce, before any MLIR exists.
//!
//! Its writers read it: [`super::bytecode`] writes it straight to the MLIR bytecode libtpu reads (the
//! shipping path, no MLIR involved), and with the `mlir` feature `super::mlir` turns it into a melior
//! module and verifies it (the text `--emit mlir` prints, and the check the test suite runs on every
//! kernel). Ops, types and attributes are MLIR's textual syntax, so every writer means exactly the same
//! module.

use crate::error::SourceLoc;
use std::rc::Rc;

/// A value of the module: numbered in definition order within its function.
pub type MValue = u32;

/// A memref dimension known only at run time (MLIR's `?`, `ShapedType::kDynamic` in bytecode).
pub const DYNAMIC: usize = usize::MAX;

/// A memref dimension as MLIR stores it: [`DYNAMIC`] is `i64::MIN` (`ShapedType::kDynamic`).
pub fn dim_i64(d: usize) -> i64 {
    match d {
        DYNAMIC => i64::MIN,
        d => d as i64,
    }
}

/// A type. Builtin types without a dialect attribute are kept as MLIR text; a memref carries its parts,
/// because its memory space is a `tpu` attribute, which a context without the `tpu` dialect (ours) can
/// build but not parse inside a type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MType {
    /// `i32`, `f32`, `index`, `vector<8x128xf32>`, ... (shared: a function repeats few types)
    Plain(Rc<str>),
    /// `memref<{shape}x{elem}, {space}>`: element type text, memory-space attribute text.
    MemRef {
        shape: Vec<usize>,
        elem: &'static str,
        space: &'static str,
    },
}

impl MType {
    pub fn index() -> Self {
        MType::Plain(Rc::from("index"))
    }
}

impl std::fmt::Display for MType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MType::Plain(t) => f.write_str(t),
            MType::MemRef { shape, elem, space } => {
                f.write_str("memref<")?;
                for &d in shape {
                    match d {
                        DYNAMIC => f.write_str("?x")?,
                        d => write!(f, "{d}x")?,
                    }
                }
                write!(f, "{elem}, {space}>")
            }
        }
    }
}

/// `module @name attributes {stable_mosaic.version = ..}` holding `func.func` ops.
#[derive(Clone, Debug)]
pub struct MModule {
    pub name: String,
    pub loc: SourceLoc,
    /// The `stable_mosaic.version` the module is written at.
    pub version: i64,
    /// The kernel function, then one `transform_k` per BlockSpec index map.
    pub funcs: Vec<MFunc>,
}

/// A `func.func`: its body block's arguments are its parameters.
#[derive(Clone, Debug)]
pub struct MFunc {
    pub name: String,
    pub loc: SourceLoc,
    /// `function_type`: parameter and result types.
    pub inputs: Vec<MType>,
    pub results: Vec<MType>,
    /// Attributes besides `sym_name` and `function_type` (the Mosaic kernel attributes).
    pub attrs: Vec<(&'static str, String)>,
    pub body: MBlock,
    /// Number of values defined in the function (block arguments and op results, nested ones too).
    pub num_values: u32,
}

/// One operation in MLIR's generic form.
#[derive(Clone, Debug)]
pub struct MOp {
    pub name: &'static str,
    pub loc: SourceLoc,
    pub operands: Vec<MValue>,
    /// Results and their types.
    pub results: Vec<(MValue, MType)>,
    /// Attributes: name and MLIR attribute text.
    pub attrs: Vec<(&'static str, String)>,
    /// Regions: `None` is an empty region.
    pub regions: Vec<Option<MBlock>>,
}

/// A block: arguments (value, type; located at `arg_loc`) and ops.
#[derive(Clone, Debug, Default)]
pub struct MBlock {
    pub args: Vec<(MValue, MType)>,
    pub arg_loc: Option<SourceLoc>,
    pub ops: Vec<MOp>,
}

impl MBlock {
    /// Values defined directly in this block (its arguments and its ops' results), not in nested regions.
    pub fn num_defined(&self) -> usize {
        self.args.len() + self.ops.iter().map(|o| o.results.len()).sum::<usize>()
    }
}

impl MFunc {
    /// `function_type` as MLIR spells it.
    pub fn function_type(&self) -> String {
        let join = |ts: &[MType]| {
            ts.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("({}) -> ({})", join(&self.inputs), join(&self.results))
    }
}

//! How the rewritten module models the emitted one's values: its types ([`Ty`]: scalars stay scalars,
//! vector values and refs become flat row-major buffers, a semaphore an `i32` counter), its values
//! ([`Val`]) and ref windows ([`RefView`]), which ref a buffer is ([`RefId`], for error labels) and
//! where a ref lives ([`Space`]); and the mapping from an emitted MLIR type to these ([`map_type`],
//! [`ref_space`]), which refuses what the rewrite cannot model.
//!
//! May depend on: melior and mlir-sys (reading types), `crate::error`, the dtype table (bit widths);
//! nothing else of `mosaic_cpu`.

use crate::error::{kerr, Result};
use melior::ir::r#type::TypeLike;
use melior::ir::Type;

/// A type of the rewritten module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::mosaic_cpu) enum Ty {
    /// `i32`, `f32`, `bf16`, `i1`, `index`, ...
    Scalar(String),
    /// A vector value or a ref: a flat row-major buffer `memref<N x elem>` of this shape.
    Mem { shape: Vec<usize>, elem: String },
}

impl Ty {
    pub fn text(&self) -> String {
        match self {
            Ty::Scalar(t) => t.clone(),
            Ty::Mem { shape, elem } => {
                format!("memref<{}x{elem}>", shape.iter().product::<usize>())
            }
        }
    }
    /// The element type (the type itself for a scalar).
    pub fn elem(&self) -> &str {
        match self {
            Ty::Scalar(t) => t,
            Ty::Mem { elem, .. } => elem,
        }
    }
    pub fn shape(&self) -> Option<&[usize]> {
        match self {
            Ty::Scalar(_) => None,
            Ty::Mem { shape, .. } => Some(shape),
        }
    }
}

/// A rewritten function's argument and result types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::mosaic_cpu) struct Signature {
    pub args: Vec<Ty>,
    pub results: Vec<Ty>,
    /// Per argument: the memory space of a ref (`None` for scalars).
    pub spaces: Vec<Option<Space>>,
}

/// Where a ref lives, as its emitted type says (`#tpu.memory_space<...>`, and for semaphores their
/// kind). On the CPU every space is host memory; the driver checks each against the kernel's operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::mosaic_cpu) enum Space {
    Vmem,
    Smem,
    Any,
    Hbm,
    /// `semaphore_mem` refs of `!tpu.dma_semaphore`.
    DmaSemaphore,
    /// `semaphore_mem` refs of `!tpu.semaphore`.
    Semaphore,
}

impl Space {
    pub fn is_semaphore(self) -> bool {
        matches!(self, Space::DmaSemaphore | Space::Semaphore)
    }
}

/// Which ref a buffer is, for the labels of errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::mosaic_cpu) enum RefId {
    /// A ref argument of the function (its number after the grid indices): a kernel operand, or in an
    /// index map a scalar-prefetch operand.
    Operand(usize),
    /// Allocation `k` of its `run_scoped` scope (`tpu.region`), the interpreter's "scoped buffer k".
    Scoped(usize),
}

/// A window of a ref as a ref (what `tpu.memref_slice` and `tpu.memref_squeeze` make, DMA and
/// semaphore ops take): element `i` (an index per dim of `shape`) is element
/// `offset + Σ i_d · strides[d]` of the flat buffer `root` (a kernel argument or a scoped
/// allocation). A whole ref is the view at offset 0 with row-major strides.
#[derive(Clone, Debug)]
pub(in crate::mosaic_cpu) struct RefView {
    pub root: Val,
    /// The ref `root` is, for error labels.
    pub ref_id: Option<RefId>,
    /// An `index` value.
    pub offset: String,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    /// A bitcast view (`tpu.memref_bitcast`): `offset` and `strides` address its elements in the
    /// row-major order of [`Packed::shape`], whose elements are bits of [`Packed::base`]'s (read and
    /// written through `mosaic_cpu::views`).
    pub packed: Option<std::rc::Rc<Packed>>,
    /// Per dimension, the `index` value of a run-time size (`?` in the memref type; `shape` then holds
    /// the base's size, an upper bound); empty when every size is static.
    pub dynamic: Vec<Option<String>>,
}

impl RefView {
    /// The element type the view holds.
    pub fn elem(&self) -> &str {
        match &self.packed {
            Some(p) => &p.elem,
            None => self.root.ty.elem(),
        }
    }
}

/// The elements of a bitcast view: a row-major array of `shape` and element type `elem`
/// (`view_bits` wide) whose bits are those of `base`'s elements (`ref_bits` wide), rows packed or
/// unpacked along the second-to-last dimension.
#[derive(Clone, Debug)]
pub(in crate::mosaic_cpu) struct Packed {
    pub base: RefView,
    pub shape: Vec<usize>,
    pub elem: String,
    pub view_bits: usize,
    pub ref_bits: usize,
}

/// A value of the rewritten module: its SSA name and type.
#[derive(Clone, Debug)]
pub(in crate::mosaic_cpu) struct Val {
    pub name: String,
    pub ty: Ty,
}

impl Val {
    /// The `index` value named `name`.
    pub fn index(name: String) -> Val {
        Val {
            name,
            ty: Ty::Scalar("index".into()),
        }
    }
}

/// The bit width of an emitted element type (`f32`, `bf16`, `i8`, `f8E4M3FN`, ...): the dtype table's.
pub(in crate::mosaic_cpu) fn elem_bits(elem: &str) -> Option<u32> {
    crate::dtype::DType::ALL
        .iter()
        .find(|d| d.mlir() == elem)
        .map(|d| d.bit_width())
}

/// Whether an element type is a float (`f32`, `bf16`, ...).
pub(in crate::mosaic_cpu) fn is_float(elem: &str) -> bool {
    elem.starts_with('f') || elem == "bf16"
}

/// Row-major strides (in elements) of `shape`.
pub(in crate::mosaic_cpu) fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The static shape and element type of a shaped type (`vector`, `memref`).
fn static_shape(t: Type<'_>) -> Option<(Vec<usize>, String)> {
    let raw = t.to_raw();
    // SAFETY: `raw` is a live shaped type (checked by the callers with `is_vector`/`is_mem_ref`); the
    // element type returned is owned by the same context.
    unsafe {
        if !mlir_sys::mlirShapedTypeHasRank(raw) || !mlir_sys::mlirShapedTypeHasStaticShape(raw) {
            return None;
        }
        let rank = mlir_sys::mlirShapedTypeGetRank(raw);
        let shape = (0..rank)
            .map(|d| mlir_sys::mlirShapedTypeGetDimSize(raw, d as isize) as usize)
            .collect();
        let elem = Type::from_raw(mlir_sys::mlirShapedTypeGetElementType(raw));
        Some((shape, elem.to_string()))
    }
}

/// The dimensions of a memref type, `None` for a run-time (`?`) one.
pub(in crate::mosaic_cpu) fn memref_dims(t: Type<'_>) -> Option<Vec<Option<usize>>> {
    if !t.is_mem_ref() {
        return None;
    }
    let raw = t.to_raw();
    // SAFETY: `raw` is a live memref type (checked above).
    unsafe {
        if !mlir_sys::mlirShapedTypeHasRank(raw) {
            return None;
        }
        let rank = mlir_sys::mlirShapedTypeGetRank(raw);
        Some(
            (0..rank)
                .map(|d| {
                    let n = mlir_sys::mlirShapedTypeGetDimSize(raw, d as isize);
                    (!mlir_sys::mlirShapedTypeIsDynamicSize(n)).then_some(n as usize)
                })
                .collect(),
        )
    }
}

/// Memory spaces a ref may live in: on the CPU all are host memory (a semaphore an `i32` counter).
const MEMORY_SPACES: &[(&str, Space)] = &[
    ("#tpu.memory_space<vmem>", Space::Vmem),
    ("#tpu.memory_space<smem>", Space::Smem),
    ("#tpu.memory_space<any>", Space::Any),
    ("#tpu.memory_space<hbm>", Space::Hbm),
    ("#tpu.memory_space<semaphore_mem>", Space::Semaphore),
];

/// Semaphore element types (only in `semaphore_mem`, which holds nothing else).
const SEMAPHORES: &[(&str, Space)] = &[
    ("!tpu.dma_semaphore", Space::DmaSemaphore),
    ("!tpu.semaphore", Space::Semaphore),
];

/// The memory space of a memref type (`None` for other types and memrefs without one).
pub(in crate::mosaic_cpu) fn ref_space(t: Type<'_>) -> Result<Option<Space>> {
    if !t.is_mem_ref() {
        return Ok(None);
    }
    let Some(space) = melior::ir::r#type::MemRefType::try_from(t)
        .ok()
        .and_then(|m| m.memory_space())
        .map(|a| a.to_string())
    else {
        return Ok(None);
    };
    let Some(&(_, s)) = MEMORY_SPACES.iter().find(|(n, _)| *n == space) else {
        return Err(kerr!(
            Unsupported,
            "mosaic_cpu: refs in memory space {space} are not supported"
        ));
    };
    let elem = static_shape(t).map(|(_, e)| e).unwrap_or_default();
    let semaphore = SEMAPHORES.iter().find(|(n, _)| *n == elem).map(|(_, k)| *k);
    match (s, semaphore) {
        (Space::Semaphore, Some(kind)) => Ok(Some(kind)),
        (s, None) if !s.is_semaphore() => Ok(Some(s)),
        _ => Err(kerr!(
            Unsupported,
            "mosaic_cpu: a ref of {elem} in {space} (semaphores live in semaphore_mem, which holds only semaphores)"
        )),
    }
}

pub(in crate::mosaic_cpu) fn map_type(t: Type<'_>) -> Result<Ty> {
    if t.is_vector() || t.is_mem_ref() {
        let semaphore = ref_space(t)?.is_some_and(Space::is_semaphore);
        if t.is_mem_ref() {
            let m = melior::ir::r#type::MemRefType::try_from(t)
                .map_err(|_| kerr!(Lowering, "mosaic_cpu: bad memref type {t}"))?;
            let (strides, offset) = m.strides_and_offset();
            let (shape, _) = static_shape(t)
                .ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: dynamic shape in {t}"))?;
            let want = row_major(&shape);
            if offset != 0 || strides.iter().zip(&want).any(|(a, b)| *a != *b as i64) {
                return Err(kerr!(
                    Unsupported,
                    "mosaic_cpu: a ref with a non-identity layout ({t})"
                ));
            }
        }
        let (shape, elem) = static_shape(t)
            .ok_or_else(|| kerr!(Unsupported, "mosaic_cpu: dynamic shape in {t}"))?;
        // A semaphore is a counter: the interpreter's (and the hardware's) 32-bit value.
        let elem = if semaphore { "i32".to_string() } else { elem };
        return Ok(Ty::Mem { shape, elem });
    }
    if t.is_integer() || t.is_index() || t.is_float() {
        return Ok(Ty::Scalar(t.to_string()));
    }
    Err(kerr!(
        Unsupported,
        "mosaic_cpu: values of type {t} are not supported"
    ))
}

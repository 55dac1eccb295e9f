//! Kernel IR → the Mosaic module as data ([`crate::mosaic::MModule`]).
//!
//! The module has the shape Pallas gives it (see `tests/data/pallas/`): `module @name attributes
//! {stable_mosaic.version}`, the kernel `func.func` with arguments (grid i32s, inputs, outputs, scratch) and
//! the Mosaic func attributes, then one `func.func @transform_k` per BlockSpec index map. Ops are lowered by
//! small per-family rules in `rules`. Rust source locations become MLIR `FileLineColLoc`s.
//!
//! The kernel's TPU generation is `Kernel::target`: a rule whose Mosaic differs per generation matches
//! on it there (keyed by the target, as Pallas registers per-platform rules). None does today: traced
//! for v5e, v6e and tpu7x, Pallas emits the same module for every example (`python/tests/test_examples.py`).
//!
//! The rules build the module as data; its writers live in [`crate::mosaic`] (bytecode, and MLIR with
//! the `mlir` feature). Architecture invariant: lowering builds no MLIR and names no writer — it
//! depends on the model only, so every writer means the same module.

mod rules;

pub use rules::elementwise::{mosaic_binary, mosaic_unary_float, mosaic_unary_int, IntLowering};

use crate::error::{kerr, Result};
use crate::ir::{Func, Kernel, MemSpace, OperandRole, Region, Type, ValueId};
use crate::mosaic::serde::DEFAULT_VERSION;
use crate::mosaic::{MBlock, MFunc, MModule, MType, MValue};

/// Lower a kernel to the Mosaic module as data (no MLIR involved).
pub fn lower_module(k: &Kernel) -> Result<MModule> {
    let mut funcs = vec![lower_kernel_fn(k)?];
    // A launch without a grid has whole-array blocks and, as Pallas emits it, no index maps.
    for o in k.operands.iter().filter(|_| !k.grid.is_empty()) {
        if let Some(b) = &o.block {
            funcs.push(lower_func(&b.index_map, vec![], "#tpu.memory_space<any>")?);
        }
    }
    Ok(MModule {
        name: k.name.clone(),
        loc: k.body.loc,
        version: DEFAULT_VERSION,
        funcs,
    })
}

fn lower_kernel_fn(k: &Kernel) -> Result<MFunc> {
    let grid = k
        .grid
        .iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sem = k
        .dimension_semantics
        .iter()
        .map(|s| format!("#tpu.dimension_semantics<{}>", s.mosaic()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut windows = Vec::new();
    // Scalar-prefetch operands are not windowed: they precede the window params.
    for o in k
        .operands
        .iter()
        .skip(k.scalar_prefetch)
        .filter(|o| o.role != OperandRole::Scratch)
    {
        match &o.block {
            Some(b) => {
                let bounds = b
                    .block_shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let pipeline =
                    if b.index_map.is_constant_map() && k.grid.iter().product::<usize>() > 1 {
                        "pipeline_mode = #tpu.pipeline_mode<synchronous>, "
                    } else {
                        ""
                    };
                windows.push(format!(
                    "{{{pipeline}transform_indices = @{}, window_bounds = array<i64: {bounds}>}}",
                    b.index_map.name
                ));
            }
            None => windows.push("{}".into()),
        }
    }
    let n_scratch = k
        .operands
        .iter()
        .filter(|o| o.role == OperandRole::Scratch)
        .count();
    let mut attrs = vec![
        ("dimension_semantics", format!("[{sem}]")),
        ("iteration_bounds", format!("array<i64: {grid}>")),
        ("scalar_prefetch", format!("{} : i64", k.scalar_prefetch)),
        ("scratch_operands", format!("{n_scratch} : i64")),
        ("tpu.core_type", "#tpu.core_type<tc>".into()),
        ("window_params", format!("[{}]", windows.join(", "))),
    ];
    if k.grid.is_empty() {
        // Pallas's grid-free form: no iteration bounds and no windows (libtpu refuses window
        // attributes without explicit iteration bounds); `check` holds every block to its whole array.
        attrs.retain(|(name, _)| !matches!(*name, "iteration_bounds" | "window_params"));
    }
    let any_space = if k.any_in_hbm {
        "#tpu.memory_space<hbm>"
    } else {
        "#tpu.memory_space<any>"
    };
    lower_func(&k.body, attrs, any_space)
}

fn lower_func(
    f: &Func,
    attrs: Vec<(&'static str, String)>,
    any_space: &'static str,
) -> Result<MFunc> {
    let mut lw = Lowerer {
        func: f,
        values: vec![None; f.values.len()],
        next: 0,
        types: Default::default(),
        any_space,
    };
    let inputs: Vec<MType> = f
        .body
        .args
        .iter()
        .map(|a| lw.ty(f.ty(*a)))
        .collect::<Result<_>>()?;
    let results: Vec<MType> = f
        .result_types
        .iter()
        .map(|t| lw.ty(t))
        .collect::<Result<_>>()?;
    let body = lw.region(&f.body)?;
    Ok(MFunc {
        name: f.name.clone(),
        loc: f.loc,
        inputs,
        results,
        attrs,
        body,
        num_values: lw.next,
    })
}

/// Lowers the ops of one function; `values` maps IR values to Mosaic values.
pub(crate) struct Lowerer<'f> {
    pub func: &'f Func,
    values: Vec<Option<MValue>>,
    next: MValue,
    types: std::cell::RefCell<Vec<(Type, MType)>>,
    /// The memory space `Any` refs are written in: `any`, or `hbm` when the launch pins its whole-array
    /// operands to HBM (Pallas's `pltpu.HBM`).
    any_space: &'static str,
}

impl<'f> Lowerer<'f> {
    /// The Mosaic type of an IR type (spelled once per function).
    pub fn ty(&self, t: &Type) -> Result<MType> {
        let mut seen = self.types.borrow_mut();
        if let Some((_, m)) = seen.iter().find(|(k, _)| k == t) {
            return Ok(m.clone());
        }
        let m = Self::new_ty(t, self.any_space);
        seen.push((t.clone(), m.clone()));
        Ok(m)
    }

    fn new_ty(t: &Type, any_space: &'static str) -> MType {
        match t {
            Type::Scalar(d) => MType::Plain(d.mlir().into()),
            // A 0-d vector is its element type in our IR's convention (`vector_type_text`).
            Type::Vector(s, d) => MType::Plain(vector_type_text(s, d.mlir()).into()),
            Type::Ref(s, d, space) => MType::MemRef {
                // A run-time size is MLIR's `?` in both.
                shape: s
                    .iter()
                    .map(|&n| match n {
                        crate::ir::DYNAMIC => crate::mosaic::model::DYNAMIC,
                        n => n,
                    })
                    .collect(),
                elem: match space {
                    MemSpace::Sem(crate::ir::SemKind::Dma) => "!tpu.dma_semaphore",
                    MemSpace::Sem(crate::ir::SemKind::Regular) => "!tpu.semaphore",
                    _ => d.mlir(),
                },
                space: match space {
                    MemSpace::Vmem => "#tpu.memory_space<vmem>",
                    MemSpace::Smem => "#tpu.memory_space<smem>",
                    MemSpace::Any => any_space,
                    MemSpace::Sem(_) => "#tpu.memory_space<semaphore_mem>",
                },
            },
        }
    }

    /// A new Mosaic value.
    pub fn fresh(&mut self) -> MValue {
        let v = self.next;
        self.next += 1;
        v
    }

    /// The Mosaic value for an IR value (must already be lowered).
    pub fn v(&self, id: ValueId) -> Result<MValue> {
        self.values
            .get(id.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| {
                kerr!(
                    Lowering,
                    "value %{} used before it was lowered (internal error)",
                    id.0
                )
            })
    }

    /// Make `result` the same Mosaic value as `operand` (an op that lowers to nothing).
    pub fn alias(&mut self, result: ValueId, operand: ValueId) -> Result<()> {
        let v = self.v(operand)?;
        self.bind(result, v);
        Ok(())
    }

    pub fn bind(&mut self, id: ValueId, v: MValue) {
        if let Some(slot) = self.values.get_mut(id.0 as usize) {
            *slot = Some(v);
        }
    }

    /// Lower a region into a new block (its args become block arguments).
    pub fn region(&mut self, r: &Region) -> Result<MBlock> {
        let mut block = MBlock {
            args: Vec::with_capacity(r.args.len()),
            arg_loc: Some(self.func.loc),
            ops: Vec::with_capacity(r.ops.len()),
        };
        for a in &r.args {
            let ty = self.ty(self.func.ty(*a))?;
            let v = self.fresh();
            self.bind(*a, v);
            block.args.push((v, ty));
        }
        for op in &r.ops {
            rules::lower_op(self, &mut block.ops, op).map_err(|e| e.at(op.loc))?;
        }
        Ok(block)
    }
}

pub(crate) fn vector_type_text(shape: &[usize], elem: &str) -> String {
    if shape.is_empty() {
        return elem.to_string();
    }
    let dims = shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x");
    format!("vector<{dims}x{elem}>")
}

//! The whole emitted module → one upstream module: the kernel `func.func` (found by its Mosaic launch
//! attributes) and the `transform_k` index-map functions its `window_params` name, plus the launch
//! facts the driver needs, read from those attributes — not from the kernel IR.

use super::rewrite::{Files, RefId, Rewriter, Signature, Site, Space, Ty};
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::Kernel;
use melior::ir::attribute::{
    ArrayAttribute, DenseI64ArrayAttribute, DictionaryAttribute, FlatSymbolRefAttribute,
    StringAttribute,
};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::Module;

/// The rewritten kernel function's name.
pub(super) const KERNEL_FN: &str = "mosaic_kernel";

/// One input/output's BlockSpec as the module states it.
#[derive(Clone, Debug)]
pub(super) struct Window {
    /// The rewritten index-map function.
    pub func: String,
    pub bounds: Vec<usize>,
    /// Its arguments (grid indices, then the scalar-prefetch refs) and results (the block indices).
    pub signature: Signature,
    /// Whether it reads scalar-prefetch data (a `memref.load`): its blocks are known only at run time.
    pub reads_data: bool,
}

/// The rewritten module and the launch it describes.
pub(super) struct Program {
    pub text: String,
    pub sites: Vec<Site>,
    /// `iteration_bounds`.
    pub grid: Vec<usize>,
    /// The kernel function's arguments (grid indices, then refs).
    pub kernel_args: Vec<Ty>,
    /// Per kernel function argument: the memory space of a ref.
    pub kernel_spaces: Vec<Option<Space>>,
    /// `window_params`, one per input/output in argument order (`None`: a whole-array operand).
    pub windows: Vec<Option<Window>>,
    /// `scratch_operands`.
    pub scratch: usize,
    /// `scalar_prefetch`: the first refs after the grid indices, passed to every index map too.
    pub prefetch: usize,
}

fn sym_name(op: OperationRef<'_, '_>) -> Option<String> {
    let a = op.attribute("sym_name").ok()?;
    StringAttribute::try_from(a)
        .ok()
        .map(|s| s.value().to_string())
}

fn bad(what: impl std::fmt::Display) -> crate::error::KernelError {
    kerr!(Lowering, "mosaic_cpu: the kernel function's {what}")
}

/// Whether `op` or an op nested in it is named `name`.
fn contains_op(op: OperationRef<'_, '_>, name: &str) -> bool {
    if super::rewrite::op_name(op) == name {
        return true;
    }
    op.regions().any(|r| {
        let mut block = melior::ir::RegionLike::first_block(&r);
        while let Some(b) = block {
            let mut next = b.first_operation();
            while let Some(o) = next {
                if contains_op(o, name) {
                    return true;
                }
                next = o.next_in_block();
            }
            block = b.next_in_region();
        }
        false
    })
}

/// Register the ref arguments of function `f` (those after the grid indices) as kernel operands
/// `0, 1, ...`, for the labels of bounds errors: the kernel's refs are its operands in order, an index
/// map's are the scalar-prefetch operands, which come first.
fn register_refs(rw: &mut Rewriter<'_>, f: OperationRef<'_, '_>, grid: usize) {
    if let Ok(region) = f.region(0) {
        if let Some(b) = melior::ir::RegionLike::first_block(&region) {
            for i in grid..b.argument_count() {
                if let Ok(a) = b.argument(i) {
                    rw.refs
                        .insert(super::rewrite::key(a), RefId::Operand(i - grid));
                }
            }
        }
    }
}

/// Every source file the kernel's ops name, so MLIR locations map back to `SourceLoc`s.
fn files(k: &Kernel) -> Files {
    let mut known: Vec<&'static str> = vec![k.body.loc.file];
    let mut add = |l: &SourceLoc| {
        if !known.contains(&l.file) {
            known.push(l.file);
        }
    };
    k.body.walk(&mut |op| add(&op.loc));
    for o in &k.operands {
        add(&o.loc);
        if let Some(b) = &o.block {
            add(&b.index_map.loc);
            b.index_map.walk(&mut |op| add(&op.loc));
        }
    }
    Files {
        known,
        fallback: k.body.loc,
    }
}

/// Rewrite `module` (the Mosaic module of `k`) into upstream MLIR.
pub(super) fn rewrite(k: &Kernel, module: &Module<'_>) -> Result<Program> {
    let mut funcs = Vec::new();
    let body = module.body();
    let mut next = body.first_operation();
    while let Some(op) = next {
        if super::rewrite::op_name(op) == "func.func" {
            funcs.push(op);
        }
        next = op.next_in_block();
    }
    let kernels: Vec<OperationRef<'_, '_>> = funcs
        .iter()
        .copied()
        .filter(|f| f.attribute("dimension_semantics").is_ok())
        .collect();
    let [kernel] = kernels[..] else {
        return Err(kerr!(
            Lowering,
            "mosaic_cpu: expected one kernel function (with `dimension_semantics`), found {}",
            kernels.len()
        ));
    };
    // A grid-free kernel (Pallas's form) has no `iteration_bounds` and no `window_params`.
    let grid: Vec<usize> = match kernel.attribute("iteration_bounds") {
        Err(_) => Vec::new(),
        Ok(a) => {
            let g = DenseI64ArrayAttribute::try_from(a).map_err(|_| bad("iteration_bounds"))?;
            (0..g.len())
                .map(|i| g.element(i).map(|g| g as usize))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| bad("iteration_bounds"))?
        }
    };
    let int = |name: &str| -> Result<i64> {
        kernel
            .attribute(name)
            .ok()
            .and_then(|a| melior::ir::attribute::IntegerAttribute::try_from(a).ok())
            .map(|a| a.value())
            .ok_or_else(|| bad(name))
    };
    let prefetch = usize::try_from(int("scalar_prefetch")?).map_err(|_| bad("scalar_prefetch"))?;
    let scratch = usize::try_from(int("scratch_operands")?).map_err(|_| bad("scratch_operands"))?;
    let params = match kernel.attribute("window_params") {
        Ok(a) => Some(ArrayAttribute::try_from(a).map_err(|_| bad("window_params"))?),
        Err(_) if grid.is_empty() => None,
        Err(_) => return Err(bad("window_params")),
    };

    let files = files(k);
    let mut rw = Rewriter::new(&files);
    register_refs(&mut rw, kernel, grid.len());
    let Signature {
        args: kernel_args,
        spaces: kernel_spaces,
        ..
    } = rw.function(kernel, KERNEL_FN)?;

    let mut windows = Vec::new();
    for i in 0..params.map_or(0, |p| p.len()) {
        let p = params
            .and_then(|p| p.element(i).ok())
            .ok_or_else(|| bad("window_params"))?;
        let dict = DictionaryAttribute::try_from(p).map_err(|_| bad("window_params"))?;
        let Some(t) = dict.element_by_name("transform_indices") else {
            windows.push(None);
            continue;
        };
        let name = FlatSymbolRefAttribute::try_from(t)
            .map_err(|_| bad("transform_indices"))?
            .value()
            .to_string();
        let bounds = dict
            .element_by_name("window_bounds")
            .and_then(|a| DenseI64ArrayAttribute::try_from(a).ok())
            .ok_or_else(|| bad("window_bounds"))?;
        let bounds: Vec<usize> = (0..bounds.len())
            .map(|j| bounds.element(j).map(|b| b as usize))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad("window_bounds"))?;
        let f = funcs
            .iter()
            .copied()
            .find(|f| sym_name(*f).as_deref() == Some(name.as_str()))
            .ok_or_else(|| {
                kerr!(
                    Lowering,
                    "mosaic_cpu: window {i} names @{name}, which the module does not define"
                )
            })?;
        let func = format!("mosaic_transform_{i}");
        register_refs(&mut rw, f, grid.len());
        rw.index_map = true;
        let signature = rw.function(f, &func)?;
        rw.index_map = false;
        windows.push(Some(Window {
            func,
            bounds,
            signature,
            reads_data: contains_op(f, "memref.load"),
        }));
    }
    let (funcs_text, sites) = rw.finish();
    Ok(Program {
        text: format!("module {{\n{funcs_text}}}\n"),
        sites,
        grid,
        kernel_args,
        kernel_spaces,
        windows,
        scratch,
        prefetch,
    })
}

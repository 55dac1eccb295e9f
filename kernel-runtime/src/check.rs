//! Trace-time checks against Mosaic's rules: grid, block shapes (tiling), index maps (rank, bounds,
//! coverage), kernel parameters, and the VMEM budget of the kernel's target. Each returns a [`KernelError`](crate::error::KernelError) the caller locates.

use crate::dtype::DType;
use crate::error::{kerr, Result};
use crate::ir::{BinaryOp, Func, Kernel, MemSpace, Op, OpKind, Operand, OperandRole};
use crate::trace::ParamKind;

/// Lane and sublane tile of the TPU vector registers: the last two block dims must be multiples of these
/// (or equal to the whole array's dims).
pub const LANES: usize = 128;
pub const SUBLANES: usize = 8;

/// Grid points beyond which coverage is checked on a sample only (keeps `build()` fast).
const MAX_GRID_POINTS_CHECKED: usize = 1 << 16;

pub fn grid(grid: &[usize]) -> Result<()> {
    if let Some(axis) = grid.iter().position(|&g| g == 0) {
        return Err(kerr!(
            Grid,
            "grid {grid:?} has an empty axis {axis}; every axis needs at least one step"
        ));
    }
    if grid.iter().any(|&g| g > i32::MAX as usize) {
        return Err(kerr!(Grid, "grid {grid:?} does not fit in i32 indices"));
    }
    if grid
        .iter()
        .try_fold(1u64, |acc, &g| acc.checked_mul(g as u64))
        .is_none_or(|n| n > 1 << 48)
    {
        return Err(kerr!(Grid, "grid {grid:?} has more than 2^48 steps"));
    }
    Ok(())
}

/// Shape, tiling and dtype rules for one operand; `aliased`: an output aliased to an input (blocks it
/// never writes keep the input's contents, so it need not cover the array).
pub fn operand(op: &Operand, grid: &[usize], aliased: bool) -> Result<()> {
    if let MemSpace::Sem(_) = op.space {
        return Ok(()); // one semaphore (rank 0) or an array of them
    }
    if op.shape.is_empty() {
        return Err(kerr!(
            Shape,
            "rank-0 arrays are not supported; reshape to [1]"
        ));
    }
    if op.shape.contains(&0) {
        return Err(kerr!(
            Shape,
            "array shape {:?} has a zero dimension",
            op.shape
        ));
    }
    crate::size::check("array", &op.shape, op.dtype)?;
    if op.dtype == DType::Bool && op.role != OperandRole::Scratch {
        return Err(kerr!(
            DType,
            "bool arrays cannot cross the kernel boundary; pass them as i32 (or u8) and compare"
        ));
    }
    if op.space == MemSpace::Smem && op.dtype.size_bytes() != 4 {
        return Err(kerr!(
            DType,
            "SMEM holds 32-bit scalars; a {} array cannot live there (use i32, u32 or f32)",
            op.dtype
        ));
    }
    let Some(block) = &op.block else {
        return Ok(());
    };
    let (bs, arr) = (&block.block_shape, &op.shape);
    for (d, &b) in bs.iter().enumerate() {
        if b == 0 {
            return Err(kerr!(Tiling, "block shape {bs:?} has a zero dimension {d}"));
        }
        if block.squeezed[d] && b != 1 {
            return Err(kerr!(
                Tiling,
                "squeezed dimension {d} of block shape {bs:?} must have size 1"
            ));
        }
    }
    let rank = bs.len();
    // A rank-1 array is laid out in tiles of 128 lanes times the dtype's packing (f32 128, bf16 256,
    // i8 512, int4 1024 elements): libtpu rejects a block that is not a multiple of the tile ("E2002
    // ... has tiling (256)"), measured on v5e with 1-D f32/bf16/i8 arrays of 256..4096 and blocks of
    // 128..2048; int4 (probe_dtypes.py, v4..tpu7x): 1024 and 2048 of 4096 compile, 512 is refused by
    // Pallas ("a multiple of 1024"). Rank-2 int4 blocks take the same (8, 128) as every dtype: (8,
    // 128), (16, 128), (8, 256) of larger arrays compile on every generation.
    let lane_tile = if rank == 1 {
        LANES * op.dtype.packing()
    } else {
        LANES
    };
    if rank == 1 && op.dtype == DType::I4 && bs[0] % lane_tile != 0 && bs[0] == arr[0] {
        // int4 has no whole-array exception: libtpu refuses a rank-1 int4 block of any length not a
        // multiple of 1024, the whole array's included ("Only 16-bit and 8-bit subelement masking is
        // currently implemented", probe_dtypes.py: 128, 512, 1536 and 2000 of arrays that long, on
        // v4..tpu7x); a 1024 block of a 3000-long array (a padded edge block) compiles.
        let (b, a) = (bs[0], arr[0]);
        let fix = if a > lane_tile {
            format!("try {lane_tile}")
        } else if a % LANES == 0 {
            format!("or reshape the array to [{}, {LANES}] (2-D int4 blocks take (8, 128) tiles and whole-array blocks)", a / LANES)
        } else {
            "or reshape the array to 2-D (2-D int4 blocks may equal the whole array)".to_string()
        };
        return Err(kerr!(
            Tiling,
            "block shape {bs:?}: a rank-1 int4 block must be a multiple of {lane_tile} elements, even one equal to the whole array ({b}): libtpu cannot mask packed 4-bit rows; {fix}"
        ));
    }
    let rules = [
        (rank.wrapping_sub(1), lane_tile, "last"),
        (rank.wrapping_sub(2), SUBLANES, "second-to-last"),
    ];
    for (d, tile, which) in rules {
        if d >= rank {
            continue;
        }
        let (b, a) = (bs[d], arr[d]);
        if b % tile != 0 && b != a {
            // (A block may be larger than its array — one padded edge block, as in Pallas — so `b` may
            // be near usize::MAX: round up saturating.)
            let up = b.div_ceil(tile).saturating_mul(tile).min(a);
            let fix = if up == a {
                format!("try {a}")
            } else {
                format!("try {up} or {a}")
            };
            return Err(kerr!(
                Tiling,
                "block shape {bs:?}: the {which} dimension ({b}) must be divisible by {tile} or equal the array dimension ({a}); {fix}"
            ));
        }
    }
    check_index_map(op, grid, aliased)
}

/// Evaluate the index map on every grid point (or a sample of a huge grid): block indices in bounds,
/// and every block of an output written.
fn check_index_map(op: &Operand, grid: &[usize], aliased: bool) -> Result<()> {
    let Some(block) = &op.block else {
        return Ok(());
    };
    if grid.is_empty() {
        return whole_array_block(op, block);
    }
    // A map that reads scalar-prefetch data depends on values known only at run time: the
    // interpreter checks its blocks at every step instead.
    if block.index_map.reads_refs() {
        return Ok(());
    }
    let nblocks: Vec<usize> = op
        .shape
        .iter()
        .zip(&block.block_shape)
        .map(|(a, b)| a.div_ceil(*b))
        .collect();
    let total: usize = grid.iter().product();
    // Coverage of outputs is tracked exactly up to this many blocks (a bitmap); beyond it, bounds only.
    const MAX_TRACKED_BLOCKS: u64 = 1 << 26;
    let n_blocks = nblocks
        .iter()
        .try_fold(1u64, |a, &n| a.checked_mul(n as u64));
    let tracked = match n_blocks {
        Some(n) if op.role == OperandRole::Output && !aliased && n <= MAX_TRACKED_BLOCKS => {
            n as usize
        }
        _ => 0,
    };
    let mut covered = vec![false; tracked];
    let map = crate::index_map::IndexMap::new(&block.index_map);
    let (mut args, mut env, mut idx) = (Vec::new(), Vec::new(), Vec::new());
    let stride = total.div_ceil(MAX_GRID_POINTS_CHECKED).max(1);
    let mut point = vec![0usize; grid.len()];
    for flat in (0..total).step_by(stride) {
        let mut rem = flat;
        for ax in (0..grid.len()).rev() {
            point[ax] = rem % grid[ax];
            rem /= grid[ax];
        }
        args.clear();
        args.extend(point.iter().map(|&p| p as i64));
        map.eval(&args, &mut env, &mut idx)?;
        let mut lin = 0usize;
        for (d, &i) in idx.iter().enumerate() {
            if i < 0 || i as usize >= nblocks[d] {
                return Err(kerr!(
                    OutOfBounds,
                    "at grid point {point:?} the index map returns block {idx:?}, but dimension {d} has only {} blocks of {} (array {:?})",
                    nblocks[d],
                    block.block_shape[d],
                    op.shape
                ));
            }
            lin = lin.wrapping_mul(nblocks[d]).wrapping_add(i as usize);
        }
        if let Some(c) = covered.get_mut(lin) {
            *c = true;
        }
    }
    if stride == 1 {
        if let Some(missing) = covered.iter().position(|c| !c) {
            let mut idx = vec![0; nblocks.len()];
            let mut rem = missing;
            for d in (0..nblocks.len()).rev() {
                idx[d] = rem % nblocks[d];
                rem /= nblocks[d];
            }
            return Err(kerr!(
                Grid,
                "the grid {grid:?} never writes output block {idx:?} of the array {:?} (block {:?}); the grid times the block must cover the array",
                op.shape,
                block.block_shape
            ));
        }
    }
    Ok(())
}

/// Evaluate a scalar `i32` function (an index map) on concrete grid indices.
/// A launch without a grid takes whole arrays, as Pallas's grid-free `pallas_call` does ("Non-trivial
/// windowing is not supported"): its Mosaic has no `iteration_bounds` and no `window_params`, so a
/// block must be the whole array, at block index 0.
fn whole_array_block(op: &Operand, block: &crate::ir::BlockIr) -> Result<()> {
    let idx = if block.index_map.reads_refs() {
        None
    } else {
        Some(eval_index_map(&block.index_map, &[])?)
    };
    let whole =
        block.block_shape == op.shape && idx.as_ref().is_some_and(|i| i.iter().all(|&x| x == 0));
    if whole {
        return Ok(());
    }
    let at = match &idx {
        Some(i) => format!("block index {i:?}"),
        None => "a block index read from scalar-prefetch data".to_string(),
    };
    Err(kerr!(
        Grid,
        "a launch without a grid takes whole arrays (as Pallas's grid-free pallas_call): block {:?} at {at} of the {:?} array is a window; give the launch a grid (`.grid([1])` for one step) or make the block the whole array",
        block.block_shape,
        op.shape
    ))
}

pub fn eval_index_map(f: &Func, args: &[i64]) -> Result<Vec<i64>> {
    eval_index_map_with(f, args, &[])
}

/// One scalar-prefetch operand's contents, as an index map reads them.
#[derive(Clone, Copy, Debug)]
pub struct Prefetched<'a> {
    pub shape: &'a [usize],
    pub data: &'a [i32],
}

/// [`eval_index_map`] for a map that may read the scalar-prefetch operands (its parameters after the
/// grid indices, in order).
pub fn eval_index_map_with(
    f: &Func,
    args: &[i64],
    prefetch: &[Prefetched<'_>],
) -> Result<Vec<i64>> {
    let mut env = vec![0i64; f.values.len()];
    for (a, v) in f.body.args.iter().zip(args) {
        env[a.0 as usize] = *v;
    }
    // A ref parameter's slot holds which prefetch operand it is.
    for (k, a) in f.body.args.iter().skip(args.len()).enumerate() {
        env[a.0 as usize] = k as i64;
    }
    let wrap = |x: i64| x as i32 as i64;
    for op in &f.body.ops {
        let get = |i: usize| env[op.operands[i].0 as usize];
        let r = match &op.kind {
            OpKind::Const(l) => l.as_i64(),
            OpKind::MultipleOf(_) => get(0),
            OpKind::Load(w) => read_prefetch(op, w, &env, prefetch)?,
            OpKind::Binary(b) => {
                let (x, y) = (get(0), get(1));
                match b {
                    BinaryOp::Add => wrap(x + y),
                    BinaryOp::Sub => wrap(x - y),
                    BinaryOp::Mul => wrap(x * y),
                    BinaryOp::Div | BinaryOp::Rem if y == 0 => {
                        return Err(kerr!(Grid, "the index map divides by zero"));
                    }
                    BinaryOp::Div => x / y,
                    BinaryOp::Rem => x % y,
                    BinaryOp::Max => x.max(y),
                    BinaryOp::Min => x.min(y),
                    _ => return Err(unsupported_in_index_map(op)),
                }
            }
            OpKind::Return => return Ok(op.operands.iter().map(|v| env[v.0 as usize]).collect()),
            _ => return Err(unsupported_in_index_map(op)),
        };
        if let Some(res) = op.results.first() {
            env[res.0 as usize] = r;
        }
    }
    Err(kerr!(Grid, "index map has no return (internal error)"))
}

/// One element of a scalar-prefetch operand read by an index map (`idx_ref[i]`), bounds-checked.
fn read_prefetch(
    op: &Op,
    w: &crate::ir::Window,
    env: &[i64],
    prefetch: &[Prefetched<'_>],
) -> Result<i64> {
    let k = env[op.operands[0].0 as usize] as usize;
    let Some(p) = prefetch.get(k) else {
        return Err(kerr!(
            Grid,
            "this index map reads scalar-prefetch data, which is known only when the kernel runs"
        )
        .at(op.loc));
    };
    let mut dynamic = op.operands[1..].iter().map(|v| env[v.0 as usize]);
    let mut idx = Vec::with_capacity(w.starts.len());
    for s in &w.starts {
        idx.push(match s {
            crate::ir::Start::Static(v) => *v as i64,
            crate::ir::Start::Dynamic => dynamic.next().unwrap_or(0),
        });
    }
    let mut flat = 0usize;
    for (d, (&i, &n)) in idx.iter().zip(p.shape).enumerate() {
        if i < 0 || i as usize >= n {
            return Err(kerr!(
                OutOfBounds,
                "the index map reads element {idx:?} of scalar-prefetch operand {k} (shape {:?}): index {i} is out of bounds along dimension {d}",
                p.shape
            )
            .at(op.loc));
        }
        flat = flat * n + i as usize;
    }
    Ok(p.data.get(flat).copied().unwrap_or(0) as i64)
}

fn unsupported_in_index_map(op: &Op) -> crate::error::KernelError {
    kerr!(
        Unsupported,
        "index maps may only use integer + - * / % min max on grid indices and read scalar-prefetch refs; found {:?}",
        op.kind
    )
    .at(op.loc)
}

/// The kernel's parameters must be the operands, in order, with matching kinds and dtypes.
pub fn params(params: &[(ParamKind, DType, MemSpace)], operands: &[Operand]) -> Result<()> {
    if params.len() != operands.len() {
        let (ni, no, ns) = (
            operands
                .iter()
                .filter(|o| o.role == OperandRole::Input)
                .count(),
            operands
                .iter()
                .filter(|o| o.role == OperandRole::Output)
                .count(),
            operands
                .iter()
                .filter(|o| o.role == OperandRole::Scratch)
                .count(),
        );
        return Err(kerr!(
            Signature,
            "the kernel takes {} parameters but the launch declares {} ({ni} inputs + {no} outputs + {ns} scratch)",
            params.len(),
            operands.len()
        ));
    }
    for (i, ((kind, dtype, space), op)) in params.iter().zip(operands).enumerate() {
        let want = if op.role == OperandRole::Input {
            ParamKind::Ref
        } else {
            ParamKind::RefMut
        };
        if *kind != want || *space != op.space {
            let got = kind_name(*kind, *dtype, *space);
            let need = kind_name(want, op.dtype, op.space);
            let what = match op.space {
                MemSpace::Vmem => "a VMEM block".to_string(),
                MemSpace::Smem => "an SMEM array".to_string(),
                MemSpace::Any => "a whole array left in HBM (ANY: DMA only)".to_string(),
                MemSpace::Sem(_) => "semaphores".to_string(),
            };
            return Err(kerr!(
                Signature,
                "kernel parameter {i} is `{got}` but it receives {} ({what}): declare it `{need}`",
                op.label()
            )
            .for_argument(op.label())
            .at(op.loc));
        }
        if *dtype != op.dtype {
            return Err(kerr!(
                DType,
                "kernel parameter {i} has element type {dtype} but {} is {}: make them agree",
                op.label(),
                op.dtype
            )
            .for_argument(op.label())
            .at(op.loc));
        }
    }
    Ok(())
}

/// How a kernel parameter of this kind, dtype and space is spelled in Rust (`RefMut<f32, Smem>`).
pub fn param_type_name(k: ParamKind, d: DType, space: MemSpace) -> String {
    kind_name(k, d, space)
}

fn kind_name(k: ParamKind, d: DType, space: MemSpace) -> String {
    let h = match k {
        ParamKind::Ref => "Ref",
        ParamKind::RefMut => "RefMut",
    };
    match space {
        MemSpace::Vmem => format!("{h}<{d}>"),
        MemSpace::Smem => format!("{h}<{d}, Smem>"),
        MemSpace::Any => format!("{h}<{d}, Any>"),
        MemSpace::Sem(crate::ir::SemKind::Dma) => "DmaSem".to_string(),
        MemSpace::Sem(crate::ir::SemKind::Regular) => "Sem".to_string(),
    }
}

/// `input_output_aliases`: each pair names an existing input and output of one shape and dtype, and
/// no output is aliased twice.
pub fn aliases(pairs: &[(usize, usize)], operands: &[Operand]) -> Result<()> {
    let inputs: Vec<&Operand> = operands
        .iter()
        .filter(|o| o.role == OperandRole::Input)
        .collect();
    let outputs: Vec<&Operand> = operands
        .iter()
        .filter(|o| o.role == OperandRole::Output)
        .collect();
    let mut seen: Vec<usize> = Vec::new();
    for &(i, o) in pairs {
        let (Some(inp), Some(out)) = (inputs.get(i), outputs.get(o)) else {
            return Err(kerr!(
                Signature,
                "input_output_aliases ({i}, {o}): the call has {} inputs and {} outputs",
                inputs.len(),
                outputs.len()
            ));
        };
        if inp.shape != out.shape || inp.dtype != out.dtype {
            return Err(kerr!(
                Signature,
                "input {i} ({:?} {}) cannot alias output {o} ({:?} {}): shape and dtype must match",
                inp.shape,
                inp.dtype,
                out.shape,
                out.dtype
            ));
        }
        if inp.space == MemSpace::Smem && inp.block.is_none() {
            return Err(kerr!(
                Signature,
                "input {i} is a scalar-prefetch operand; it cannot alias an output"
            ));
        }
        if seen.contains(&o) || pairs.iter().filter(|p| p.0 == i).count() > 1 {
            return Err(kerr!(
                Signature,
                "input_output_aliases pairs each input and each output at most once; ({i}, {o}) repeats one"
            ));
        }
        seen.push(o);
    }
    Ok(())
}

/// Checks that need the traced body: the VMEM budget of the kernel's target — the estimate within
/// the scoped limit (the launch's `vmem_limit_bytes`, else the target's default) and within what a
/// TensorCore of that generation has (libtpu takes a limit above it, but no more VMEM).
pub fn kernel(k: &Kernel) -> Result<()> {
    target_ops(k)?;
    target_blocks(k)?;
    let used = vmem_estimate(k);
    let limit = vmem_limit(k);
    let t = k.target.info();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let needs = format!(
        "kernel `{}` needs an estimated {:.2} MiB of VMEM (blocks double-buffered + scratch)",
        k.name,
        mib(used)
    );
    if used > t.vmem_usable_bytes {
        return Err(kerr!(
            Vmem,
            "{needs} but a {} TensorCore has {:.2} MiB for a kernel ({:.0} MiB of VMEM); use smaller blocks",
            t.name,
            mib(t.vmem_usable_bytes),
            mib(t.vmem_capacity_bytes)
        ));
    }
    if used > limit {
        let whose = match k.vmem_limit_bytes {
            Some(_) => "the launch's `.vmem_limit_bytes(..)`".to_string(),
            None => format!("libtpu's default on {}", t.name),
        };
        return Err(kerr!(
            Vmem,
            "{needs} but the scoped VMEM limit is {:.2} MiB ({whose}); use smaller blocks or raise `.vmem_limit_bytes(..)` (up to {:.2} MiB on {})",
            mib(limit),
            mib(t.vmem_usable_bytes),
            t.name
        ));
    }
    Ok(())
}

/// Blocks the kernel's target does not compile, at the operand's declaration: a rank-1 8-bit block
/// equal to its whole array but not a multiple of its 512-element tile where libtpu cannot mask 8-bit
/// elements (`TargetInfo::masks_8bit`: v4).
fn target_blocks(k: &Kernel) -> Result<()> {
    let t = k.target.info();
    if t.masks_8bit {
        return Ok(());
    }
    for op in &k.operands {
        let Some(block) = &op.block else { continue };
        let tile = LANES * op.dtype.packing();
        let (bs, arr) = (&block.block_shape, &op.shape);
        if op.dtype.bit_width() == 8 && bs.len() == 1 && bs[0] == arr[0] && bs[0] % tile != 0 {
            let fix = if arr[0] > tile {
                format!("use blocks of {tile} elements (the last one padded)")
            } else if arr[0] % LANES == 0 {
                format!("reshape the array to [{}, {LANES}]", arr[0] / LANES)
            } else {
                "reshape the array to 2-D".to_string()
            };
            return Err(kerr!(
                Tiling,
                "block shape {bs:?}: {} cannot mask 8-bit elements within a word (libtpu: \"8-bit subelement masking is only supported for TPU v5+\"), so a rank-1 {} block must be a multiple of {tile} elements, even one equal to the whole array; {fix}",
                t.name,
                op.dtype
            )
            .at(op.loc)
            .for_argument(op.label()));
        }
    }
    Ok(())
}

/// Ops the kernel's target does not compile, at the op's line: an op on a storage dtype libtpu
/// refuses there (any f16 vector: `TargetInfo::storage_dtypes`), a `dot` of a dtype libtpu refuses
/// there (i8 and the 8-bit floats on v4: `TargetInfo::matmul_dtypes`).
fn target_ops(k: &Kernel) -> Result<()> {
    use crate::dtype::DTypeOps;
    let t = k.target.info();
    let refused = |d: DType| d.ops() == DTypeOps::Storage && !t.storage_dtypes.contains(&d);
    let mut found = None;
    k.body.walk(&mut |op| {
        if found.is_some() {
            return;
        }
        let types = op.operands.iter().chain(&op.results).map(|v| k.body.ty(*v));
        if let Some(d) = types.map(|ty| ty.dtype()).find(|d| refused(*d)) {
            let accepted: Vec<&str> = t.storage_dtypes.iter().map(|d| d.name()).collect();
            found = Some(
                kerr!(
                    DType,
                    "{} does not compile {d} values (`{}` here; libtpu refuses every {d} vector there, a plain load included: \"Invalid vector type for load\"); the narrow dtypes it takes are {}: convert on the host or keep {d} data outside the kernel",
                    t.name,
                    crate::ir::op_label(&op.kind),
                    accepted.join(", ")
                )
                .at(op.loc),
            );
            return;
        }
        if let OpKind::Dot { .. } = &op.kind {
            let d = k.body.ty(op.operands[0]).dtype();
            if !t.matmul_dtypes.contains(&d) {
                found = Some(
                    kerr!(
                        DType,
                        "{} does not multiply {d} blocks (libtpu refuses an {d} matmul there: \"unsupported matmul RHS type\"); cast them to bf16 (`.cast::<bf16>()`) or build for another target",
                        t.name
                    )
                    .at(op.loc),
                );
            }
        }
    });
    found.map_or(Ok(()), Err)
}

/// The scoped VMEM limit the kernel is checked against and the backend_config carries: the launch's
/// `vmem_limit_bytes`, else its target's default (libtpu's: 16 MiB on v5e, 32 MiB on v6e and tpu7x).
pub fn vmem_limit(k: &Kernel) -> u64 {
    k.vmem_limit_bytes
        .unwrap_or(k.target.info().default_scoped_vmem_bytes)
}

/// Bytes of VMEM a buffer occupies once padded as libtpu lays it out: the last dim to a multiple of 128
/// lanes; the second-to-last to a multiple of 8 rows for every dtype (packed bf16/i8 rows are not padded
/// to 16/32), or, when it has at most 4 rows, to a power of two holding at least 32 bits per lane.
/// Measured with libtpu 0.0.51 (`used_scoped_memory_configs` of copy kernels, f32/bf16/i8, 1..33 rows;
/// int4, packed half a byte per element, 1..65 rows: `tests/dtypes.rs`);
/// python/tests/test_agreement.py keeps it honest.
pub fn padded_bytes(shape: &[usize], dtype: DType) -> u64 {
    let min_rows = dtype.packing();
    let mut dims: Vec<usize> = shape.to_vec();
    let r = dims.len();
    if r >= 1 {
        dims[r - 1] = dims[r - 1].div_ceil(LANES) * LANES;
    }
    if r >= 2 {
        let rows = dims[r - 2];
        dims[r - 2] = if rows <= 4 {
            rows.next_power_of_two().max(min_rows)
        } else {
            rows.div_ceil(SUBLANES) * SUBLANES
        };
    }
    // In bits, then bytes: int4 packs two elements to a byte.
    let bits = dims.iter().fold(dtype.vmem_bits() as u64, |acc, &d| {
        acc.saturating_mul(d as u64)
    });
    bits.div_ceil(8)
}

/// Estimated VMEM use: pipelined blocks are double-buffered (single when the block never changes, as
/// Pallas does for constant index maps); scratch is single.
pub fn vmem_estimate(k: &Kernel) -> u64 {
    let steps: usize = k.grid.iter().product();
    k.operands
        .iter()
        .map(|o| match (&o.block, o.space) {
            (Some(b), _) => {
                let buffers = if steps > 1 && b.index_map.is_constant_map() {
                    1
                } else {
                    2
                };
                padded_bytes(&b.kernel_shape(), o.dtype).saturating_mul(buffers)
            }
            (None, MemSpace::Vmem) => padded_bytes(&o.shape, o.dtype),
            (None, _) => 0,
        })
        .fold(0u64, u64::saturating_add)
}

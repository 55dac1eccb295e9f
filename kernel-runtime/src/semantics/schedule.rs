//! The Pallas block schedule around the grid steps: grid points in Pallas order, chunks of parallel
//! axes, when blocks move, and the checks on the arrays and blocks of a launch — the same for both
//! engines (the interpreter's `grid` and `mosaic_cpu`'s `run` implement [`BlockEngine`]).

use crate::dtype::DType;
use crate::error::{kerr, KernelError, Result};
use crate::ir::{BlockIr, DimensionSemantics, Kernel, Operand, OperandRole};

/// Visit every grid point in Pallas order until `f` returns false.
pub(crate) fn for_each_point(
    grid: &[usize],
    mut f: impl FnMut(&[i64]) -> Result<bool>,
) -> Result<()> {
    let mut p = vec![0i64; grid.len()];
    loop {
        if !f(&p)? {
            return Ok(());
        }
        let mut d = grid.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            p[d] += 1;
            if (p[d] as usize) < grid[d] {
                break;
            }
            p[d] = 0;
        }
    }
}

/// The parallel-axis coordinates of chunk number `c` (row-major over `sizes`; empty for no axes).
pub(crate) fn chunk_key(sizes: &[usize], mut c: usize) -> Vec<i64> {
    let mut key = vec![0i64; sizes.len()];
    for d in (0..sizes.len()).rev() {
        key[d] = (c % sizes[d]) as i64;
        c /= sizes[d];
    }
    key
}

/// The Pallas block schedule around the grid steps, shared by the interpreter and `mosaic_cpu`: an
/// engine says how index maps are evaluated, how blocks move and how a step runs; [`walk_grid`] says
/// when (input blocks re-read when their block index changes; output blocks written back when it
/// changes and after the last step, so a revisited output keeps its contents).
pub(crate) trait BlockEngine {
    /// The block indices of operand `i` (which has a BlockSpec) at grid point `point`, into `idx`.
    fn block_index(&mut self, i: usize, point: &[i64], idx: &mut Vec<i64>) -> Result<()>;
    /// Input operand `i` (input number `n`) shows block `idx` from now on.
    fn copy_in(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()>;
    /// Output operand `i` (output number `n`) is done with block `idx`: write it to its array.
    fn write_back(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()>;
    /// Output operand `i` (output number `n`) starts on block `idx`.
    fn start_output(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()>;
    /// Run the kernel body at grid point `point`.
    fn step(&mut self, point: &[i64]) -> Result<()>;
    /// Grid step `point` is done and the next step (in grid order, whether or not this run walks it)
    /// moves along `parallel` axis `axis`: it may run on another core, so nothing may carry over
    /// (no copy outstanding, every semaphore at zero).
    fn cross(&mut self, point: &[i64], axis: usize) -> Result<()>;
}

/// The first `parallel` axis along which the grid point after `point` (in Pallas order over the
/// whole grid) differs from it; `None` at the last point or when only `arbitrary` axes move.
pub(crate) fn crossing(k: &Kernel, point: &[i64]) -> Option<usize> {
    // The next point increments the last axis that has room and resets every axis after it.
    let d = (0..k.grid.len())
        .rev()
        .find(|&d| (point[d] as usize) + 1 < k.grid[d])?;
    let parallel = |a: usize| k.dimension_semantics.get(a) == Some(&DimensionSemantics::Parallel);
    std::iter::once(d)
        .chain((d + 1..k.grid.len()).filter(|&e| k.grid[e] > 1))
        .find(|&a| parallel(a))
}

/// Run the grid points of `k` whose coordinates on `par_axes` are `key` (every point when there are no
/// such axes) in Pallas order, moving blocks as Pallas does, then write back each output's last block.
pub(crate) fn walk_grid(
    k: &Kernel,
    par_axes: &[usize],
    key: &[i64],
    e: &mut impl BlockEngine,
) -> Result<()> {
    let mut last: Vec<Option<Vec<i64>>> = vec![None; k.operands.len()];
    // Iterate the non-parallel axes with the parallel ones fixed to `key`.
    let free: Vec<usize> = (0..k.grid.len())
        .filter(|a| !par_axes.contains(a))
        .collect();
    let sub: Vec<usize> = free.iter().map(|&a| k.grid[a]).collect();
    let mut point = vec![0i64; k.grid.len()];
    for (a, v) in par_axes.iter().zip(key) {
        point[*a] = *v;
    }
    for_each_point(&sub, |q| {
        for (a, v) in free.iter().zip(q) {
            point[*a] = *v;
        }
        enter(k, e, &mut last, &point)?;
        let at = |mut err: KernelError| {
            err.message += &format!(" (at grid point {point:?})");
            err
        };
        e.step(&point).map_err(at)?;
        if let Some(axis) = crossing(k, &point) {
            e.cross(&point, axis)?;
        }
        Ok(true)
    })?;
    let mut out_no = 0;
    for (i, o) in k.operands.iter().enumerate() {
        if o.role == OperandRole::Output {
            if let Some(idx) = &last[i] {
                e.write_back(i, out_no, idx)?;
            }
            out_no += 1;
        }
    }
    Ok(())
}

/// Before a step: evaluate every index map; refresh inputs and write back outputs whose block changed.
fn enter(
    k: &Kernel,
    e: &mut impl BlockEngine,
    last: &mut [Option<Vec<i64>>],
    point: &[i64],
) -> Result<()> {
    let (mut input_no, mut out_no) = (0, 0);
    for (i, o) in k.operands.iter().enumerate() {
        let role_no = match o.role {
            OperandRole::Input => {
                input_no += 1;
                input_no - 1
            }
            OperandRole::Output => {
                out_no += 1;
                out_no - 1
            }
            OperandRole::Scratch => continue,
        };
        let Some(block) = &o.block else {
            continue;
        };
        let mut idx = Vec::with_capacity(o.shape.len());
        e.block_index(i, point, &mut idx)
            .map_err(|err| err.for_argument(o.label()))?;
        if last[i].as_ref() == Some(&idx) {
            continue;
        }
        check_block(block, &o.shape, &idx, point)
            .map_err(|err| err.for_argument(o.label()).at(o.loc))?;
        match o.role {
            OperandRole::Input => e.copy_in(i, role_no, &idx)?,
            _ => {
                if let Some(prev) = &last[i] {
                    e.write_back(i, role_no, prev)?;
                }
                e.start_output(i, role_no, &idx)?;
            }
        }
        last[i] = Some(idx);
    }
    Ok(())
}

/// The caller's arrays for the kernel's operands of `role` (inputs, or outputs to write): as many, and
/// each of its operand's shape and dtype.
pub(crate) fn check_arrays<'s>(
    k: &Kernel,
    role: OperandRole,
    arrays: impl ExactSizeIterator<Item = (&'s [usize], DType)>,
) -> Result<()> {
    let ops: Vec<&Operand> = k.operands.iter().filter(|o| o.role == role).collect();
    let (n, what) = (ops.len(), role.name());
    if arrays.len() != n {
        return Err(kerr!(
            Signature,
            "kernel `{}` takes {n} {what}s, got {} {what} arrays",
            k.name,
            arrays.len()
        ));
    }
    for (op, (shape, dtype)) in ops.into_iter().zip(arrays) {
        if shape != op.shape.as_slice() || dtype != op.dtype {
            return Err(kerr!(
                Shape,
                "expected a {:?} {} {what} array, got {:?} {}",
                op.shape,
                op.dtype,
                shape,
                dtype
            )
            .for_argument(op.label())
            .at(op.loc));
        }
    }
    Ok(())
}

/// A block index `build()` could not check (it came from scalar-prefetch data, or the grid is walked
/// for the first time): one index per dimension, each naming a block of the array.
pub(crate) fn check_block(
    block: &BlockIr,
    shape: &[usize],
    idx: &[i64],
    point: &[i64],
) -> Result<()> {
    if idx.len() != shape.len() {
        return Err(kerr!(
            Grid,
            "the index map returns {} block indices for an array of rank {}",
            idx.len(),
            shape.len()
        ));
    }
    for d in 0..shape.len() {
        let nblocks = shape[d].div_ceil(block.block_shape[d]);
        if idx[d] < 0 || idx[d] as usize >= nblocks {
            return Err(kerr!(
                OutOfBounds,
                "at grid point {point:?} the index map returns block {idx:?}, but dimension {d} has only {nblocks} blocks of {} (array {shape:?})",
                block.block_shape[d]
            ));
        }
    }
    Ok(())
}

/// The block operand `o`'s index map chose from scalar-prefetch data at grid point `point`: checked
/// when the map runs (`build()` checks the blocks of every other map), the same error in both engines.
pub(crate) fn check_data_block(o: &Operand, point: &[i64], idx: &[i64]) -> Result<()> {
    let block = o.block.as_ref().map(|b| &b.block_shape[..]).unwrap_or(&[]);
    for (d, (&b, (&n, &bs))) in idx.iter().zip(o.shape.iter().zip(block)).enumerate() {
        if b < 0 || b as usize >= n.div_ceil(bs) {
            return Err(kerr!(
                OutOfBounds,
                "at grid point {point:?} the index map of {} returns block {idx:?} (from scalar-prefetch data), but dimension {d} has only {} blocks of {bs} (array {:?})",
                o.label(),
                n.div_ceil(bs),
                o.shape
            )
            .at(o.loc));
        }
    }
    Ok(())
}

//! The grid loop with Pallas TPU semantics: steps in row-major order (last axis fastest); each input
//! block is (re)read when its block index changes; each output block is written back when its block index
//! changes and at the end, so an output revisited on consecutive steps keeps its contents; scratch
//! persists across steps.
//!
//! Grid points are split into chunks by their coordinates on the `parallel` axes; each chunk runs its
//! steps in order with its own block buffers and scratch (like a TPU core), and chunks run on the
//! calling thread and rayon's workers (see `workers`) when no output block is written by two chunks
//! (checked by evaluating the index maps).

use super::elementwise::RawDest;
use super::host::{take_output, ArrayView, ArrayViewMut, HostArray, HostData, HostElement};
use super::machine::{fill_literal, write_view, write_view_raw, Machine, RefState, WidenCache};
use super::plan::{plan, Plan};
use super::tensor::{internal, recycle, row_major_strides, Buf, Foreign, Tensor};
use super::InterpretOptions;
use crate::dtype::DType;
use crate::error::{kerr, KernelError, Result};
use crate::index_map::IndexMap;
use crate::ir::{BlockIr, DimensionSemantics, Kernel, OperandRole};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A raw view of one output array, shared by the chunks.
struct Sink {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
    /// Which blocks have been written back (blocks partition the array, so all set = all written).
    written: Vec<AtomicBool>,
}
// SAFETY: chunks write disjoint output blocks (checked in `parallel_axes`), or run one at a time.
unsafe impl Send for Sink {}
// SAFETY: as for `Send`: concurrent chunks never write the same block.
unsafe impl Sync for Sink {}

/// Where an output goes: `len` elements of `dtype` at `ptr`, written whole by the run.
#[derive(Clone, Copy)]
struct Target {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
}

/// A target over the whole capacity of an (uninitialized) output buffer.
fn target_of(data: &mut HostData) -> Target {
    fn raw<T>(v: &mut Vec<T>, dtype: DType) -> Target {
        Target {
            ptr: v.as_mut_ptr() as *mut u8,
            len: v.capacity(),
            dtype,
        }
    }
    let d = data.dtype();
    match data {
        HostData::F32(v) => raw(v, d),
        HostData::BF16(v) => raw(v, d),
        HostData::I32(v) => raw(v, d),
        HostData::I8(v) => raw(v, d),
        HostData::U8(v) => raw(v, d),
        HostData::U32(v) => raw(v, d),
        HostData::Bool(v) => raw(v, d),
    }
}

/// One input array as the grid runner reads it.
pub(crate) struct Input {
    shape: Vec<usize>,
    dtype: DType,
    buf: Buf,
}

pub(crate) fn run(
    k: &Kernel,
    inputs: &[HostArray],
    opts: &InterpretOptions,
) -> Result<Vec<HostArray>> {
    check_arrays(
        k,
        OperandRole::Input,
        inputs.iter().map(|a| (a.shape(), a.dtype())),
    )?;
    let inputs: Vec<Input> = inputs
        .iter()
        .map(|a| Input {
            shape: a.shape().to_vec(),
            dtype: a.dtype(),
            buf: Buf::Host(a.shared_data()),
        })
        .collect();
    // Outputs start uninitialized: every block is written back (or filled) before `assume_init`.
    let mut outputs: Vec<(Vec<usize>, HostData)> = k
        .outputs()
        .map(|o| {
            (
                o.shape.clone(),
                take_output(o.dtype, o.shape.iter().product()),
            )
        })
        .collect();
    let targets: Vec<Target> = outputs.iter_mut().map(|(_, d)| target_of(d)).collect();
    execute(k, &inputs, &targets, opts)?;
    Ok(outputs
        .into_iter()
        .map(|(shape, mut data)| {
            let n = shape.iter().product();
            // SAFETY: `execute` returned Ok only after checking that every block of every output
            // was written, and the blocks cover the array.
            unsafe { data.assume_init(n) };
            HostArray::from_parts(shape, data)
        })
        .collect())
}

/// [`run`] on borrowed arrays: inputs are read in place (copied only when misaligned), outputs are
/// written in place.
pub(crate) fn run_into(
    k: &Kernel,
    inputs: &[ArrayView<'_>],
    outputs: &mut [ArrayViewMut<'_>],
    opts: &InterpretOptions,
) -> Result<()> {
    check_arrays(
        k,
        OperandRole::Input,
        inputs.iter().map(|a| (a.shape, a.dtype)),
    )?;
    check_arrays(
        k,
        OperandRole::Output,
        outputs.iter().map(|a| (a.shape, a.dtype)),
    )?;
    let inputs: Vec<Input> = inputs
        .iter()
        .map(|a| {
            let foreign = Buf::Foreign(Foreign {
                dtype: a.dtype,
                ptr: a.ptr(),
                len: a.len(),
            });
            let aligned = super::elementwise::with_dtype!(a.dtype, T => foreign.slice::<T>().is_some());
            let buf = if aligned || a.is_empty() {
                foreign
            } else {
                // A misaligned buffer cannot be read as typed elements in place: copy it.
                let bytes = a.len() * host_size(a.dtype);
                // SAFETY: `bytes` readable bytes at `ptr` (the view's contract).
                let raw = unsafe { std::slice::from_raw_parts(a.ptr(), bytes) };
                Buf::host(super::elementwise::with_dtype!(a.dtype, T => {
                    let mut v: Vec<T> = Vec::with_capacity(a.len());
                    // SAFETY: `v` has room for `len` elements; the bytes are valid `T`s (the view's
                    // contract) and are copied unaligned.
                    unsafe {
                        std::ptr::copy_nonoverlapping(raw.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes);
                        v.set_len(a.len());
                    }
                    T::wrap(v)
                }))
            };
            Input {
                shape: a.shape.to_vec(),
                dtype: a.dtype,
                buf,
            }
        })
        .collect();
    let targets: Vec<Target> = outputs
        .iter_mut()
        .map(|a| Target {
            ptr: a.ptr(),
            len: a.len(),
            dtype: a.dtype,
        })
        .collect();
    if let Some(t) = targets
        .iter()
        .find(|t| t.len > 0 && !(t.ptr as usize).is_multiple_of(host_size(t.dtype)))
    {
        return Err(internal(&format!(
            "misaligned {} output buffer at {:p}",
            t.dtype, t.ptr
        )));
    }
    execute(k, &inputs, &targets, opts)
}

/// Bytes of one host element of `dtype` (bool is one byte on the host, like XLA's PRED).
fn host_size(dtype: DType) -> usize {
    super::elementwise::with_dtype!(dtype, T => std::mem::size_of::<T>())
}

/// The execution plan `execute` follows for `k` under `opts`, printed (`--emit plan`), and its counts:
/// the row-band coalescing, the parallel grid axes, then the body's per-op plan.
pub(crate) fn describe(k: &Kernel, opts: &InterpretOptions) -> Result<(String, super::PlanCounts)> {
    let threads = rayon::current_num_threads();
    let coalesced = if opts.fuse {
        super::coalesce::coalesce(k, threads).or_else(|| super::coalesce::coalesce_rows(k, threads))
    } else {
        None
    };
    let mut out = String::new();
    match &coalesced {
        Some(c) => out.push_str(&format!(
            "grid {:?}: run in row bands as grid {:?} (blocks {:?})\n",
            k.grid,
            c.grid,
            c.operands
                .iter()
                .filter_map(|o| o.block.as_ref().map(|b| b.block_shape.clone()))
                .collect::<Vec<_>>()
        )),
        None => out.push_str(&format!("grid {:?}: run as written\n", k.grid)),
    }
    let k = coalesced.as_ref().unwrap_or(k);
    let maps: Vec<_> = k
        .operands
        .iter()
        .map(|o| o.block.as_ref().map(|b| IndexMap::new(&b.index_map)))
        .collect();
    let par = if opts.parallel {
        parallel_axes(k, &maps)?
    } else {
        Vec::new()
    };
    if par.is_empty() {
        out.push_str("grid steps run in order on one thread\n");
    } else {
        out.push_str(&format!("parallel chunks over grid axes {par:?}\n"));
    }
    let p = plan(&k.body, opts.fuse);
    out.push_str(&p.describe(&k.body));
    let mut counts = p.counts();
    counts.row_bands = coalesced.is_some();
    counts.parallel_axes = par.len();
    Ok((out, counts))
}

/// Run every grid step of `k`, writing every block of every output into `targets`.
fn execute(
    k: &Kernel,
    inputs: &[Input],
    targets: &[Target],
    opts: &InterpretOptions,
) -> Result<()> {
    // Kernels that never mix rows run over larger row bands (same bits, see `coalesce`).
    let threads = rayon::current_num_threads();
    let coalesced = if opts.fuse {
        super::coalesce::coalesce(k, threads).or_else(|| super::coalesce::coalesce_rows(k, threads))
    } else {
        None
    };
    let k = coalesced.as_ref().unwrap_or(k);
    let blocks: Vec<usize> = k.outputs().map(block_count).collect();
    let sinks: Vec<Sink> = targets
        .iter()
        .zip(&blocks)
        .map(|(t, b)| Sink {
            ptr: t.ptr,
            len: t.len,
            dtype: t.dtype,
            written: (0..*b).map(|_| AtomicBool::new(false)).collect(),
        })
        .collect();
    let runner = Runner {
        k,
        maps: k
            .operands
            .iter()
            .map(|o| o.block.as_ref().map(|b| IndexMap::new(&b.index_map)))
            .collect(),
        inputs,
        sinks: &sinks,
        plan: plan(&k.body, opts.fuse),
        poison: opts.poison_uninitialized,
    };

    let par_axes = if opts.parallel {
        parallel_axes(k, &runner.maps)?
    } else {
        Vec::new()
    };
    // Chunks are numbered, not listed, so huge grids cost no per-chunk memory; the first error in
    // chunk order is the one reported, whatever the scheduling.
    let sizes: Vec<usize> = par_axes.iter().map(|&a| k.grid[a]).collect();
    let n_chunks: usize = sizes.iter().product();
    let first_error: Option<(usize, KernelError)> = if n_chunks > 1 {
        let first = Mutex::new(None::<(usize, KernelError)>);
        let ok = super::workers::run(
            n_chunks,
            threads,
            || runner.machine(),
            |m, c| {
                if let Err(e) = runner.chunk(m, &par_axes, &chunk_key(&sizes, c)) {
                    let mut f = first.lock().unwrap_or_else(|p| p.into_inner());
                    if f.as_ref().is_none_or(|(fc, _)| c < *fc) {
                        *f = Some((c, e));
                    }
                }
            },
        );
        if !ok {
            return Err(internal("a grid chunk panicked in the interpreter"));
        }
        first.into_inner().unwrap_or_else(|p| p.into_inner())
    } else {
        let mut m = runner.machine();
        (0..n_chunks.max(1)).find_map(|c| {
            runner
                .chunk(&mut m, &par_axes, &chunk_key(&sizes, c))
                .err()
                .map(|e| (c, e))
        })
    };
    if let Some((_, e)) = first_error {
        return Err(e);
    }
    // Blocks no grid step wrote (a grid that does not cover the array) read as the fill value.
    let outs: Vec<usize> = (0..k.operands.len())
        .filter(|&i| k.operands[i].role == OperandRole::Output)
        .collect();
    for (out_no, &i) in outs.iter().enumerate() {
        let o = &k.operands[i];
        let fill = Tensor::splat(fill_literal(o.dtype, runner.poison), &o.ref_shape());
        for b in 0..blocks[out_no] {
            if !sinks[out_no].written[b].load(Ordering::Relaxed) {
                runner.write_block(i, out_no, &block_index(o, b), &fill)?;
            }
        }
    }
    for (out_no, s) in sinks.iter().enumerate() {
        if !s.written.iter().all(|w| w.load(Ordering::Relaxed)) {
            return Err(internal(&format!("output {out_no} not fully written")));
        }
    }
    Ok(())
}

/// How many blocks an output's BlockSpec cuts it into.
fn block_count(o: &crate::ir::Operand) -> usize {
    match &o.block {
        Some(b) => o
            .shape
            .iter()
            .zip(&b.block_shape)
            .map(|(a, s)| a.div_ceil(*s))
            .product(),
        None => 1,
    }
}

/// The block index (per dimension) of linear block number `b`.
fn block_index(o: &crate::ir::Operand, mut b: usize) -> Vec<i64> {
    let Some(block) = &o.block else {
        return vec![0; o.shape.len()];
    };
    let n: Vec<usize> = o
        .shape
        .iter()
        .zip(&block.block_shape)
        .map(|(a, s)| a.div_ceil(*s))
        .collect();
    let mut idx = vec![0i64; n.len()];
    for d in (0..n.len()).rev() {
        idx[d] = (b % n[d]) as i64;
        b /= n[d];
    }
    idx
}

/// The caller's arrays for the kernel's operands of `role` (inputs, or outputs to write): as many, and
/// each of its operand's shape and dtype.
pub(crate) fn check_arrays<'s>(
    k: &Kernel,
    role: OperandRole,
    arrays: impl ExactSizeIterator<Item = (&'s [usize], DType)>,
) -> Result<()> {
    let ops: Vec<&crate::ir::Operand> = k.operands.iter().filter(|o| o.role == role).collect();
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

/// The parallel axes to split the grid on, or none when two chunks would write the same output block.
fn parallel_axes(k: &Kernel, maps: &[Option<IndexMap<'_>>]) -> Result<Vec<usize>> {
    let axes: Vec<usize> = (0..k.grid.len())
        .filter(|&a| {
            k.dimension_semantics.get(a) == Some(&DimensionSemantics::Parallel) && k.grid[a] > 1
        })
        .collect();
    if axes.is_empty() {
        return Ok(axes);
    }
    // Per output: which chunk (linear index of the parallel coordinates) owns each block.
    let outs: Vec<(usize, Vec<usize>)> = k
        .operands
        .iter()
        .enumerate()
        .filter(|(_, o)| o.role == OperandRole::Output)
        .filter_map(|(i, o)| {
            let b = o.block.as_ref()?;
            Some((
                i,
                o.shape
                    .iter()
                    .zip(&b.block_shape)
                    .map(|(a, s)| a.div_ceil(*s))
                    .collect(),
            ))
        })
        .collect();
    let mut owner: Vec<Vec<usize>> = outs
        .iter()
        .map(|(_, n)| vec![usize::MAX; n.iter().product()])
        .collect();
    let (mut env, mut idx) = (Vec::new(), Vec::new());
    let mut ok = true;
    for_each_point(&k.grid, |p| {
        let chunk = axes
            .iter()
            .fold(0usize, |acc, &a| acc * k.grid[a] + p[a] as usize);
        for (j, (i, nblocks)) in outs.iter().enumerate() {
            let Some(map) = &maps[*i] else { continue };
            map.eval(p, &mut env, &mut idx)?;
            let mut lin = 0usize;
            for (&x, &n) in idx.iter().zip(nblocks) {
                if x < 0 || x as usize >= n {
                    // Out of range: reported (with its location) when the step runs.
                    return Ok(true);
                }
                lin = lin * n + x as usize;
            }
            let slot = &mut owner[j][lin];
            if *slot == usize::MAX {
                *slot = chunk;
            } else if *slot != chunk {
                ok = false;
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    Ok(if ok { axes } else { Vec::new() })
}

/// Visit every grid point in Pallas order until `f` returns false.
fn for_each_point(grid: &[usize], mut f: impl FnMut(&[i64]) -> Result<bool>) -> Result<()> {
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
fn chunk_key(sizes: &[usize], mut c: usize) -> Vec<i64> {
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
        e.step(&point).map_err(|mut err| {
            err.message += &format!(" (at grid point {point:?})");
            err
        })?;
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

/// The interpreter's side of the schedule: one chunk's machine and the runner's arrays.
struct Chunk<'r, 'a> {
    runner: &'r Runner<'a>,
    m: &'r mut Machine<'a>,
    /// Index-map scratch registers.
    env: Vec<i64>,
}

impl BlockEngine for Chunk<'_, '_> {
    fn block_index(&mut self, i: usize, point: &[i64], idx: &mut Vec<i64>) -> Result<()> {
        match &self.runner.maps[i] {
            Some(map) => map.eval(point, &mut self.env, idx),
            None => Err(internal("an operand without an index map")),
        }
    }

    fn copy_in(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        let block = self.runner.k.operands[i]
            .block
            .as_ref()
            .ok_or_else(|| internal("input without a block"))?;
        self.m.refs[i].content = Some(input_block(
            &self.runner.inputs[n],
            block,
            idx,
            self.runner.poison,
        )?);
        Ok(())
    }

    fn write_back(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        self.runner.write_back(self.m, i, n, idx)
    }

    fn start_output(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        if let Some(old) = self.m.refs[i].content.take() {
            recycle(old);
        }
        self.m.refs[i].written_through = false;
        self.m.dests[i] = self.runner.dest(i, n, idx)?;
        Ok(())
    }

    fn step(&mut self, point: &[i64]) -> Result<()> {
        self.m.step(&self.runner.plan, point)
    }
}

struct Runner<'a> {
    k: &'a Kernel,
    /// Each operand's index map (None for whole-array operands and scratch).
    maps: Vec<Option<IndexMap<'a>>>,
    inputs: &'a [Input],
    sinks: &'a [Sink],
    plan: Plan,
    poison: bool,
}

impl<'a> Runner<'a> {
    fn machine(&self) -> Machine<'a> {
        let refs = self
            .k
            .operands
            .iter()
            .map(|o| RefState {
                dtype: o.dtype,
                shape: o.ref_shape(),
                content: None,
                label: o.label(),
                written_through: false,
            })
            .collect();
        let inputs = self.inputs.iter().map(|a| a.buf.clone()).collect();
        Machine::new(&self.k.body, refs, self.poison, WidenCache::new(inputs))
    }

    /// Run every grid point whose parallel coordinates are `key`, in order, then write back.
    fn chunk(&self, m: &mut Machine<'a>, par_axes: &[usize], key: &[i64]) -> Result<()> {
        let k = self.k;
        let mut input_no = 0;
        for (i, o) in k.operands.iter().enumerate() {
            if let Some(old) = m.refs[i].content.take() {
                recycle(old);
            }
            m.refs[i].written_through = false;
            m.dests[i] = None;
            if o.role == OperandRole::Input {
                if o.block.is_none() {
                    m.refs[i].content = Some(whole(&self.inputs[input_no]));
                }
                input_no += 1;
            }
        }
        let mut chunk = Chunk {
            runner: self,
            m,
            env: Vec::new(),
        };
        walk_grid(k, par_axes, key, &mut chunk)
    }

    /// Copy output ref `i`'s block (block index `idx`) into output array `out_no`, clipped to the array.
    fn write_back(&self, m: &mut Machine<'a>, i: usize, out_no: usize, idx: &[i64]) -> Result<()> {
        let through = std::mem::replace(&mut m.refs[i].written_through, false);
        m.dests[i] = None;
        let r = &mut m.refs[i];
        match r.content.take() {
            // The block was computed in place in the output array.
            None if through => self.mark_written(i, out_no, idx),
            content => {
                let content = content
                    .unwrap_or_else(|| Tensor::splat(fill_literal(r.dtype, self.poison), &r.shape));
                self.write_block(i, out_no, idx, &content)?;
                recycle(content);
                Ok(())
            }
        }
    }

    /// Where block `idx` of output operand `i` sits in its array: element offset, strides of the kernel
    /// dims, the block's kernel shape clipped to the array, and whether it needed clipping.
    fn geometry(&self, i: usize, idx: &[i64]) -> Result<(usize, Vec<usize>, Vec<usize>, bool)> {
        let o = &self.k.operands[i];
        let block = o
            .block
            .as_ref()
            .ok_or_else(|| internal("output without a block"))?;
        let astr = row_major_strides(&o.shape);
        let (mut off, mut strides, mut clipped, mut cut) = (0, Vec::new(), Vec::new(), false);
        for d in 0..o.shape.len() {
            let start = idx[d] as usize * block.block_shape[d];
            off += start * astr[d];
            cut |= start + block.block_shape[d] > o.shape[d];
            if !block.squeezed[d] {
                strides.push(astr[d]);
                clipped.push(block.block_shape[d].min(o.shape[d] - start));
            }
        }
        Ok((off, strides, clipped, cut))
    }

    /// The output array region of block `idx` as a direct destination, if the block lies inside it.
    fn dest(&self, i: usize, out_no: usize, idx: &[i64]) -> Result<Option<RawDest>> {
        let (off, strides, shape, cut) = self.geometry(i, idx)?;
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        Ok((!cut).then_some(RawDest {
            ptr: sink.ptr,
            len: sink.len,
            off,
            strides: strides.into(),
            shape: shape.into(),
            dtype: sink.dtype,
        }))
    }

    /// Write `content` as block `idx` of output array `out_no` (operand `i`), clipped to the array.
    fn write_block(&self, i: usize, out_no: usize, idx: &[i64], content: &Tensor) -> Result<()> {
        let (off, strides, clipped, _) = self.geometry(i, idx)?;
        let zeros = vec![0; clipped.len()];
        let src = content.window(&zeros, &clipped, &vec![false; clipped.len()]);
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        if sink.dtype != src.dtype {
            return Err(internal("output dtype"));
        }
        super::elementwise::with_dtype!(src.dtype, T => {
            // SAFETY: the sink points at a live output buffer with room for `len` elements of this
            // dtype; chunks write disjoint blocks (see `parallel_axes`), and `write_view_raw`
            // bounds-checks each row and only writes (never reads) the destination.
            unsafe { write_view_raw::<T>(sink.ptr as *mut T, sink.len, off, &strides, &src, None)? }
        });
        self.mark_written(i, out_no, idx)
    }

    fn mark_written(&self, i: usize, out_no: usize, idx: &[i64]) -> Result<()> {
        let o = &self.k.operands[i];
        let block = o
            .block
            .as_ref()
            .ok_or_else(|| internal("output without a block"))?;
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        let n: Vec<usize> = o
            .shape
            .iter()
            .zip(&block.block_shape)
            .map(|(a, s)| a.div_ceil(*s))
            .collect();
        let lin = idx
            .iter()
            .zip(&n)
            .fold(0usize, |acc, (&x, &nb)| acc * nb + x as usize);
        if let Some(w) = sink.written.get(lin) {
            w.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A whole input array as a tensor (shares the caller's buffer).
fn whole(a: &Input) -> Tensor {
    Tensor {
        dtype: a.dtype,
        shape: a.shape.as_slice().into(),
        strides: row_major_strides(&a.shape),
        offset: 0,
        buf: a.buf.clone(),
    }
}

fn check_block(block: &BlockIr, shape: &[usize], idx: &[i64], point: &[i64]) -> Result<()> {
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

/// The input block at `idx`: a view of the caller's array, or a padded copy for an edge block that
/// runs past the array (padding reads as the fill value, like unspecified VMEM on the TPU).
fn input_block(a: &Input, block: &BlockIr, idx: &[i64], poison: bool) -> Result<Tensor> {
    let shape = a.shape.as_slice();
    let starts: Vec<usize> = (0..shape.len())
        .map(|d| idx[d] as usize * block.block_shape[d])
        .collect();
    let inside = (0..shape.len()).all(|d| starts[d] + block.block_shape[d] <= shape[d]);
    let w = whole(a);
    if inside {
        return Ok(w.window(&starts, &block.block_shape, &block.squeezed));
    }
    let clipped: Vec<usize> = (0..shape.len())
        .map(|d| block.block_shape[d].min(shape[d] - starts[d]))
        .collect();
    let src = w.window(&starts, &clipped, &block.squeezed);
    let kshape = block.kernel_shape();
    let n = kshape.iter().product();
    let mut data = HostData::filled(fill_literal(a.dtype, poison), n);
    let strides = row_major_strides(&kshape);
    super::elementwise::with_dtype!(a.dtype, T => {
        let dst = T::vec_mut(&mut data).ok_or_else(|| internal("block buffer type"))?;
        write_view(dst, 0, &strides, &src, None)?;
    });
    Ok(Tensor {
        dtype: a.dtype,
        shape: kshape.into(),
        strides,
        offset: 0,
        buf: Buf::host(data),
    })
}

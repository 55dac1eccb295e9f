//! The grid loop with Pallas TPU semantics: steps in row-major order (last axis fastest); each input
//! block is (re)read when its block index changes; each output block is written back when its block index
//! changes and at the end, so an output revisited on consecutive steps keeps its contents; scratch
//! persists across steps.
//!
//! Grid points are split into chunks by their coordinates on the `parallel` axes; each chunk runs its
//! steps in order with its own block buffers and scratch (like a TPU core), and chunks run on the
//! calling thread and the pool's helpers (see `workers`) when no output block is written by two chunks
//! (checked by evaluating the index maps).

use super::elementwise::RawDest;
use super::machine::{fill_literal, Machine, RefState};
use super::plan::{plan, Plan};
use super::tensor::{internal, recycle, row_major_strides, Buf, Foreign, Tensor};
use super::InterpretOptions;
use crate::dtype::DType;
use crate::error::{kerr, KernelError, Result};
use crate::index_map::IndexMap;
use crate::ir::{BlockIr, DimensionSemantics, Func, Kernel, OpKind, OperandRole};
use crate::semantics::host::{
    take_output, ArrayView, ArrayViewMut, HostArray, HostData, HostElement,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

mod steps;
use crate::semantics::schedule::{
    check_arrays, check_data_block, chunk_key, for_each_point, walk_grid, BlockEngine,
};
use steps::Runner;

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

/// One input array as the grid runner reads it.
#[derive(Clone)]
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
    // Their sizes were checked by `build()`; the budget and the allocator may still refuse them.
    let mut budget = opts.memory_limit;
    let mut outputs: Vec<(Vec<usize>, HostData)> = Vec::new();
    for o in k.outputs() {
        let bytes = crate::size::bytes(&o.shape, o.dtype).unwrap_or(u64::MAX);
        let refuse = |why: String| {
            kerr!(
                Memory,
                "output {} ({:?} {}) needs {bytes} bytes: {why}",
                o.index,
                o.shape,
                o.dtype
            )
            .at(o.loc)
        };
        budget = budget.checked_sub(bytes).ok_or_else(|| {
            refuse(format!(
                "past the interpreter's memory limit of {} bytes for this run's outputs (InterpretOptions::memory_limit)",
                opts.memory_limit
            ))
        })?;
        let data = take_output(o.dtype, o.shape.iter().product())
            .map_err(|e| refuse(format!("the system refused the allocation ({e})")))?;
        outputs.push((o.shape.clone(), data));
    }
    let targets: Vec<ArrayViewMut<'_>> = outputs
        .iter_mut()
        .map(|(shape, d)| {
            d.spare_view(shape)
                .ok_or_else(|| internal("output capacity"))
        })
        .collect::<Result<_>>()?;
    execute(k, &inputs, &targets, opts, None)?;
    drop(targets);
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
    prepared: Option<&super::Prepared>,
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
    if let Some(t) = outputs
        .iter()
        .find(|t| !t.is_empty() && !(t.ptr() as usize).is_multiple_of(host_size(t.dtype)))
    {
        return Err(internal(&format!(
            "misaligned {} output buffer at {:p}",
            t.dtype,
            t.ptr()
        )));
    }
    execute(k, &inputs, outputs, opts, prepared)
}

/// `input_output_aliases`: copy each aliased input into its output (which the kernel then updates in
/// place) and return the inputs to read. An input is read as it was before the call: when it is the
/// output's own buffer (XLA aliased them), a private copy is read instead.
///
/// A whole (ANY) output is neither: its contents start as its input's buffer, shared (a write copies
/// them, see `Buf::make_mut`), and are written to the output array once, after the grid
/// (`Runner::whole_output`, `Runner::write_whole`) — so nothing writes the output array while the
/// run reads the input, even when they are one buffer, and the cache a paged kernel updates is
/// copied twice per call, not three times
/// (`aliasing.rs::a_whole_output_aliased_to_its_input_updates_in_place_or_not`).
fn start_aliased_outputs(
    k: &Kernel,
    inputs: &[Input],
    targets: &[ArrayViewMut<'_>],
) -> Result<Vec<Input>> {
    let mut owned = inputs.to_vec();
    let whole: Vec<bool> = k.outputs().map(|o| o.block.is_none()).collect();
    for &(i, o) in &k.aliases {
        let (Some(inp), Some(t)) = (owned.get_mut(i), targets.get(o)) else {
            return Err(internal("input_output_aliases out of range"));
        };
        let n: usize = inp.shape.iter().product();
        if inp.dtype != t.dtype || n > t.len() {
            return Err(internal("aliased input and output differ"));
        }
        if whole.get(o).copied().unwrap_or(false) {
            continue;
        }
        super::elementwise::with_dtype!(inp.dtype, T => {
            let src = inp.buf.slice::<T>().ok_or_else(|| internal("aliased input buffer"))?;
            let src = &src[..n];
            if std::ptr::eq(src.as_ptr().cast::<u8>(), t.ptr().cast_const()) {
                // One buffer for both: read a snapshot, write the buffer.
                inp.buf = Buf::host(T::wrap(src.to_vec()));
            } else {
                // SAFETY: `t` addresses `t.len() >= n` elements of `T` owned by this run's output,
                // which does not overlap the input (distinct allocations, or the same start
                // handled above: XLA aliases whole buffers).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), t.ptr() as *mut T, n) };
            }
        });
    }
    Ok(owned)
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
    let mut counts = p.counts();
    // Loops with independent iterations run across threads only where the grid runs on one.
    if counts.split_loops > 0 {
        let grid_chunks: usize = par.iter().map(|&a| k.grid[a]).product();
        if opts.parallel && grid_chunks <= 1 {
            out.push_str("loops with independent iterations run across threads\n");
        } else {
            out.push_str(
                "loops with independent iterations run in order (the grid's chunks hold the \
                 threads, or parallel is off)\n",
            );
            counts.split_loops = 0;
        }
    }
    out.push_str(&p.describe(&k.body));
    counts.row_bands = coalesced.is_some();
    counts.parallel_axes = par.len();
    Ok((out, counts))
}

/// Launches interpreting now in this process, on any thread (see [`Running`]).
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// One running launch, counted in [`RUNNING`] while it lives. Each launch takes an equal share of
/// rayon's threads: when XLA runs our op on several devices at once (`shard_map` on a CPU mesh) or
/// beside its own work, the launches' own threads already fill the cores, and helpers on top would
/// only queue and spin. Any share gives the same bits (parallel and sequential runs agree bit for
/// bit: `interpret.rs::parallel_and_sequential_runs_agree_bit_for_bit`).
struct Running;

impl Running {
    /// Count this launch in; returns its guard and its number of threads (at least 1).
    fn enter() -> (Running, usize) {
        let now = RUNNING.fetch_add(1, Ordering::Relaxed) + 1;
        (Running, (rayon::current_num_threads() / now).max(1))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Run every grid step of `k`, writing every block of every output into `targets`.
fn execute(
    k: &Kernel,
    inputs: &[Input],
    targets: &[ArrayViewMut<'_>],
    opts: &InterpretOptions,
    prepared: Option<&super::Prepared>,
) -> Result<()> {
    let (_running, threads) = Running::enter();
    // Kernels that never mix rows run over larger row bands (same bits, see `coalesce`).
    let coalesced = if opts.fuse && k.scalar_prefetch == 0 {
        super::coalesce::coalesce(k, threads).or_else(|| super::coalesce::coalesce_rows(k, threads))
    } else {
        None
    };
    // The kernel's own plan when it was prepared (and not coalesced here), else planned now.
    let prepared = prepared.filter(|p| coalesced.is_none() && p.fuse == opts.fuse);
    let k = coalesced.as_ref().unwrap_or(k);
    let planned;
    let plan = match prepared {
        Some(p) => &p.plan,
        None => {
            planned = plan(&k.body, opts.fuse);
            &planned
        }
    };
    let aliased_inputs;
    let inputs = match k.aliases.is_empty() {
        true => inputs,
        false => {
            aliased_inputs = start_aliased_outputs(k, inputs, targets)?;
            &aliased_inputs[..]
        }
    };
    let blocks: Vec<usize> = k.outputs().map(block_count).collect();
    let sinks: Vec<Sink> = targets
        .iter()
        .zip(&blocks)
        .map(|(t, b)| Sink {
            ptr: t.ptr(),
            len: t.len(),
            dtype: t.dtype,
            written: (0..*b).map(|_| AtomicBool::new(false)).collect(),
        })
        .collect();
    // An aliased output already holds its input: blocks the kernel never writes keep it.
    for &(_, o) in &k.aliases {
        if let Some(s) = sinks.get(o) {
            s.written
                .iter()
                .for_each(|w| w.store(true, Ordering::Relaxed));
        }
    }
    // Index maps read the scalar-prefetch operands (the first inputs) in place.
    let prefetch = inputs[..k.scalar_prefetch.min(inputs.len())]
        .iter()
        .map(|a| {
            Ok(crate::check::Prefetched {
                shape: &a.shape,
                data: a
                    .buf
                    .slice::<i32>()
                    .ok_or_else(|| internal("scalar-prefetch operand is not i32"))?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let runner = Runner {
        k,
        maps: k
            .operands
            .iter()
            .map(|o| {
                o.block
                    .as_ref()
                    .map(|b| IndexMap::with_prefetch(&b.index_map, prefetch.clone()))
            })
            .collect(),
        inputs,
        sinks: &sinks,
        plan,
        poison: opts.poison_uninitialized,
        dma_seed: opts.dma_seed,
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
            || runner.machine(1),
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
        // The grid runs on this thread alone: its split loops may use the launch's threads.
        let mut m = runner
            .machine(if opts.parallel { threads } else { 1 })
            .with_background_landing(opts.parallel && rayon::current_num_threads() > 1);
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

/// The parallel axes to split the grid on, or none when two chunks would write the same output block.
fn parallel_axes(k: &Kernel, maps: &[Option<IndexMap<'_>>]) -> Result<Vec<usize>> {
    let axes: Vec<usize> = (0..k.grid.len())
        .filter(|&a| {
            k.dimension_semantics.get(a) == Some(&DimensionSemantics::Parallel) && k.grid[a] > 1
        })
        .collect();
    // Outputs whose blocks depend on scalar-prefetch data: chunks write apart only when every
    // parallel axis is itself one of the block's indices (points of two chunks differ on some parallel
    // axis, so their blocks differ whatever the tables hold); such outputs need no evaluation below.
    let data_dependent = |i: usize| {
        let o = &k.operands[i];
        o.role == OperandRole::Output && maps[i].as_ref().is_some_and(|m| m.reads_data())
    };
    let unproven = (0..k.operands.len()).any(|i| {
        data_dependent(i)
            && !k.operands[i]
                .block
                .as_ref()
                .is_some_and(|b| axes.iter().all(|&a| returns_grid_index(&b.index_map, a)))
    });
    // A whole (ANY) output is written by whichever chunk runs: one chunk.
    let whole_output = k
        .operands
        .iter()
        .any(|o| o.role == OperandRole::Output && o.block.is_none());
    if axes.is_empty() || unproven || whole_output {
        return Ok(Vec::new());
    }
    // Per output: which chunk (linear index of the parallel coordinates) owns each block.
    let outs: Vec<(usize, Vec<usize>)> = k
        .operands
        .iter()
        .enumerate()
        .filter(|(i, o)| o.role == OperandRole::Output && !data_dependent(*i))
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

/// Whether index map `f` returns grid index `axis` itself as one of the block's indices.
fn returns_grid_index(f: &Func, axis: usize) -> bool {
    let Some(arg) = f.body.args.get(axis) else {
        return false;
    };
    f.body
        .ops
        .iter()
        .any(|op| matches!(op.kind, OpKind::Return) && op.operands.contains(arg))
}

//! Driving the compiled module over the grid with the Pallas block schedule
//! (`semantics::schedule::walk_grid`): each operand has one block buffer, the kernel function's ref
//! argument; input blocks are copied in (edge blocks padded with zeros), output blocks start zeroed and
//! are copied back clipped to the array, scratch (VMEM, SMEM and semaphores) persists across steps, and
//! every semaphore must be back at zero when the grid ends. Every output array starts as zeros or,
//! when `input_output_aliases` names it, as its input. Whole-array (ANY) inputs are copied in once;
//! a whole-array (ANY) output's buffer is its array for the whole grid, starting as the array starts
//! and copied out after the grid. Scalar-prefetch operands are copied once into their buffers, the
//! first refs of the kernel function and of every index map. Index maps are the module's own
//! `transform_k` functions, run through the JIT; the blocks of those that read scalar-prefetch data
//! are checked at every step, as the interpreter checks them.
//!
//! This file holds `Compiled` (the launch checked against the kernel, the run) and the grid steps
//! (`Steps`, the schedule's `BlockEngine`: index maps, block copies, kernel calls). Beside it:
//! `run/bytes.rs` (block buffers, host arrays as bytes, a block's rows) and `run/errors.rs` (the error
//! a failed run-time check reports).
//!
//! May depend on: `program.rs` (the rewritten module and its launch), `jit.rs` (the compiled code),
//! `rewrite`'s types and check sites, `semantics` (the block schedule, the error vocabulary); nothing depends on it
//! but `mod.rs`.

mod bytes;
mod errors;

use super::jit::{reset_arena, Jit, Packed};
use super::program::{Program, KERNEL_FN};
use super::rewrite::{Space, Ty, ERR_SLOTS};
use crate::error::{kerr, Result};
use crate::ir::{Kernel, MemSpace, OperandRole, SemKind};
use crate::semantics::dma::{dma_copies_left, semaphore_across_cores, semaphore_left, Release};
use crate::semantics::host::HostArray;
use crate::semantics::schedule::{check_arrays, check_data_block, walk_grid, BlockEngine};
use bytes::{block_rows, elem_size, from_bytes, from_plain_bytes, to_bytes, Buffer};
use errors::sem_label;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// A kernel's Mosaic module, rewritten, lowered and JIT-compiled, ready to run on host arrays.
pub struct Compiled {
    kernel: Kernel,
    program: Program,
    /// Entry points into `_jit`'s code (valid while it lives).
    kernel_fn: Packed,
    /// Per operand: its index-map function.
    transforms: Vec<Option<Transform>>,
    _jit: Jit,
    compile_time: Duration,
}

/// A compiled index map.
struct Transform {
    f: Packed,
    /// How many block indices it returns.
    results: usize,
    /// Whether it reads scalar-prefetch data (its blocks are checked when it runs).
    reads_data: bool,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("kernel", &self.kernel.name)
            .field("compile_time", &self.compile_time)
            .finish_non_exhaustive()
    }
}

impl Compiled {
    /// Check the module's launch against the kernel, then compile it.
    pub(super) fn new(kernel: &Kernel, program: Program, start: Instant) -> Result<Compiled> {
        let k = kernel;
        let mismatch = |what: String| {
            kerr!(
                Lowering,
                "mosaic_cpu: the Mosaic module of `{}` disagrees with its kernel: {what}",
                k.name
            )
        };
        if program.grid != k.grid {
            return Err(mismatch(format!(
                "iteration_bounds {:?}, grid {:?}",
                program.grid, k.grid
            )));
        }
        let n_scratch = k.scratch().count();
        if program.scratch != n_scratch {
            return Err(mismatch(format!(
                "scratch_operands {}, {n_scratch} scratch buffers",
                program.scratch
            )));
        }
        let np = k.scalar_prefetch;
        if program.prefetch != np || k.prefetch().any(|o| o.block.is_some()) {
            return Err(mismatch(format!(
                "scalar_prefetch {}, {np} scalar-prefetch operands",
                program.prefetch
            )));
        }
        // A grid-free module (Pallas's form) has no windows: its blocks are whole arrays.
        let grid_free = k.grid.is_empty() && program.windows.is_empty();
        let n_windows = k.operands.len().saturating_sub(n_scratch + np);
        if !grid_free && program.windows.len() != n_windows {
            return Err(mismatch(format!(
                "{} window_params for {n_windows} inputs and outputs",
                program.windows.len()
            )));
        }
        // The buffers the driver passes: one per operand, of exactly its block (ref) shape and
        // element type; the scalar-prefetch ones (whole arrays) to the index maps too.
        let buffer = |o: &crate::ir::Operand| Ty::Mem {
            shape: o.ref_shape(),
            elem: o.dtype.mlir().into(),
        };
        let i32s = |n: usize| vec![Ty::Scalar("i32".into()); n];
        let mut map_args = i32s(k.grid.len());
        map_args.extend(k.prefetch().map(buffer));
        for (o, w) in k.operands.iter().skip(np).zip(&program.windows) {
            let ok = match (&o.block, w) {
                _ if grid_free => true,
                (None, None) => true,
                (Some(b), Some(w)) => {
                    w.bounds == b.block_shape
                        && w.signature.args == map_args
                        && w.signature.results == i32s(o.shape.len())
                }
                _ => false,
            };
            if !ok {
                return Err(mismatch(format!("the window of {}", o.label())));
            }
        }
        // The kernel function's arguments: one i32 per grid axis, then one buffer per operand.
        let mut want = i32s(k.grid.len());
        want.extend(k.operands.iter().map(buffer));
        if program.kernel_args != want {
            return Err(mismatch(format!(
                "arguments {:?}, expected {want:?}",
                program.kernel_args
            )));
        }
        // Each ref in the memory space the kernel declared it in (an ANY input — HBM when the launch
        // pins them there —, semaphores of their kind).
        for (i, o) in k.operands.iter().enumerate() {
            let want = match o.space {
                MemSpace::Vmem => Space::Vmem,
                MemSpace::Smem => Space::Smem,
                MemSpace::Any if k.any_in_hbm => Space::Hbm,
                MemSpace::Any => Space::Any,
                MemSpace::Sem(SemKind::Dma) => Space::DmaSemaphore,
                MemSpace::Sem(SemKind::Regular) => Space::Semaphore,
            };
            let got = program
                .kernel_spaces
                .get(k.grid.len() + i)
                .copied()
                .flatten();
            if got != Some(want) {
                let got = got.map_or("no memory space".to_string(), |s| format!("{s:?}"));
                return Err(mismatch(format!(
                    "{} is in {got}, declared in {want:?}",
                    o.label()
                )));
            }
        }
        let jit = Jit::compile(&program.text)?;
        let kernel_fn = jit.packed(KERNEL_FN)?;
        let mut transforms = Vec::new();
        for i in 0..k.operands.len() {
            let window = i
                .checked_sub(np)
                .and_then(|w| program.windows.get(w))
                .and_then(|w| w.as_ref());
            transforms.push(match window {
                Some(w) => Some(Transform {
                    f: jit.packed(&w.func)?,
                    results: w.signature.results.len(),
                    reads_data: w.reads_data,
                }),
                None => None,
            });
        }
        Ok(Compiled {
            kernel: k.clone(),
            program,
            kernel_fn,
            transforms,
            _jit: jit,
            compile_time: start.elapsed(),
        })
    }

    /// Time from the emitted module to machine code (rewrite, MLIR passes, LLVM).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The upstream MLIR module the emitted one was rewritten into (before the LLVM conversions).
    pub fn upstream_mlir(&self) -> &str {
        &self.program.text
    }

    /// Run on `inputs` (one per kernel input); returns one array per output, like `interpret`.
    pub fn run(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        let k = &self.kernel;
        check_arrays(
            k,
            OperandRole::Input,
            inputs.iter().map(|a| (a.shape(), a.dtype())),
        )?;
        let inputs: Vec<Vec<u8>> = inputs.iter().map(|a| to_bytes(a.data())).collect();
        let outputs = self.starting_outputs(&inputs)?;
        let mut steps = Steps {
            c: self,
            inputs,
            outputs,
            blocks: k
                .operands
                .iter()
                .map(|o| {
                    Buffer::zeroed(o.ref_shape().iter().product::<usize>() * elem_size(o.dtype))
                })
                .collect(),
        };
        // Whole-array operands are their block: inputs copied in once; (ANY) outputs start as their
        // array starts (zeros, or the aliased input) and are copied out whole after the grid.
        for (i, n) in whole_arrays(k, OperandRole::Input) {
            let src = &steps.inputs[n];
            steps.blocks[i].bytes_mut()[..src.len()].copy_from_slice(src);
        }
        for (i, n) in whole_arrays(k, OperandRole::Output) {
            let src = &steps.outputs[n];
            steps.blocks[i].bytes_mut()[..src.len()].copy_from_slice(src);
        }
        walk_grid(k, &[], &[], &mut steps)?;
        if let Some((label, kind, v)) = semaphore_left_over(&self.kernel, &steps.blocks) {
            return Err(match kind {
                SemKind::Regular => semaphore_left(&label, v, Release::Kernel),
                SemKind::Dma => dma_copies_left(&label, v, Release::Kernel),
            });
        }
        for (i, n) in whole_arrays(k, OperandRole::Output) {
            let dst = &mut steps.outputs[n];
            let len = dst.len();
            dst.copy_from_slice(&steps.blocks[i].bytes()[..len]);
        }
        k.outputs()
            .zip(steps.outputs)
            .map(|(o, bytes)| HostArray::new(&o.shape, from_bytes(o.dtype, &bytes)))
            .collect()
    }

    /// Each output array as the kernel finds it: its aliased input's bytes (`input_output_aliases`:
    /// what the kernel never writes keeps the input, as in the interpreter), else zeros.
    fn starting_outputs(&self, inputs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        let k = &self.kernel;
        k.outputs()
            .enumerate()
            .map(|(n, o)| {
                let len = o.shape.iter().product::<usize>() * elem_size(o.dtype);
                match k.aliases.iter().find(|a| a.1 == n) {
                    None => Ok(vec![0u8; len]),
                    Some(&(i, _)) => match inputs.get(i) {
                        Some(src) if src.len() == len => Ok(src.clone()),
                        _ => Err(kerr!(
                            Lowering,
                            "mosaic_cpu: input {i} cannot alias output {n} of `{}`",
                            k.name
                        )),
                    },
                }
            })
            .collect()
    }
}

/// The first semaphore of `k` not at zero in `blocks` (its name, kind and value), as the interpreter
/// requires at the kernel's end and at the end of a step whose next step may run on another core: a
/// regular one signalled more than waited for, or a DMA semaphore counting bytes of copies never waited
/// for (the copies themselves landed at their start).
fn semaphore_left_over(k: &Kernel, blocks: &[Buffer]) -> Option<(String, SemKind, i64)> {
    for (o, b) in k.operands.iter().zip(blocks) {
        let MemSpace::Sem(kind) = o.space else {
            continue;
        };
        let values: Vec<i32> = from_plain_bytes(b.bytes());
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| **v != 0) {
            return Some((sem_label(&o.label(), &o.shape, i), kind, i64::from(*v)));
        }
    }
    None
}

/// The whole-array (block-less) operands of `role`: (operand index, its number among `role`'s).
fn whole_arrays(k: &Kernel, role: OperandRole) -> impl Iterator<Item = (usize, usize)> + '_ {
    k.operands
        .iter()
        .enumerate()
        .filter(move |(_, o)| o.role == role)
        .enumerate()
        .filter(|(_, (_, o))| o.block.is_none())
        .map(|(n, (i, _))| (i, n))
}

/// One run's state: the arrays as bytes and a buffer per operand.
struct Steps<'c> {
    c: &'c Compiled,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
    blocks: Vec<Buffer>,
}

impl Steps<'_> {
    /// A block picked by scalar-prefetch data must exist (`build()` checked every other index map):
    /// the interpreter's check and message.
    fn block_shape(&self, i: usize) -> Result<&[usize]> {
        self.c.kernel.operands[i]
            .block
            .as_ref()
            .map(|b| b.block_shape.as_slice())
            .ok_or_else(|| kerr!(Lowering, "mosaic_cpu: operand {i} has no block"))
    }
}

impl BlockEngine for Steps<'_> {
    fn block_index(&mut self, i: usize, point: &[i64], idx: &mut Vec<i64>) -> Result<()> {
        let Some(Some(t)) = self.c.transforms.get(i) else {
            if self.c.kernel.grid.is_empty() {
                // Grid-free: every block is its whole array (held by `check`), at block 0.
                idx.clear();
                idx.resize(self.c.kernel.operands[i].shape.len(), 0);
                return Ok(());
            }
            return Err(kerr!(Lowering, "mosaic_cpu: operand {i} has no index map"));
        };
        let n = t.results;
        let mut grid: Vec<i32> = point.iter().map(|p| *p as i32).collect();
        let mut prefetch: Vec<*mut u8> = self.blocks[..self.c.kernel.scalar_prefetch]
            .iter_mut()
            .map(|b| b.words.as_mut_ptr() as *mut u8)
            .collect();
        let mut err = [0i64; ERR_SLOTS];
        let mut err_ptr = err.as_mut_ptr();
        let mut out = vec![0i32; n.max(1)];
        let mut args: Vec<*mut c_void> = grid
            .iter_mut()
            .map(|g| g as *mut i32 as *mut c_void)
            .collect();
        args.extend(
            prefetch
                .iter_mut()
                .map(|p| p as *mut *mut u8 as *mut c_void),
        );
        args.push(&mut err_ptr as *mut *mut i64 as *mut c_void);
        if n > 0 {
            args.push(out.as_mut_ptr() as *mut c_void);
        }
        // SAFETY: `f` is the packed entry of `(i32 × grid, memref × prefetch, memref<8xi64>) ->
        // (i32 × n)` with bare-pointer memrefs: one pointer per i32 argument, one per scalar-prefetch
        // buffer's pointer (`Compiled::new` checked each memref argument has exactly that operand's
        // shape and element type, the size of its buffer; the code bounds-checks every element it
        // reads), one to the error buffer's pointer, then one to room for the result (n consecutive
        // i32s — `Compiled::new` checked the results are n i32s, and an LLVM struct of i32s has that
        // layout). All outlive the call.
        unsafe { (t.f)(args.as_mut_ptr()) };
        if err[0] != 0 {
            return Err(self.c.site_error(&err));
        }
        idx.clear();
        idx.extend(out[..n].iter().map(|x| *x as i64));
        if t.reads_data {
            check_data_block(&self.c.kernel.operands[i], point, idx)?;
        }
        Ok(())
    }

    fn copy_in(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        let o = &self.c.kernel.operands[i];
        let esize = elem_size(o.dtype);
        let block = self.block_shape(i)?.to_vec();
        let src = &self.inputs[n];
        let dst = self.blocks[i].bytes_mut();
        // Edge blocks: what lies past the array reads as zeros.
        dst.fill(0);
        block_rows(&o.shape, &block, idx, esize, |a, b, len| {
            dst[b..b + len].copy_from_slice(&src[a..a + len]);
        });
        Ok(())
    }

    fn write_back(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        let o = &self.c.kernel.operands[i];
        let esize = elem_size(o.dtype);
        let block = self.block_shape(i)?.to_vec();
        let src = self.blocks[i].bytes();
        let dst = &mut self.outputs[n];
        block_rows(&o.shape, &block, idx, esize, |a, b, len| {
            dst[a..a + len].copy_from_slice(&src[b..b + len]);
        });
        Ok(())
    }

    fn start_output(&mut self, i: usize, _n: usize, _idx: &[i64]) -> Result<()> {
        self.blocks[i].bytes_mut().fill(0);
        Ok(())
    }

    fn cross(&mut self, point: &[i64], axis: usize) -> Result<()> {
        match semaphore_left_over(&self.c.kernel, &self.blocks) {
            Some((label, kind, v)) => Err(semaphore_across_cores(
                &label,
                kind == SemKind::Dma,
                v,
                point,
                axis,
            )),
            None => Ok(()),
        }
    }

    fn step(&mut self, point: &[i64]) -> Result<()> {
        let mut grid: Vec<i32> = point.iter().map(|p| *p as i32).collect();
        let mut ptrs: Vec<*mut u8> = self
            .blocks
            .iter_mut()
            .map(|b| b.words.as_mut_ptr() as *mut u8)
            .collect();
        let mut err = [0i64; ERR_SLOTS];
        let mut err_ptr = err.as_mut_ptr();
        let mut args: Vec<*mut c_void> = grid
            .iter_mut()
            .map(|g| g as *mut i32 as *mut c_void)
            .collect();
        args.extend(ptrs.iter_mut().map(|p| p as *mut *mut u8 as *mut c_void));
        args.push(&mut err_ptr as *mut *mut i64 as *mut c_void);
        // SAFETY: the packed entry of the kernel function `(i32 × grid, memref × operands,
        // memref<8xi64>)` with bare-pointer memrefs: one pointer per i32, then one per buffer pointer.
        // `Compiled::new` checked that each memref argument has exactly its operand's block shape and
        // element type, which is the size of the buffer passed; the rewritten code bounds-checks every
        // window it loads or stores, and its own buffers come from the arena. Everything outlives the call.
        unsafe { (self.c.kernel_fn)(args.as_mut_ptr()) };
        reset_arena();
        if err[0] != 0 {
            return Err(self.c.site_error(&err));
        }
        Ok(())
    }
}

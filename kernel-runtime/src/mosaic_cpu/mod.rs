//! Mosaic on CPU: execute the Mosaic module we ship — the module [`crate::mosaic::mlir::build`] builds
//! and verifies — on the CPU, so that every lowering rule is checked by running it. (Nothing else
//! does: a `subf` lowered as `addf` verifies, serializes and compiles in libtpu.) A proof, not a speed
//! path: [`crate::interpret`] is the fast CPU implementation.
//!
//! ```text
//! Kernel ──lower──▶ Mosaic module (verified, the one serialized for libtpu)
//!                     │ program + rewrite: walk its ops through melior; the rules table
//!                     ▼
//!                   upstream MLIR: func, arith, math, memref, scf (text, parsed in a JIT context)
//!                     │ jit: scf→cf, math→llvm, arith/memref/func/cf→llvm; calls of the vector math
//!                     ▼
//!                   LLVM ──ExecutionEngine──▶ machine code (+ kernel_math: exp, tanh, ..., bf16 rounding)
//!                     │ run: semantics::schedule::walk_grid (the Pallas block schedule)
//!                     ▼
//!                   outputs, compared with interpret() by tests/mosaic_cpu.rs
//! ```
//!
//! # The rewrite table (`rules.rs`)
//! Vector values become flat row-major buffers (`memref<N x elem>`, from a per-step arena); refs become
//! the same (the `#tpu.memory_space<vmem|smem|any>` is dropped — on the CPU every space is host
//! memory — after checking the layout is the identity; each ref's space is checked against the
//! kernel's operand), and a ref of semaphores (`semaphore_mem`, `!tpu.dma_semaphore` or
//! `!tpu.semaphore`) a buffer of `i32` counters. A window of a ref (`tpu.memref_slice`,
//! `tpu.memref_squeeze`, `tpu.memref_reshape`) is no buffer: it is a view of its ref's buffer — an
//! offset and strides, sizes static or known at run time (`window.rs`) — that loads, stores, DMA and
//! semaphore ops read and write through; a bitcast view (`tpu.memref_bitcast`) reads and writes the
//! bits of its ref's elements (`views.rs`). A `run_scoped` scope's allocations
//! are buffers of the same kinds (`scope.rs`). Everything an op computes is read from the emitted op:
//!
//! | emitted op | becomes | read from the op |
//! |---|---|---|
//! | `arith.*`, `math.*` (any) | the same op on scalars; on vectors, the same op per element in a loop — except where the vector math defines the op (`math.exp`, `log`, `log1p`, `tanh`, `erf`, `sin`, `cos`, `rsqrt`, `powf`, `floor`, `ceil`, `roundeven`, `arith.remf`, `maximumf`, `minimumf`): a call of its function (`math.rs`); on bf16, the op in f32 and its result rounded once by the vector math's rounding (`scalar.rs`) | name, attributes (`predicate`, `fastmath`, ...) |
//! | `arith.constant` | scalar: kept; vector: the splat value stored into a buffer | `value` (splats only) |
//! | `vector.load` | bounds check, loop nest copying the window (vector dims = trailing ref dims) | indices, ref and result types (a ref in HBM — `any`/`hbm` — is refused) |
//! | `tpu.vector_store` | bounds check, loop nest storing the window, `scf.if` per element when masked | `operandSegmentSizes` (value, base, indices, mask), `strides`; the ref type (HBM refused) |
//! | `memref.load`, `memref.store` (one element of an SMEM ref: a scalar-prefetch table, in the body or an index map; an SMEM scratch cell) | bounds check, the same op at the row-major offset (`memref.rs`) | indices, ref type (HBM refused) |
//! | `vector.broadcast` | loop nest (numpy rules: leading dims added, size-1 dims stretched) | types |
//! | `vector.shape_cast` | the same buffer with the new shape | types |
//! | `vector.multi_reduction` | loop nest folding each kept element's reduced elements into the accumulator | `kind`, `reduction_dims` |
//! | `tpu.matmul` | loop nest: `acc + Σ lhs·rhs` per output element | `dimension_numbers` (contracting, non-contracting and output dims; batch dims unsupported); `transpose_lhs/rhs` must be absent or false |
//! | `tpu.iota` | loop nest storing the index along one dim | `dimensions` |
//! | `tpu.transpose` | loop nest reading through the permutation | `permutation` |
//! | `tpu.assume_multiple` | the operand, after checking the promise at run time | `multiple` |
//! | `tpu.logistic` | the vector math's logistic per element (as `math.*` ops; on bf16 through f32, rounded once) | — |
//! | `tpu.trace_start`, `tpu.trace_stop` (named trace regions) | nothing: profiler markers | — |
//! | `tpu.memref_slice` | a view: the base's offset + Σ start·stride, the starts bounds-checked (out of bounds: an error, and the view placed at the base's origin) | `operandSegmentSizes` (base, i32 starts, i32 run-time sizes for the `?` dims), the result type (sizes); run-time sizes checked per dimension in the interpreter's order, and copies over them loop to the run-time extents |
//! | `tpu.memref_squeeze` | the same view without size-1 dims | types |
//! | `tpu.memref_reshape` | the same (contiguous) view in another shape | the result type |
//! | `tpu.memref_bitcast` | a view whose elements are bits of its ref's: rows packed or unpacked along the second-to-last dimension, lowest bits first (`views.rs`) | the result type |
//! | `tpu.bitcast` | the value's bits by the same rule, element by element | the result type |
//! | `tpu.enqueue_dma` | loop nest copying the source view into the target view (through a temporary when both are in one buffer: the source is read as it was), then `+1` on the DMA semaphore | `operandSegmentSizes` (source, target, target semaphore; the remote and other-core segments unsupported), types |
//! | `tpu.wait_dma` | `-1` on the DMA semaphore; at 0, a `Deadlock` error | `operandSegmentSizes` (as `enqueue_dma`); source and target must be windows of one shape |
//! | `tpu.sem_signal`, `tpu.sem_wait`, `tpu.sem_read` | `+amount`; `-amount`, or a `Deadlock` error when the semaphore holds less; the value | `operandSegmentSizes` of `sem_signal` (no device or core) |
//! | `tpu.region` (`run_scoped`) | its body written in place, then each semaphore it allocated checked back at zero (else a `Race` error at the `run_scoped` line) | — (no operands, results or block arguments) |
//! | `memref.alloca`, `tpu.sem_alloc` (in a `tpu.region`) | a buffer allocated once at the function's entry, zero-filled where the op stands (at every entry of the scope) | the result type (shape, element, memory space) |
//! | `tpu.yield` | nothing (the end of a scope's body) | — (no operands) |
//! | `scf.for` | kept (types mapped, regions rewritten) after checking the step is positive | — |
//! | `scf.if`, `scf.while`, `scf.yield`, `scf.condition`, `func.return` | kept | — |
//!
//! Any op not in the table is an `Unsupported` error naming it and its Rust line; upstream `arith` and
//! `math` ops need no entry (they are all element-wise), so an op added to the lowering later runs here
//! as soon as MLIR lowers it to LLVM — exactly, for IEEE operations; a function the interpreter
//! computes with the vector math needs a row in `math.rs`, or the two engines' bits part (the same-bits
//! test, which runs every float op of the op table, says so). No `math` op becomes a libm call.
//!
//! The kernel function is found by its `iteration_bounds`; its launch is read from the module —
//! `iteration_bounds`, `scalar_prefetch` (that many SMEM refs follow the grid indices, in the kernel
//! function and in every index map), `window_params` (past the scalar-prefetch operands; each
//! `transform_indices` function is rewritten too and run through the JIT to pick blocks),
//! `scratch_operands`, the argument and index-map result types — and must match the kernel's (the
//! array shapes come from the kernel, as the custom call's operands do on the TPU).
//!
//! # Semantics the rewrite chooses
//! MLIR leaves some inputs undefined where XLA (and so the interpreter and the TPU) defines them; the
//! rewrite guards those ops (`scalar.rs`) to XLA's results, so the engine never traps: integer `x / 0 =
//! -1`, `x % 0 = x`, `MIN / -1 = MIN`; float→int casts saturate with NaN → 0; shifts by the bit width
//! or more give 0 (the sign for arithmetic shifts). bf16 arithmetic and math run in f32 and are rounded
//! back after every op by the interpreter's rounding (the vector math's `bf16_bits`: to nearest even,
//! a NaN keeps its sign and leading payload — MLIR's own truncation makes every NaN `0x7fc0`), and an
//! integer cast to bf16 rounds once from the integer (not twice, through f32); bf16 sums
//! (`multi_reduction` add/mul, `tpu.matmul`) accumulate in f32 and round once. The grid runs in order on one core, with
//! one scratch for the whole grid (a TensorCore), through the Pallas block schedule
//! (`semantics::schedule`): blocks picked by the module's index maps, input blocks copied in when
//! their index changes (zero-padded past the array's edge), output blocks written back clipped when it
//! changes and at the end, fresh output blocks and scratch zeroed (the interpreter's unpoisoned fill).
//! Whole-array (`pl.ANY`) inputs are copied once, before the grid, into buffers that only DMA reads.
//! A whole-array (`pl.ANY`, `output_any`) output is no block: the kernel's ref is the output array
//! itself, one buffer for the whole grid, which only DMA writes (a load or store on a ref in HBM is
//! refused: the TPU's vector and scalar units reach VMEM and SMEM only). It starts as its array
//! starts and is copied out whole after the grid (after the semaphore check). Every output array
//! starts as zeros — the interpreter's unpoisoned fill, so what a kernel never writes is zero in both
//! — or, when `input_output_aliases` names it, as a copy of its input (inputs are read as they were
//! before the call): for a blocked output, the blocks the grid visits start zeroed like any fresh
//! output block and are written back, the rest keep the input; for an ANY output, every element the
//! kernel's DMA never writes keeps the input — all as the interpreter does.
//! Scalar-prefetch operands are copied once, before the grid, into buffers every step's kernel call
//! and every index-map call receives; SMEM scratch persists across steps like VMEM scratch. A block
//! chosen by scalar-prefetch data (an index map with a `memref.load`) is checked at every step, as
//! the interpreter checks it: out of range it is an `OutOfBounds` error with the interpreter's message.
//!
//! DMA is synchronous: `tpu.enqueue_dma` copies at once and counts one completed copy on its DMA
//! semaphore; `tpu.wait_dma` takes one (its source and target only size the wait, as on the TPU —
//! they are not the copy). The interpreter completes a copy at its wait or, seeded, anywhere between
//! start and wait; for a kernel without races — which the interpreter checks: a destination read or a
//! source or destination written while the copy is in flight — no completion point changes a result,
//! so both engines agree. Semaphores are `i32` counters in scratch, zero at the start and persisting
//! across grid steps; one core runs the grid in order, so a wait that cannot be satisfied now never
//! will be: `tpu.wait_dma` on a DMA semaphore at 0 and `tpu.sem_wait` for more than the semaphore holds
//! are `Deadlock` errors at the op's Rust line with the interpreter's messages, and a semaphore not
//! back at zero when the grid ends is a `Race` error (the interpreter's message for a regular one; for
//! a DMA semaphore, the copies never waited for — the interpreter reports the copy still in flight,
//! at its start).
//!
//! A nested pipeline (`trace::Pipeline`, Pallas's `emit_pipeline`) needs nothing of its own: it is a
//! `tpu.region` whose two-slot VMEM buffers and DMA semaphores are scoped allocations, an `scf.for`
//! over the inner steps with `tpu.enqueue_dma`/`tpu.wait_dma` between windows of the HBM (ANY) arrays
//! and buffer slots (`tpu.memref_slice` + `tpu.memref_squeeze`), some inside `scf.if`s, and the body's
//! `vector.load`/`tpu.vector_store` on the slots. With synchronous DMA, step `j + 1`'s input copies,
//! started at the top of step `j`, land at once in the other slot; an output copy lands at its start;
//! the waits (step `j`'s own inputs, the output copy of step `j - 2`, the last two after the loop)
//! take the counts. The interpreter checks the schedule for races (`tests/dma.rs` runs it under
//! several seeded completion points), and for a race-free kernel the completion point changes
//! nothing, so both engines give the same bits.
//!
//! A `run_scoped` scope (`tpu.region`) runs in place. Its allocations (`memref.alloca` in VMEM or
//! SMEM, `tpu.sem_alloc`) are fresh at every entry of the scope: zero-filled, like the engine's other
//! fresh memory and the interpreter's unpoisoned scoped buffers, semaphores at zero. Each is one buffer
//! allocated at the kernel function's entry from the per-step arena and zeroed where the allocation
//! stands, so a scope entered in a loop reuses it rather than growing the arena per iteration (a
//! scope cannot be re-entered while it runs). Loads, stores and DMA reach scoped buffers like any
//! ref; errors name them as the interpreter does (`scoped buffer k`, the k-th allocation of its
//! scope). When the scope ends every semaphore it allocated must be back at zero, as the interpreter
//! requires: a regular one is a `Race` error with the interpreter's message at the `run_scoped` line;
//! a DMA semaphore counting copies never waited for is a `Race` error there too (the interpreter
//! reports the copy still in flight, at its start).
//!
//! # What is checked, where
//! `tests/mosaic_cpu.rs`: every example, the op-coverage kernels of `bytecode.rs` (between them every
//! op name in `lower/rules.rs`, every file under `lower/rules/` and `ir/ops.rs`, which the test
//! asserts), the DSL constructs of `dsl.rs`, the grid and
//! dtype semantics kernels of `interpret.rs` and random launches agree with the interpreter — integers
//! and bools exactly, f32 within `1e-5 + 1e-5·|x|`, bf16 within one rounding step (`1e-2 + 2^-7·|x|`):
//! the two engines sum in different orders (the interpreter in 16 lanes and a tree, the engine in
//! order), and nothing else differs; the bf16 rounding chain, integer division and saturating casts
//! bit for bit. Every float op of the op table, on f32 and bf16, gives the same bits in both engines
//! over special values (signed zeros, infinities, NaNs with payloads, signaling NaNs, subnormals, the
//! extremes, the functions' range edges, every pair of them for binary ops) and random inputs (any bit
//! pattern, moderate values, magnitudes over 60 decades). Mutated modules (as
//! data, rebuilt and verified) must run and disagree: `addf`↔`subf`, `tpu.matmul`'s contracting dims
//! swapped, a store's mask dropped, `tpu.iota`'s dimension, `tpu.transpose`'s permutation, a
//! reduction's kind, an output index map, an index map's table read (`idx[i]` → `idx[0]`); a module
//! whose `scalar_prefetch` was dropped is refused. Scalar prefetch and SMEM: tables read by index maps
//! and bodies, prefetched loop bounds and SMEM scratch agree (`tests/common/kernels.rs`), and an
//! out-of-range block from a table, a read past a table in an index map, and SMEM loads and stores
//! out of bounds give the interpreter's error (kind, message, line, operand). DMA and semaphores:
//! `dma_double`, the coverage `dma_kernel`, a two-slot HBM pipeline (copies started in one step,
//! waited for in the next), regular semaphore counts, `sync_copy`, and copies between overlapping
//! windows of one buffer on a 2-D semaphore array agree; a DMA wait nothing signals, a semaphore wait
//! for more than it holds (across steps) and an out-of-bounds DMA window are the interpreter's error
//! (kind, message, line); semaphores left at kernel end are `Race` errors in both; a mutated DMA source
//! window (`tpu.memref_slice` start) disagrees, a dropped `tpu.wait_dma` is an error, and a module
//! that moves the ANY input into VMEM is refused. Scopes: `scoped_call` (a scoped VMEM buffer and DMA
//! semaphore), the coverage `scoped_kernel` (every allocation kind, DMA into and out of a scoped
//! buffer, inside a named trace region) and a scope entered three times per step (its result exact:
//! fresh scratch at every entry) agree; a scoped semaphore left non-zero and an out-of-bounds store
//! into a scoped SMEM buffer are the interpreter's error (kind, message, line), a copy never waited
//! for in its scope is a `Race` in both; a module whose store into a scoped buffer was dropped
//! disagrees. HBM outputs and pipelines: `pipeline_call(rows)` (a nested double-buffered pipeline,
//! HBM inputs and an `output_any`) for 1, 2, 3 and 8 inner steps agrees bit for bit (and is `2x + y`
//! everywhere); a kernel copying a VMEM block into a window of an ANY output per grid step, which
//! leaves every other 8-row band unwritten, agrees bit for bit, those bands zero — or its input's when
//! the output aliases it; a blocked aliased output whose grid visits every other block agrees (the
//! rest keep the input); a pipeline whose output copy lands at row 0 (the HBM window's start
//! mutated) disagrees, and a module whose store writes the ANY output directly is refused. At run
//! time the engine
//! reports, as `KernelError`s at the op's Rust line: out-of-bounds loads and stores (kind
//! `OutOfBounds`, the operand and window starts named, as the interpreter does), out-of-bounds DMA
//! windows, deadlocked waits, semaphores left at kernel or scope end, a broken `multiple_of` promise, a `for`
//! step ≤ 0.
//!
//! # Limits
//! Supported: what the lowering emits today, scalar prefetch, SMEM refs, DMA and semaphores,
//! `run_scoped` scopes, HBM (`pl.ANY`) inputs and outputs, `input_output_aliases` and nested
//! pipelines included.
//! Not supported (an `Unsupported` error): remote or other-core DMA and signals (`source_semaphore`,
//! `device_id`, `core_id` operands), views of windows with run-time sizes, scopes yielding values (`tpu.region`
//! results) and allocations with dynamic sizes, a window of a ref used by anything but
//! DMA and semaphore ops, `tpu.matmul` batch dims, iota over several dims, non-splat vector constants.
//! Refused (a `Lowering` error): a load or store on a ref in HBM (`any`/`hbm`), which would run on the
//! CPU but cannot on the TPU.
//! Not detected here (the interpreter detects them): DMA races — every copy completes at its start, so
//! a kernel that reads a destination before its wait, leaves a copy into a pipelined block across
//! a step, or (a hand-written pipeline) refills a slot before waiting for its copy out, runs here as
//! if it had waited —, a wait on the wrong one of several balanced semaphores
//! (the data were copied at the start), and a copy into or out of a scoped buffer that signals a
//! semaphore from outside the scope and is not waited for when the scope ends (the interpreter reports
//! it in flight; here it completed, and its count is checked where that semaphore's life ends).
//! No poisoning: fresh memory, and what a kernel never writes of an output it does not alias, is zero
//! (compare with the interpreter's default, unpoisoned run; on the TPU it is undefined). Speed: the JIT compiles at LLVM O0 (10–70 ms per kernel here; O1–O3 cost
//! 5–40× more and the runs were no faster: a run's time is the host's block copies and O0 loops);
//! a 512³ bf16 matmul runs in ~130 ms.

mod dma;
mod jit;
mod math;
mod memref;
mod program;
mod rewrite;
mod rules;
mod run;
mod scalar;
mod scope;
mod views;
mod window;

pub use run::Compiled;

use crate::error::Result;
use crate::ir::Kernel;
use crate::semantics::host::HostArray;
use melior::ir::Module;
use std::time::Instant;

/// Run `kernel` on `inputs` by executing its Mosaic module: one host array per input, in order;
/// returns one per output, like [`crate::interpret::interpret`].
pub fn run(kernel: &Kernel, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
    compile(kernel)?.run(inputs)
}

/// Lower `kernel` to its Mosaic module (verified) and compile that module for the CPU. A kernel that
/// talks across devices is refused: this engine runs one device (the interpreter's `interpret_spmd`
/// runs every device of a mesh).
pub fn compile(kernel: &Kernel) -> Result<Compiled> {
    if kernel.communicates() {
        return Err(crate::error::kerr!(
            Unsupported,
            "Mosaic-on-CPU runs one device, and kernel `{}` talks to the other devices of its mesh (remote copies, remote signals or the barrier semaphore): run it in interpret mode on every device with `interpret_spmd`",
            kernel.name
        ));
    }
    crate::mosaic::mlir::with_context(|ctx| {
        let module = crate::mosaic::mlir::build(ctx, &crate::lower::lower_module(kernel)?)?;
        compile_module(kernel, &module)
    })
}

/// Compile a Mosaic `module` for `kernel` — its launch (arrays, BlockSpecs) is `kernel`'s, checked
/// against the module's launch attributes; what runs is the module.
pub fn compile_module(kernel: &Kernel, module: &Module<'_>) -> Result<Compiled> {
    let start = Instant::now();
    let program = program::rewrite(kernel, module)?;
    Compiled::new(kernel, program, start)
}

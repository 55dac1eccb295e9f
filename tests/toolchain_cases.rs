//! Edge cases for the negative-agreement suite (`python/tests/test_agreement.py`): each case is a Rust
//! kernel launch whose `build()` verdict (accept, or a `KernelError`) must agree with libtpu's verdict on
//! the same kernel, on v5e and v6e.
//!
//! libtpu can only judge a kernel we emit, so a case our checks reject also has a *probe*: the same kernel
//! built in a legal form and then changed in the IR past the check (a smaller VMEM limit, another block
//! shape) — exactly what we would emit if the check were missing. Cases we accept are their own probe.
//!
//! `cargo test --test toolchain_cases` checks the Rust side alone (each case's verdict is as declared).
//! With `TPU_KERNEL_CASES_OUT=DIR`, the ignored test `export_cases` writes `DIR/cases.json` and each
//! probe's StableHLO for the Python suite, plus the bodies of one kernel at every supported
//! `stable_mosaic` version (for the serializer's downgrade rules).

use std::fmt::Write as _;
use tpu_kernel::check;
use tpu_kernel::prelude::*;
use tpu_kernel::runtime::serialize::{CallOptions, CustomCall, MAX_VERSION, MIN_VERSION};
use tpu_kernel::{ErrorKind, PallasCall};

#[path = "common/kernels.rs"]
mod kernels;

type Build = fn() -> Result<PallasCall, KernelError>;

struct Case {
    name: &'static str,
    what: &'static str,
    /// The launch as a user writes it: its `build()` gives our verdict.
    ours: Build,
    /// The same kernel with our check bypassed (cases we reject); `None`: `ours` is the probe.
    probe: Option<Build>,
    /// Our expected verdict: `None` accept, `Some(kind)` reject.
    expect: Option<ErrorKind>,
}

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------- kernels

fn copy_kernel<T: tpu_kernel::dtype::Element>(x: Ref<T>, o: RefMut<T>) {
    o.store(x.load());
}

fn scratch_kernel(x: Ref<f32>, o: RefMut<f32>, buf: RefMut<f32>) {
    // Accumulate, so the scratch cannot be forwarded away (libtpu drops a store-then-load buffer).
    let part = buf.at((ds(0, 512), ..));
    part.store(part.load() + x.load());
    o.store(part.load());
}

fn sin_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().sin());
}

fn exp_bf16_kernel(x: Ref<bf16>, o: RefMut<bf16>) {
    o.store(x.load().exp());
}

fn div_i32_kernel(x: Ref<i32>, y: Ref<i32>, o: RefMut<i32>) {
    o.store(x.load() / y.load());
}

fn dot_i8_kernel(x: Ref<i8>, y: Ref<i8>, o: RefMut<i32>) {
    o.store(dot(x.load(), y.load()));
}

fn dot_f32_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    o.store(dot(x.load(), y.load()));
}

#[tpu_kernel]
fn float_ne_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    // Float `!=` and a float -> bool cast: both `x != y` comparisons, which libtpu accepts only as
    // ordered predicates (tpu-kernel lowers them as `!(x oeq y)`).
    let ne = x.load() != y.load();
    o.store(select(ne, x.load().cast::<bool>().cast::<f32>(), 0.0));
}

// Static slices of values (`vector.extract_strided_slice`): libtpu compiles every static stride-1
// slice we measured, tile-aligned or not, so `slice` checks bounds only; these cases keep that true.
#[tpu_kernel]
fn slice_lanes_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    o.store(
        a.slice((.., 1..2)).broadcast_to([8, 128]) + a.slice((.., 1..129)) + a.slice((.., 128..)),
    );
}

#[tpu_kernel]
fn slice_rows_kernel(x: Ref<bf16>, o: RefMut<bf16>) {
    let a = x.load();
    o.store(
        a.slice((3..11, ..)) * a.slice((16..24, ..)) + a.slice((31.., ..)).broadcast_to([8, 128]),
    );
}

#[tpu_kernel]
fn slice_index_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let row = a.slice((5, ..)).reshape([1, 128]).broadcast_to([8, 128]);
    let col = a.slice((.., 7)).reshape([8, 1]).broadcast_to([8, 128]);
    o.store(row + col);
}

#[tpu_kernel]
fn slice_i8_kernel(x: Ref<i8>, o: RefMut<i8>) {
    let a = x.load();
    o.store(a.slice((.., 1..129)));
}

#[tpu_kernel]
fn slice_3d_kernel(x: Ref<i32>, o: RefMut<i32>) {
    o.store(x.load().slice((1..2, 3..4, 7..8)).broadcast_to([1, 8, 128]));
}

fn slice_case(
    kernel: fn(Ref<f32>, RefMut<f32>),
    name: &str,
    input: [usize; 2],
) -> Result<PallasCall, KernelError> {
    pallas_call(kernel)
        .name(name)
        .grid([1])
        .input(
            ArrayType::new(input, F32),
            BlockSpec::new(input, |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .build()
}

fn slice_lanes_case() -> Result<PallasCall, KernelError> {
    slice_case(slice_lanes_kernel, "slice_lanes_kernel", [8, 256])
}

fn slice_index_case() -> Result<PallasCall, KernelError> {
    slice_case(slice_index_kernel, "slice_index_kernel", [8, 128])
}

fn slice_rows_case() -> Result<PallasCall, KernelError> {
    pallas_call(slice_rows_kernel)
        .grid([1])
        .input(
            ArrayType::new([32, 128], BF16),
            BlockSpec::new([32, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], BF16),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .build()
}

fn slice_i8_case() -> Result<PallasCall, KernelError> {
    pallas_call(slice_i8_kernel)
        .grid([1])
        .input(
            ArrayType::new([32, 256], I8),
            BlockSpec::new([32, 256], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([32, 128], I8),
            BlockSpec::new([32, 128], |[_]| (0, 0)),
        )
        .build()
}

fn slice_3d_case() -> Result<PallasCall, KernelError> {
    pallas_call(slice_3d_kernel)
        .grid([1])
        .input(
            ArrayType::new([4, 8, 128], I32),
            BlockSpec::new([4, 8, 128], |[_]| (0, 0, 0)),
        )
        .output(
            ArrayType::new([1, 8, 128], I32),
            BlockSpec::new([1, 8, 128], |[_]| (0, 0, 0)),
        )
        .build()
}

// The small gaps of issue 11: `ref += value` (whole ref, a dynamic window, an SMEM element, inside a
// traced loop), an unrolled loop, a bound parameter, and Pallas's `preferred_element_type=f32` then
// `.astype(bf16)`.
#[tpu_kernel]
fn ref_add_assign_kernel(x: Ref<f32>, o: RefMut<f32>, count: RefMut<i32, Smem>, scale: f32) {
    if program_id(0) == 0 {
        count.at(0).store(0);
    }
    count.at(0) += 1;
    o.store(zeros());
    for i in 0..4 {
        o.at((ds(multiple_of(i * 8, 8), 8), ..)) += x.at((ds(multiple_of(i * 8, 8), 8), ..)).load();
    }
    o *= scale;
    o += count.at(0).load().cast::<f32>();
}

fn ref_add_assign_case() -> Result<PallasCall, KernelError> {
    pallas_call(ref_add_assign_kernel.bind(0.5))
        .grid([2])
        .input(
            ArrayType::new([64, 128], F32),
            BlockSpec::new([32, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([64, 128], F32),
            BlockSpec::new([32, 128], |[i]| (i, 0)),
        )
        .scratch(Smem::new([1], I32))
        .build()
}

#[tpu_kernel]
fn unroll_kernel(x: Ref<bf16>, o: RefMut<f32>) {
    let a = x.load().cast::<f32>(); // [32, 256]
    let mut acc = zeros_like(o);
    for p in unroll(0..4) {
        acc += a.slice((p * 8..p * 8 + 8, ..128)) * (p + 1) as f32;
    }
    o.store(acc);
    for p in unroll((0..128).step_by(64)) {
        o.at((.., p..p + 64))
            .store(acc.slice((.., p..p + 64)) + a.slice((..8, 128 + p..192 + p)));
    }
}

fn unroll_case() -> Result<PallasCall, KernelError> {
    pallas_call(unroll_kernel)
        .grid([1])
        .input(
            ArrayType::new([32, 256], BF16),
            BlockSpec::new([32, 256], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .build()
}

#[tpu_kernel]
fn dot_bf16_out_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<bf16>) {
    o.store(dot(x.load(), y.load()).cast::<bf16>());
}

fn dot_bf16_out_case() -> Result<PallasCall, KernelError> {
    pallas_call(dot_bf16_out_kernel)
        .grid([2])
        .input(
            ArrayType::new([256, 256], BF16),
            BlockSpec::new([128, 256], |[i]| (i, 0)),
        )
        .input(
            ArrayType::new([256, 128], BF16),
            BlockSpec::new([256, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([256, 128], BF16),
            BlockSpec::new([128, 128], |[i]| (i, 0)),
        )
        .build()
}

fn add_bias_kernel(x: Ref<f32>, w: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() + w.load());
}

// ---------------------------------------------------------------------------------------------- launches

/// `o = x` over rows: array `[rows * steps, cols]`, block `[rows, cols]`, `steps` grid steps.
fn copy_rows<T: tpu_kernel::dtype::Element>(
    rows: usize,
    cols: usize,
    steps: usize,
    limit: Option<u64>,
) -> Result<PallasCall, KernelError> {
    let d = T::DTYPE;
    let spec = || BlockSpec::new([rows, cols], |[i]| (i, 0));
    let mut b = pallas_call(copy_kernel::<T>)
        .name("copy_kernel")
        .grid([steps])
        .input(ArrayType::new([rows * steps, cols], d), spec())
        .output(ArrayType::new([rows * steps, cols], d), spec())
        .dimension_semantics([Parallel]);
    if let Some(l) = limit {
        b = b.vmem_limit_bytes(l);
    }
    b.build()
}

/// `o = x` with a 2-D block `block` on array `array`, the grid walking the blocks.
fn copy_block(array: [usize; 2], block: [usize; 2]) -> Result<PallasCall, KernelError> {
    let grid = [array[0].div_ceil(block[0]), array[1].div_ceil(block[1])];
    pallas_call(copy_kernel::<f32>)
        .name("copy_kernel")
        .grid(grid)
        .input(
            ArrayType::new(array, F32),
            BlockSpec::new(block, |[i, j]| [i, j]),
        )
        .output(
            ArrayType::new(array, F32),
            BlockSpec::new(block, |[i, j]| [i, j]),
        )
        .dimension_semantics([Parallel, Parallel])
        .build()
}

/// The IR of `call` with every 2-D block shape `from` (and the values of that shape) changed to `to`.
fn reblock(
    call: Result<PallasCall, KernelError>,
    from: [usize; 2],
    to: [usize; 2],
) -> Result<PallasCall, KernelError> {
    use tpu_kernel::ir::{OpKind, Region, Type};
    let mut call = call?;
    let k = call.unchecked_ir_mut();
    for o in &mut k.operands {
        if let Some(b) = &mut o.block {
            if b.block_shape == from {
                b.block_shape = to.to_vec();
            }
        }
    }
    for t in &mut k.body.values {
        if let Type::Ref(s, _, _) | Type::Vector(s, _) = t {
            if *s == from {
                *s = to.to_vec();
            }
        }
    }
    fn patch(r: &mut Region, from: [usize; 2], to: [usize; 2]) {
        for op in &mut r.ops {
            if let OpKind::Load(w) | OpKind::Store { window: w, .. } = &mut op.kind {
                if w.sizes == from {
                    w.sizes = to.to_vec();
                }
            }
            for reg in &mut op.regions {
                patch(reg, from, to);
            }
        }
    }
    patch(&mut k.body.body, from, to);
    Ok(call)
}

/// `call` with the VMEM limit changed after the checks ran.
fn with_limit(
    call: Result<PallasCall, KernelError>,
    limit: u64,
) -> Result<PallasCall, KernelError> {
    let mut call = call?;
    call.unchecked_ir_mut().vmem_limit_bytes = Some(limit);
    Ok(call)
}

/// `call` as it would be launched without `.vmem_limit_bytes(..)`, after the checks ran.
fn without_limit(call: Result<PallasCall, KernelError>) -> Result<PallasCall, KernelError> {
    let mut call = call?;
    call.unchecked_ir_mut().vmem_limit_bytes = None;
    Ok(call)
}

fn unary_f32(kernel: fn(Ref<f32>, RefMut<f32>), name: &str) -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([256, 256], |[i, j]| [i, j]);
    pallas_call(kernel)
        .name(name)
        .grid([2, 2])
        .input(ArrayType::new([512, 512], F32), spec())
        .output(ArrayType::new([512, 512], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

// ---------------------------------------------------------------------------------------------- cases

/// 16 MiB: the v5e default scoped VMEM limit (measured; v6e's is 32 MiB) and our default.
const ROWS_AT_16_MIB: usize = 1024; // f32 [1024, 1024] blocks: 2 operands x 2 buffers x 4 MiB

const CASES: &[Case] = &[
    Case {
        name: "vmem_just_under_default",
        what: "copy, f32 [1016, 1024] blocks double-buffered: 15.875 MiB of the default 16 MiB",
        ours: || copy_rows::<f32>(ROWS_AT_16_MIB - 8, 1024, 4, None),
        probe: None,
        expect: None,
    },
    Case {
        name: "vmem_exactly_default",
        what: "copy, f32 [1024, 1024] blocks: exactly 16 MiB",
        ours: || copy_rows::<f32>(ROWS_AT_16_MIB, 1024, 4, None),
        probe: None,
        expect: None,
    },
    Case {
        name: "vmem_just_over_default",
        what: "copy, f32 [1032, 1024] blocks: 16.125 MiB > 16 MiB",
        ours: || copy_rows::<f32>(ROWS_AT_16_MIB + 8, 1024, 4, None),
        probe: Some(|| without_limit(copy_rows::<f32>(ROWS_AT_16_MIB + 8, 1024, 4, Some(64 * MIB)))),
        expect: Some(ErrorKind::Vmem),
    },
    Case {
        name: "vmem_raised_limit",
        what: "the same 16.125 MiB with vmem_limit_bytes = 17 MiB",
        ours: || copy_rows::<f32>(ROWS_AT_16_MIB + 8, 1024, 4, Some(17 * MIB)),
        probe: None,
        expect: None,
    },
    Case {
        name: "vmem_limit_one_byte_short",
        what: "16.125 MiB of blocks with a limit one byte below it",
        ours: || copy_rows::<f32>(ROWS_AT_16_MIB + 8, 1024, 4, Some(16 * MIB + 128 * 1024 - 1)),
        probe: Some(|| with_limit(copy_rows::<f32>(ROWS_AT_16_MIB + 8, 1024, 4, Some(64 * MIB)), 16 * MIB + 128 * 1024 - 1)),
        expect: Some(ErrorKind::Vmem),
    },
    Case {
        name: "vmem_scratch_pushes_over",
        what: "8 MiB of double-buffered blocks + a 9 MiB VMEM scratch buffer (single) > 16 MiB",
        ours: || scratch_case(None),
        probe: Some(|| without_limit(scratch_case(Some(64 * MIB)))),
        expect: Some(ErrorKind::Vmem),
    },
    Case {
        name: "vmem_grid_invariant_block_single_buffered",
        what: "an 8 MiB block with a constant index map is single-buffered: 8 + 2x2 MiB fits 16 MiB (20 if double)",
        ours: invariant_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "bf16_block_rows_multiple_of_8",
        what: "bf16 [24, 1024] blocks with a limit of exactly 4 x 24 x 1024 x 2 bytes (rows pad to 8, not 16)",
        ours: || copy_rows::<bf16>(24, 1024, 4, Some(4 * 24 * 1024 * 2)),
        probe: Some(|| with_limit(copy_rows::<bf16>(24, 1024, 4, Some(MIB)), 4 * 24 * 1024 * 2)),
        expect: None,
    },
    Case {
        name: "block_rows_not_multiple_of_8",
        what: "f32 block [4, 128] of a [16, 128] array: second-to-last dim neither a multiple of 8 nor the array's",
        ours: || copy_block([16, 128], [4, 128]),
        probe: Some(|| reblock(copy_block([16, 128], [8, 128]), [8, 128], [4, 128])),
        expect: Some(ErrorKind::Tiling),
    },
    Case {
        name: "block_lanes_not_multiple_of_128",
        what: "f32 block [8, 64] of an [8, 256] array: last dim neither a multiple of 128 nor the array's",
        ours: || copy_block([8, 256], [8, 64]),
        probe: Some(|| reblock(copy_block([8, 256], [8, 128]), [8, 128], [8, 64])),
        expect: Some(ErrorKind::Tiling),
    },
    Case {
        name: "odd_block_equal_to_array",
        what: "f32 block [10, 200] equal to the whole [10, 200] array: allowed although not (8, 128)-aligned",
        ours: || copy_block([10, 200], [10, 200]),
        probe: None,
        expect: None,
    },
    Case {
        name: "sin_f32",
        what: "elementwise sine on f32 blocks",
        ours: || unary_f32(sin_kernel, "sin_kernel"),
        probe: None,
        expect: None,
    },
    Case {
        name: "exp_bf16",
        what: "exp on bf16 blocks (no bf16 EUP on v5e: Mosaic widens)",
        ours: exp_bf16_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "int_division_i32",
        what: "elementwise i32 division",
        ours: div_i32_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "dot_i8_to_i32",
        what: "int8 matmul accumulating in i32",
        ours: dot_case_i8,
        probe: None,
        expect: None,
    },
    Case {
        name: "dot_f32",
        what: "f32 matmul [128, 256] x [256, 128]",
        ours: dot_f32_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "float_ne",
        what: "float != and a float -> bool cast (libtpu rejects cmpf une)",
        ours: float_ne_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "smem_prefetch_table",
        what: "a 2-D scalar-prefetch table read by an index map and by the body (memref.load in SMEM)",
        ours: kernels::table_call,
        probe: None,
        expect: None,
    },
    Case {
        name: "slice_unaligned_lanes",
        what: "f32 value slices x[:, 1:2], x[:, 1:129], x[:, 128:] (not lane-tile aligned)",
        ours: slice_lanes_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "smem_prefetch_loop_bound",
        what: "a prefetched length as an scf.for bound and an scf.if condition",
        ours: kernels::lengths_call,
        probe: None,
        expect: None,
    },
    Case {
        name: "slice_unaligned_rows_bf16",
        what: "bf16 value slices x[3:11], x[16:24], x[31:] (not sublane-tile aligned)",
        ours: slice_rows_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "dma_double_buffered",
        what: "a two-slot DMA pipeline from HBM across grid steps (enqueue_dma / wait_dma on sliced buffers and semaphores)",
        ours: kernels::pipelined_call,
        probe: None,
        expect: None,
    },
    Case {
        name: "slice_index_squeezes",
        what: "x[5] and x[:, 7] on an f32 value (slice + shape_cast dropping a dimension)",
        ours: slice_index_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "named_trace_regions",
        what: "nested named_scope regions (tpu.trace_start / tpu.trace_stop) around a softmax",
        ours: kernels::regions_call,
        probe: None,
        expect: None,
    },
    Case {
        name: "run_scoped_region",
        what: "run_scoped: a tpu.region allocating a VMEM buffer and a DMA semaphore (memref.alloca, tpu.sem_alloc)",
        ours: kernels::scoped_call,
        probe: None,
        expect: None,
    },
    Case {
        name: "nested_pipeline",
        what: "Pipeline::run: a double-buffered pipeline of 8 steps over HBM inputs and an HBM output (output_any)",
        ours: || kernels::pipeline_call(64),
        probe: None,
        expect: None,
    },
    Case {
        name: "smem_scratch_counter",
        what: "an SMEM scratch cell written and read across grid steps (memref.store / memref.load)",
        ours: kernels::counter_call,
        probe: None,
        expect: None,
    },
    Case {
        name: "slice_i8_unaligned",
        what: "i8 value slice x[:, 1:129]",
        ours: slice_i8_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "slice_3d_i32",
        what: "i32 value slice x[1:2, 3:4, 7:8] broadcast back to a tile",
        ours: slice_3d_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "ref_add_assign",
        what: "`o += v` on a whole ref, dynamic windows in an scf.for and an SMEM cell; a bound f32 parameter",
        ours: ref_add_assign_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "unrolled_loop",
        what: "`for p in unroll(..)`: the body traced per p (static slices at p * 8), no scf.for",
        ours: unroll_case,
        probe: None,
        expect: None,
    },
    Case {
        name: "dot_bf16_out",
        what: "Pallas's jnp.dot(.., preferred_element_type=f32).astype(bf16): tpu.matmul into f32, arith.truncf",
        ours: dot_bf16_out_case,
        probe: None,
        expect: None,
    },
];

fn scratch_case(limit: Option<u64>) -> Result<PallasCall, KernelError> {
    // x, o: [512, 1024] f32 blocks (2 MiB each, x2 buffers = 8 MiB); scratch [2304, 1024] f32 = 9 MiB.
    let spec = || BlockSpec::new([512, 1024], |[i]| (i, 0));
    let mut b = pallas_call(scratch_kernel)
        .name("scratch_kernel")
        .grid([2])
        .input(ArrayType::new([1024, 1024], F32), spec())
        .output(ArrayType::new([1024, 1024], F32), spec())
        .scratch(Vmem::new([2304, 1024], F32))
        .dimension_semantics([Parallel]);
    if let Some(l) = limit {
        b = b.vmem_limit_bytes(l);
    }
    b.build()
}

fn invariant_case() -> Result<PallasCall, KernelError> {
    pallas_call(add_bias_kernel)
        .name("add_bias_kernel")
        .grid([8])
        .input(
            ArrayType::new([4096, 1024], F32),
            BlockSpec::new([512, 1024], |[i]| (i, 0)),
        )
        .input(
            ArrayType::new([2048, 1024], F32),
            BlockSpec::new([512, 1024], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([4096, 1024], F32),
            BlockSpec::new([512, 1024], |[i]| (i, 0)),
        )
        .dimension_semantics([Parallel])
        .vmem_limit_bytes(11 * MIB)
        .build()
}

fn exp_bf16_case() -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([256, 256], |[i, j]| [i, j]);
    pallas_call(exp_bf16_kernel)
        .name("exp_bf16_kernel")
        .grid([2, 2])
        .input(ArrayType::new([512, 512], BF16), spec())
        .output(ArrayType::new([512, 512], BF16), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

fn div_i32_case() -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([256, 256], |[i, j]| [i, j]);
    pallas_call(div_i32_kernel)
        .name("div_i32_kernel")
        .grid([2, 2])
        .input(ArrayType::new([512, 512], I32), spec())
        .input(ArrayType::new([512, 512], I32), spec())
        .output(ArrayType::new([512, 512], I32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

fn float_ne_case() -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([256, 256], |[i, j]| [i, j]);
    pallas_call(float_ne_kernel)
        .name("float_ne_kernel")
        .grid([2, 2])
        .input(ArrayType::new([512, 512], F32), spec())
        .input(ArrayType::new([512, 512], F32), spec())
        .output(ArrayType::new([512, 512], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

fn dot_case_i8() -> Result<PallasCall, KernelError> {
    pallas_call(dot_i8_kernel)
        .name("dot_i8_kernel")
        .grid([2])
        .input(
            ArrayType::new([256, 256], I8),
            BlockSpec::new([128, 256], |[i]| (i, 0)),
        )
        .input(
            ArrayType::new([256, 128], I8),
            BlockSpec::new([256, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([256, 128], I32),
            BlockSpec::new([128, 128], |[i]| (i, 0)),
        )
        .dimension_semantics([Parallel])
        .build()
}

fn dot_f32_case() -> Result<PallasCall, KernelError> {
    pallas_call(dot_f32_kernel)
        .name("dot_f32_kernel")
        .grid([2])
        .input(
            ArrayType::new([256, 256], F32),
            BlockSpec::new([128, 256], |[i]| (i, 0)),
        )
        .input(
            ArrayType::new([256, 128], F32),
            BlockSpec::new([256, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([256, 128], F32),
            BlockSpec::new([128, 128], |[i]| (i, 0)),
        )
        .dimension_semantics([Parallel])
        .build()
}

// ---------------------------------------------------------------------------------------------- tests

#[test]
fn verdicts_are_as_declared() {
    assert!(CASES.len() >= 10);
    for c in CASES {
        let got = (c.ours)().err().map(|e| e.kind);
        assert_eq!(
            got,
            c.expect,
            "case `{}` ({}): {:?}",
            c.name,
            c.what,
            (c.ours)().err()
        );
        if c.expect.is_some() {
            let probe = c
                .probe
                .unwrap_or_else(|| panic!("case `{}` is rejected but has no probe", c.name));
            let p = probe().unwrap_or_else(|e| panic!("probe of `{}` failed: {e}", c.name));
            CustomCall::new(p.ir())
                .stablehlo()
                .unwrap_or_else(|e| panic!("probe of `{}`: {e}", c.name));
        }
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[test]
#[ignore = "exports the cases for python/tests/test_agreement.py (needs TPU_KERNEL_CASES_OUT; TPU_KERNEL_CASES_TARGET picks the generation, v5e by default)"]
fn export_cases() {
    let dir = std::path::PathBuf::from(
        std::env::var("TPU_KERNEL_CASES_OUT").expect("set TPU_KERNEL_CASES_OUT"),
    );
    // Every case and probe built for the generation libtpu judges them on: our verdict is the one
    // for that target (its VMEM limits), the probe carries its scoped VMEM limit.
    let target = std::env::var("TPU_KERNEL_CASES_TARGET")
        .map(|t| Target::parse(&t).expect("TPU_KERNEL_CASES_TARGET"))
        .unwrap_or_default();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let mut rows = Vec::new();
    for c in CASES {
        let verdict = target.scope(c.ours);
        let probe = target
            .scope(|| match c.probe {
                Some(p) => p(),
                None => (c.ours)(),
            })
            .unwrap_or_else(|e| panic!("case `{}`: no probe kernel: {e}", c.name));
        let hlo = CustomCall::new(probe.ir())
            .stablehlo()
            .expect("StableHLO of the probe");
        let file = format!("{}.stablehlo.mlir", c.name);
        std::fs::write(dir.join(&file), hlo).expect("write the StableHLO");
        let (ours, kind, message) = match &verdict {
            Ok(_) => ("accept", String::new(), String::new()),
            Err(e) => ("reject", format!("{:?}", e.kind), e.to_string()),
        };
        rows.push(format!(
            "{{\"name\": {}, \"what\": {}, \"ours\": \"{ours}\", \"kind\": {}, \"message\": {}, \"vmem_estimate\": {}, \"vmem_limit\": {}, \"stablehlo\": {}}}",
            json_string(c.name),
            json_string(c.what),
            json_string(&kind),
            json_string(&message),
            check::vmem_estimate(probe.ir()),
            check::vmem_limit(probe.ir()),
            json_string(&file)
        ));
    }
    std::fs::write(
        dir.join("cases.json"),
        format!("[\n{}\n]\n", rows.join(",\n")),
    )
    .expect("write cases.json");

    // One kernel with a matmul and stores at every supported version: the downgrade rules at work.
    let call = dot_f32_case().expect("dot_f32 builds");
    std::fs::write(
        dir.join("versions.mosaic.mlir"),
        call.mosaic_mlir_generic().expect("Mosaic text"),
    )
    .expect("write");
    for v in MIN_VERSION..=MAX_VERSION {
        let opts = CallOptions {
            version: v,
            ..CallOptions::default()
        };
        let body = CustomCall::with_options(call.ir(), opts)
            .body()
            .expect("body");
        std::fs::write(dir.join(format!("versions.body.v{v}.mlirbc")), body).expect("write");
    }
}

//! Kernels shared by the interpreter, DSL and Mosaic-on-CPU suites (the same kernel run by each
//! engine). Kernels whose tests check source lines stay in their own files.
#![allow(dead_code)] // each suite uses some of them

use tpu_kernel::prelude::*;

#[tpu_kernel]
pub fn control_flow_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    // else-if chain producing a value.
    let v = if i == 0 {
        x.load()
    } else if i == 1 {
        x.load() * 2.0
    } else {
        x.load() * 3.0
    };
    // A loop with a traced upper bound and two carried values.
    let mut acc = v;
    let mut steps = scalar(0i32);
    for _k in 0..i + 1 {
        acc += v;
        steps += 1;
    }
    // while with a compound condition.
    let mut n = scalar(0i32);
    while n < 4 && steps > n {
        acc *= 0.5;
        n += 1;
    }
    o.store(acc);
}

#[tpu_kernel]
pub fn squeezed_kernel(x: Ref<f32>, o: RefMut<f32>) {
    // x is a (1, 8, 128) block of a (4, 8, 128) array, squeezed to (8, 128).
    o.store(x.load() + 1.0);
}

#[tpu_kernel]
pub fn window_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let half = x.shape()[0] / 2;
    let top = x.at((0..half, ..)).load();
    let bottom = x.at((ds(half, half), ..)).load();
    o.at((ds(0, half), ..)).store(bottom);
    o.at((half..2 * half, ..)).store(top);
}

#[tpu_kernel]
pub fn mixed_dtype_kernel(x: Ref<bf16>, idx: Ref<i32>, o: RefMut<f32>, m: RefMut<i32>) {
    let xf = x.load().cast::<f32>();
    let i = idx.load();
    let scaled = xf * i.cast::<f32>() - (i % 3).cast::<f32>();
    o.store(select(i > 0, scaled, -scaled).tanh().abs());
    m.store(maximum(i / 2, 0) + (-i).abs());
}

#[tpu_kernel]
pub fn bf16_chain_kernel(x: Ref<f32>, o: RefMut<f32>) {
    // Each op on bf16 values rounds: (x as bf16) * 3 as bf16, then back to f32.
    let b = x.load().cast::<bf16>();
    o.store((b * 3.0f32).cast::<f32>());
}

#[tpu_kernel]
pub fn int_kernel(x: Ref<i32>, y: Ref<i32>, sum: RefMut<i32>, quo: RefMut<i32>, rem: RefMut<i32>) {
    let (a, b) = (x.load(), y.load());
    sum.store(a * 65536 + b);
    quo.store(a / b);
    rem.store(a % b);
}

#[tpu_kernel]
pub fn nan_kernel(x: Ref<f32>, mx: RefMut<f32>, mn: RefMut<f32>, ne: RefMut<i32>, e: RefMut<f32>) {
    let v = x.load();
    mx.store(v.max_keepdims(-1).broadcast_to(mx.shape()));
    mn.store(minimum(v, 0.5));
    ne.store((v != v).cast::<i32>());
    e.store(v.exp());
}

#[tpu_kernel]
pub fn add_edge_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() + y.load());
}

#[tpu_kernel]
pub fn matmul_no_init_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<bf16>, acc: RefMut<f32>) {
    // Bug under test: the accumulator is never zeroed at k == 0.
    acc.store(acc.load() + dot(x.load(), y.load()));
    if program_id(2) == num_programs(2) - 1 {
        o.store(acc.load().cast::<bf16>());
    }
}

#[tpu_kernel]
pub fn half_store_kernel(x: Ref<i32>, o: RefMut<i32>) {
    o.at((0..8, ..)).store(x.at((0..8, ..)).load());
}

#[tpu_kernel]
pub fn column_block_id_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() + program_id(1).cast::<f32>());
}

#[tpu_kernel]
pub fn block_column_sum_kernel(x: Ref<f32>, o: RefMut<f32>) {
    // Mixes the rows of a block: each block's column sums, broadcast over its rows, plus the row index.
    let x = x.load();
    let rows = iota::<i32>(x.shape(), 0).cast::<f32>();
    o.store(x.sum_keepdims(0).broadcast_to(x.shape()) + rows * 1000.0);
}

#[tpu_kernel]
pub fn step_count_kernel(o: RefMut<i32>, seen: RefMut<i32>) {
    // Scratch persists across steps; the output block revisited along the arbitrary axis keeps its value.
    if program_id(0) == 0 {
        if program_id(1) == 0 {
            seen.store(zeros());
        }
    }
    seen.store(seen.load() + 1);
    if program_id(1) == 0 {
        o.store(zeros());
    }
    o.store(o.load() + seen.load());
}

#[tpu_kernel]
pub fn shared_out_kernel(x: Ref<f32>, o: RefMut<f32>) {
    if program_id(0) == 0 {
        o.store(zeros());
    }
    o.store(o.load() + x.load());
}

#[tpu_kernel]
pub fn read_between_kernel(x: Ref<f32>, o: RefMut<f32>, prev: RefMut<f32>) {
    // `v` may be computed straight into o's output block; the load in between must still see the
    // block's previous contents (the last step's `v`, or zeros on the first step).
    let v = x.load() * 2.0f32;
    let w = o.load();
    o.store(v);
    prev.store(w + 1.0f32);
}

#[tpu_kernel]
pub fn exp_sum_kernel(x: Ref<f32>, o: RefMut<f32>, s: RefMut<f32>) {
    let x = x.load();
    let e = (x - x.max_keepdims(-1)).exp();
    let total = e.sum_keepdims(-1);
    s.store(total.broadcast_to(s.shape()));
    o.store(e / total);
}

#[tpu_kernel]
pub fn fused_reductions_kernel(x: Ref<f32>, a: RefMut<f32>, b: RefMut<f32>, c: RefMut<bf16>) {
    let v = x.load();
    // A lone op, a chain and a bf16 chain, each reduced over the last axis (folded into the pass).
    a.store((v * 2.0f32).max_keepdims(-1).broadcast_to(a.shape()));
    b.store((v - 1.0f32).exp().min_keepdims(-1).broadcast_to(b.shape()));
    c.store(
        (v.cast::<bf16>() * 3.0f32)
            .sum_keepdims(-1)
            .broadcast_to(c.shape()),
    );
}

#[tpu_kernel]
pub fn mixed_elementwise_kernel(x: Ref<f32>, y: Ref<i32>, o: RefMut<bf16>, m: RefMut<i32>) {
    let a = x.load();
    let b = y.load();
    o.store(select(b.cast::<f32>() > a, a * 3.0, (a - 1.0).exp()).cast::<bf16>());
    m.store(b * 7 + 1);
}

// ---------------------------------------------------------------------------------------------- SMEM

/// Row block `tables[b, 0]` of `x`, scaled by `tables[b, 1]` read in the body (a 2-D table).
#[tpu_kernel]
pub fn table_kernel(tables: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>) {
    let b = program_id(0);
    let scale = tables.at((b, 1)).load();
    o.store(x.load() * scale.cast::<f32>());
}

pub fn table_call() -> Result<PallasCall, KernelError> {
    pallas_call(table_kernel)
        .grid([3])
        .scalar_prefetch(ArrayType::new([3, 2], I32))
        .input(
            ArrayType::new([32, 128], F32),
            BlockSpec::with_prefetch([8, 128], |[b], [t]| (t.at((b, 0)).load(), 0)),
        )
        .output(
            ArrayType::new([24, 128], F32),
            BlockSpec::new([8, 128], |[b]| (b, 0)),
        )
        .build()
}

/// A prefetched length bounds a loop and picks a branch: `o[r] = sum of x[r, ..128*n]` style.
#[tpu_kernel]
pub fn lengths_kernel(lens: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>) {
    let n = lens.at(program_id(0)).load();
    o.store(zeros());
    for j in 0..n {
        let start = multiple_of(j * 128, 128);
        o.store(o.load() + x.at((.., ds(start, 128))).load());
    }
    if n == 0 {
        o.store(-1.0);
    }
}

/// `lengths_kernel` on three 8-row blocks.
pub fn lengths_call() -> Result<PallasCall, KernelError> {
    pallas_call(lengths_kernel)
        .grid([3])
        .scalar_prefetch(ArrayType::new([3], I32))
        .input(
            ArrayType::new([24, 512], F32),
            BlockSpec::new([8, 512], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([24, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
}

/// A running count in an SMEM scratch cell, persisting across grid steps: `o` gets the step's count.
#[tpu_kernel]
pub fn counter_kernel(x: Ref<f32>, o: RefMut<f32>, count: RefMut<i32, Smem>) {
    let i = program_id(0);
    if i == 0 {
        count.at(0).store(0);
    }
    let c: Scalar<i32> = count.at(0).load() + 1;
    count.at(0).store(c);
    o.store(x.load() + c.cast::<f32>());
}

/// `counter_kernel` over four 8-row blocks with a one-cell SMEM scratch.
pub fn counter_call() -> Result<PallasCall, KernelError> {
    pallas_call(counter_kernel)
        .grid([4])
        .input(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .scratch(Smem::new([1], I32))
        .build()
}

// ---------------------------------------------------------------------------------------------- DMA

/// A hand-pipelined copy from HBM: step `i` waits for its block (started by step `i - 1`, or now at
/// step 0) in one slot of a two-slot buffer while the next block streams into the other slot.
#[tpu_kernel]
pub fn pipelined_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sems: DmaSem) {
    let i = program_id(0);
    let n = num_programs(0);
    let slot = i % 2;
    if i == 0 {
        async_copy(x_hbm.at(ds(0, 8)), buf.at(0), sems.at(0)).start();
    }
    if i + 1 < n {
        let next = (i + 1) % 2;
        async_copy(x_hbm.at(ds((i + 1) * 8, 8)), buf.at(next), sems.at(next)).start();
    }
    async_copy(x_hbm.at(ds(i * 8, 8)), buf.at(slot), sems.at(slot)).wait();
    o.store(buf.at(slot).load() * 3.0);
}

/// `pipelined_kernel` over four 8-row blocks.
pub fn pipelined_call() -> Result<PallasCall, KernelError> {
    pallas_call(pipelined_kernel)
        .grid([4])
        .input_any(ArrayType::new([32, 128], F32))
        .output(
            ArrayType::new([32, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .scratch(Vmem::new([2, 8, 128], F32))
        .scratch(DmaSem::array([2]))
        .dimension_semantics([Arbitrary])
        .build()
}

// ---------------------------------------------------------------------------------------------- regions

/// Nested named trace regions around loads, math and a store.
#[tpu_kernel]
pub fn regions_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let _outer = named_scope("softmax");
    let v = x.load();
    let e = {
        let _inner = named_scope("exp");
        (v - v.max_keepdims(1)).exp()
    };
    o.store(e / e.sum_keepdims(1));
}

/// `regions_kernel` on two 8-row blocks.
pub fn regions_call() -> Result<PallasCall, KernelError> {
    pallas_call(regions_kernel)
        .grid([2])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
}

/// Regular semaphores count: `o = x + (value read after signal(3) + value after wait(2))`.
#[tpu_kernel]
pub fn semaphore_kernel(x: Ref<f32>, o: RefMut<f32>, s: Sem) {
    s.signal(3);
    let a = s.read();
    s.wait(2);
    let b = s.read();
    s.wait(1);
    o.store(x.load() + (a * 10i32 + b).cast::<f32>());
}

/// `semaphore_kernel` on one 8×128 block with one semaphore.
pub fn semaphore_call() -> Result<PallasCall, KernelError> {
    pallas_call(semaphore_kernel)
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .scratch(Sem::one())
        .build()
}

/// `sync_copy` between two VMEM buffers, then a window of the copy.
#[tpu_kernel]
pub fn sync_kernel(x: Ref<f32>, o: RefMut<f32>, a: RefMut<f32>, sem: DmaSem) {
    sync_copy(x, a, sem);
    o.store(a.load() - 1.0);
}

/// `sync_kernel` on one 8×128 block.
pub fn sync_call() -> Result<PallasCall, KernelError> {
    pallas_call(sync_kernel)
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .build()
}

// ---------------------------------------------------------------------------------------------- scopes

/// The body of a scope: stage `x + 1` in a scoped VMEM buffer and copy it to `o` by DMA.
#[kernel_fn]
pub fn staged_copy(x: Ref<f32>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    buf.store(x.load() + 1.0);
    sync_copy(buf, o, sem);
}

/// `o = x + 1` through scratch that exists only inside a `run_scoped` scope.
#[tpu_kernel]
pub fn scoped_kernel(x: Ref<f32>, o: RefMut<f32>) {
    run_scoped(
        staged_copy,
        (x, o),
        (Vmem::new([8, 128], F32), DmaSem::one()),
    );
}

/// `scoped_kernel` on two 8-row blocks.
pub fn scoped_call() -> Result<PallasCall, KernelError> {
    pallas_call(scoped_kernel)
        .grid([2])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
}

// ---------------------------------------------------------------------------------------------- pipelines

/// A pipeline body: `x * 2 + y` on one block.
#[kernel_fn]
pub fn axpy_block(x: Array<f32>, y: Array<f32>) -> Array<f32> {
    x * 2.0 + y
}

/// A nested pipeline over HBM arrays: `o = 2x + y`, block by block, double-buffered.
#[tpu_kernel]
pub fn pipeline_kernel(
    x_hbm: Ref<f32, Any>,
    y_hbm: Ref<f32, Any>,
    o_hbm: RefMut<f32, Any>,
    pipe: Pipeline,
) {
    pipe.run(axpy_block, (x_hbm, y_hbm), (o_hbm,));
}

/// `pipeline_kernel` on `[rows, 256]` arrays in 8-row blocks (`rows / 8` inner steps).
pub fn pipeline_call(rows: usize) -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([8, 256], |[j]| (j, 0));
    let pipe = Pipeline::new([rows / 8])
        .input(spec())
        .input(spec())
        .output(spec());
    let a = ArrayType::new([rows, 256], F32);
    pallas_call(pipeline_kernel.bind(pipe))
        .input_any(a.clone())
        .input_any(a.clone())
        .output_any(a)
        .build()
}

/// The body of `scope_loop_kernel`'s scope: add `x` to a scoped VMEM buffer and one to a scoped SMEM
/// counter, then `count · buffer` to `o`. Fresh (zeroed) scratch at every entry makes that `x` each time.
#[kernel_fn]
pub fn accumulate_in_scope(
    x: Ref<f32>,
    o: RefMut<f32>,
    acc: RefMut<f32>,
    count: RefMut<i32, Smem>,
) {
    acc.store(acc.load() + x.load());
    count.at(0).store(count.at(0).load() + 1);
    o.store(o.load() + acc.load() * count.at(0).load().cast::<f32>());
}

/// A scope entered three times in a loop: `o = ((0 + x) + x) + x` when each entry's scratch is fresh
/// (carried over, it would be `x + 2·2x + 3·3x`).
#[tpu_kernel]
pub fn scope_loop_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(0.0);
    for _entry in 0..3 {
        run_scoped(
            accumulate_in_scope,
            (x, o),
            (Vmem::new([8, 128], F32), Smem::new([1], I32)),
        );
    }
}

/// `scope_loop_kernel` on two 8-row blocks.
pub fn scope_loop_call() -> Result<PallasCall, KernelError> {
    pallas_call(scope_loop_kernel)
        .grid([2])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .build()
}

// ---------------------------------------------------------------------------------------------- HBM outputs

/// An output written only by DMA: each grid step stages `3x` of its 8-row block in VMEM and copies it
/// to rows `16i..16i + 8` of the HBM output, so every other 8-row band is never written.
#[tpu_kernel]
pub fn any_output_kernel(x: Ref<f32>, o_hbm: RefMut<f32, Any>, buf: RefMut<f32>, sem: DmaSem) {
    let i = program_id(0);
    buf.store(x.load() * 3.0);
    sync_copy(buf, o_hbm.at(ds(i * 16, 8)), sem);
}

/// `any_output_kernel` over `[16 * steps, 128]` arrays (input block `2i`); with `alias`, the output
/// aliases the input (`input_output_aliases={0: 0}`: the unwritten bands keep the input, else zeros).
pub fn any_output_call(steps: usize, alias: bool) -> Result<PallasCall, KernelError> {
    let a = ArrayType::new([16 * steps, 128], F32);
    let b = pallas_call(any_output_kernel)
        .grid([steps])
        .input(a.clone(), BlockSpec::new([8, 128], |[i]| (i * 2, 0)))
        .output_any(a)
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one());
    if alias {
        b.input_output_aliases([(0, 0)]).build()
    } else {
        b.build()
    }
}

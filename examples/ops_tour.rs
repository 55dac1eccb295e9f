//! A tour of the kernel language beyond the reference kernels, so every construct is lowered, verified and
//! (in the Python suite) compiled by libtpu: a `#[kernel_fn]` helper, `dot_nt`, an `if` with a value on a
//! traced condition, a `while` loop with carried values, a `for` loop over dynamic row windows, `&&` on
//! masks, a masked store, bool→int→float casts, integer reductions, a second (i32) output.

use tpu_kernel::prelude::*;

/// tanh-approximated GELU, a helper traced inline into the kernel.
#[kernel_fn]
fn gelu_tanh(x: Array<f32>) -> Array<f32> {
    let c = 0.797_884_6f32;
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

#[tpu_kernel]
fn ops_tour_kernel(x: Ref<f32>, w: Ref<f32>, o: RefMut<f32>, counts: RefMut<i32>) {
    let i = program_id(0);
    let bm = x.shape()[0];
    let bn = x.shape()[1];
    let s = dot_nt(gelu_tanh(x.load()), w.load());
    // An `if` producing a value on a traced condition (scf.if with a result).
    let mut v = if i % 2 == 0 { s * 2.0 } else { s };
    // A traced `while` with a carried scalar counter and a carried block.
    let mut n = scalar(0i32);
    while n < 3 {
        v = maximum(v * 0.5, -1.0);
        n += 1;
    }
    // Masks: lower triangle of the global matrix, even columns only.
    let row = iota::<i32>([bm, bn], 0) + i * bm;
    let col = iota::<i32>([bm, bn], 1);
    let keep = row >= col && col % 2 == 0;
    o.store(zeros());
    o.store_masked(v, keep);
    // Per column: how many elements were kept (bool -> i32, integer reduction).
    let kept = keep.cast::<i32>().sum_keepdims(0);
    // A `for` over dynamic, 8-aligned row windows of the output: add 0.001 * kept to every row.
    let bias = kept.cast::<f32>().broadcast_to([8, bn]) * 0.001;
    for j in 0..bm / 8 {
        let rows = o.at((ds(multiple_of(j * 8, 8), 8), ..));
        rows.store(rows.load() + bias);
    }
    counts.store(kept.broadcast_to([8, bn]));
}

/// `x: [m, n]` f32 in `bm`-row blocks, `w: [n, n]` f32 (whole), outputs `o: [m, n]` f32 and
/// `counts: [8 * m / bm, n]` i32 (per block: how many kept elements in each column).
#[export]
pub fn ops_tour(
    x: ArrayType,
    w: ArrayType,
    #[default(64)] block_rows: usize,
) -> Result<PallasCall, KernelError> {
    let bm = block_rows;
    let [m, n] = x.dims()?;
    require(
        w.shape == [n, n],
        format!("x is [{m}, {n}] so w must be [{n}, {n}], got {:?}", w.shape),
    )?;
    pallas_call(ops_tour_kernel)
        .grid([x.blocks(0, bm)?])
        .input(x, BlockSpec::new([bm, n], |[i]| (i, 0)))
        .input(w, BlockSpec::new([n, n], |[_]| (0, 0)))
        .output(
            ArrayType::new([m, n], F32),
            BlockSpec::new([bm, n], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([8 * (m / bm), n], I32),
            BlockSpec::new([8, n], |[i]| (i, 0)),
        )
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    ops_tour(
        ArrayType::new([256, 128], F32),
        ArrayType::new([128, 128], F32),
        64,
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

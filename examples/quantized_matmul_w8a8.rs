//! Int8 × int8 matmul (w8a8): int8 activations `[m, k]` with one f32 scale per row (per token, `[m, 1]`),
//! int8 weights `[k, n]` with one f32 scale per output channel (`[1, n]`); the MXU multiplies i8 × i8
//! into an i32 accumulator, which is converted to f32 and scaled by both at the last k step, bf16 out.
//! 256×512 @ 512×512 in (128, 128, 128) blocks, as `quantized_matmul`.
//!
//! Integer accumulation is exact (|x·w| ≤ 2¹⁴, so 2¹⁷ k steps fit i32); the only roundings are the
//! i32 → f32 conversion, the two scale multiplies and the bf16 store.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn quantized_matmul_w8a8_kernel(
    x: Ref<i8>,
    x_scale: Ref<f32>,
    w: Ref<i8>,
    w_scale: Ref<f32>,
    o: RefMut<bf16>,
    acc: RefMut<i32>,
) {
    if program_id(2) == 0 {
        acc.store(zeros());
    }
    acc.store(acc.load() + dot(x.load(), w.load()));
    if program_id(2) == num_programs(2) - 1 {
        let y = acc.load().cast::<f32>() * x_scale.load() * w_scale.load();
        o.store(y.cast::<bf16>());
    }
}

/// `o = (x @ w) * x_scale * w_scale` for int8 `x: [m, k]` with per-row scales `x_scale: [m, 1]` and
/// int8 `w: [k, n]` with per-output-channel scales `w_scale: [1, n]` (f32 scales), in `(bm, bn, bk)`
/// blocks (i32 accumulation, bf16 out). `vmem_limit_bytes` raises the scoped VMEM limit (the
/// generation's default otherwise), as tpu-inference's `quantized_matmul_kernel` sets its own for large
/// blocks.
#[export]
pub fn quantized_matmul_w8a8(
    x: ArrayType,
    x_scale: ArrayType,
    w: ArrayType,
    w_scale: ArrayType,
    #[default((128, 128, 128))] block: (usize, usize, usize),
    #[default(None)] vmem_limit_bytes: Option<i64>,
) -> Result<PallasCall, KernelError> {
    let (bm, bn, bk) = block;
    let ([m, k], [kw, n]) = (x.dims()?, w.dims()?);
    require(
        kw == k,
        format!("x is [{m}, {k}] but w is [{kw}, {n}]: the inner dimensions of x @ w must agree"),
    )?;
    require(
        x_scale.shape == [m, 1],
        format!(
            "x is [{m}, {k}] so x_scale must be [{m}, 1] (one per row), got {:?}",
            x_scale.shape
        ),
    )?;
    require(
        w_scale.shape == [1, n],
        format!(
            "w is [{k}, {n}] so w_scale must be [1, {n}] (one per output channel), got {:?}",
            w_scale.shape
        ),
    )?;
    pallas_call(quantized_matmul_w8a8_kernel)
        .grid([x.blocks(0, bm)?, w.blocks(1, bn)?, x.blocks(1, bk)?])
        .input(x, BlockSpec::new([bm, bk], |[i, _, k]| [i, k]))
        .input(x_scale, BlockSpec::new([bm, 1], |[i, _, _]| (i, 0)))
        .input(w, BlockSpec::new([bk, bn], |[_, j, k]| [k, j]))
        .input(w_scale, BlockSpec::new([1, bn], |[_, j, _]| (0, j)))
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([bm, bn], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([bm, bn], I32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .cost_estimate(w8a8_cost(m, n, k))
        .vmem_limit_argument(vmem_limit_bytes)?
        .build()
}

fn w8a8_cost(m: usize, n: usize, k: usize) -> CostEstimate {
    let (m, n, k) = (m as u64, n as u64, k as u64);
    CostEstimate {
        flops: 2 * m * n * k,
        transcendentals: 0,
        bytes_accessed: m * k + k * n + 4 * (m + n) + 2 * m * n,
    }
}

pub fn build() -> Result<PallasCall, KernelError> {
    quantized_matmul_w8a8(
        ArrayType::new([256, 512], I8),
        ArrayType::new([256, 1], F32),
        ArrayType::new([512, 512], I8),
        ArrayType::new([1, 512], F32),
        (128, 128, 128),
        None,
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

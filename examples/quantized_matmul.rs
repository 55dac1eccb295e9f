//! Int8-weight matmul (w8a16): bf16 activations `[m, k]`, int8 weights `[k, n]` with one f32 scale per
//! output channel (`[1, n]`), f32 accumulation, bf16 out. 256×512 @ 512×512 in (128, 128, 128) blocks,
//! the blocks of `matmul` (the w8a8 variant is `quantized_matmul_w8a8`).
//!
//! The weight block is dequantized in the kernel, before the MXU: `i8 → bf16` is exact (|w| ≤ 128 fits
//! bf16's 8-bit mantissa), so the MXU sees bf16 × bf16 as in `matmul`. The per-channel scale is applied
//! once, to the f32 accumulator at the last k step: `Σₖ x·(w·s) = s·Σₖ x·w` for a scale per column, so
//! scaling the `[bm, bn]` result costs one multiply per output instead of one per weight per k step.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn quantized_matmul_kernel(
    x: Ref<bf16>,
    w: Ref<i8>,
    scale: Ref<f32>,
    o: RefMut<bf16>,
    acc: RefMut<f32>,
) {
    if program_id(2) == 0 {
        acc.store(zeros());
    }
    acc.store(acc.load() + dot(x.load(), w.load().cast::<bf16>()));
    if program_id(2) == num_programs(2) - 1 {
        o.store((acc.load() * scale.load()).cast::<bf16>());
    }
}

/// `o = (x @ w) * scale` for bf16 `x: [m, k]`, int8 `w: [k, n]` and f32 per-output-channel scales
/// `scale: [1, n]`, in `(bm, bn, bk)` blocks (f32 accumulation, bf16 out).
#[export]
pub fn quantized_matmul(
    x: ArrayType,
    w: ArrayType,
    scale: ArrayType,
    #[default((128, 128, 128))] block: (usize, usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn, bk) = block;
    let ([m, k], [kw, n]) = (x.dims()?, w.dims()?);
    require(
        kw == k,
        format!("x is [{m}, {k}] but w is [{kw}, {n}]: the inner dimensions of x @ w must agree"),
    )?;
    require(
        scale.shape == [1, n],
        format!(
            "w is [{k}, {n}] so scale must be [1, {n}] (one per output channel), got {:?}",
            scale.shape
        ),
    )?;
    pallas_call(quantized_matmul_kernel)
        .grid([x.blocks(0, bm)?, w.blocks(1, bn)?, x.blocks(1, bk)?])
        .input(x, BlockSpec::new([bm, bk], |[i, _, k]| [i, k]))
        .input(w, BlockSpec::new([bk, bn], |[_, j, k]| [k, j]))
        .input(scale, BlockSpec::new([1, bn], |[_, j, _]| (0, j)))
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([bm, bn], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([bm, bn], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .cost_estimate(quantized_matmul_cost(m, n, k))
        .build()
}

fn quantized_matmul_cost(m: usize, n: usize, k: usize) -> CostEstimate {
    let (m, n, k) = (m as u64, n as u64, k as u64);
    CostEstimate {
        flops: 2 * m * n * k,
        transcendentals: 0,
        bytes_accessed: 2 * m * k + k * n + 4 * n + 2 * m * n,
    }
}

pub fn build() -> Result<PallasCall, KernelError> {
    quantized_matmul(
        ArrayType::new([256, 512], BF16),
        ArrayType::new([512, 512], I8),
        ArrayType::new([1, 512], F32),
        (128, 128, 128),
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

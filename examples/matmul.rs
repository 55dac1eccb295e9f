//! Tiled matmul: bf16 inputs, an f32 VMEM accumulator carried across the `arbitrary` k axis, bf16 output
//! (the Pallas reference `matmul`, 512³ with 128³ blocks).
//!
//! `acc.load() + dot(..)` is lowered as `tpu.matmul` accumulating into the loaded value (fewer LLO ops than
//! Pallas's zero-accumulator matmul followed by an add).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn matmul_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<bf16>, acc: RefMut<f32>) {
    if program_id(2) == 0 {
        acc.store(zeros());
    }
    acc.store(acc.load() + dot(x.load(), y.load()));
    if program_id(2) == num_programs(2) - 1 {
        o.store(acc.load().cast::<bf16>());
    }
}

/// `o = x @ y` for bf16 `x: [m, k]`, `y: [k, n]`, in `(bm, bn, bk)` blocks (f32 accumulation).
#[export(grad(x = matmul_dx(g, y, block = block), y = matmul_dw(x, g, block = block)))]
pub fn matmul(
    x: ArrayType,
    y: ArrayType,
    #[default((128, 128, 128))] block: (usize, usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn, bk) = block;
    let ([m, k], [ky, n]) = (x.dims()?, y.dims()?);
    require(
        ky == k,
        format!("x is [{m}, {k}] but y is [{ky}, {n}]: the inner dimensions of x @ y must agree"),
    )?;
    pallas_call(matmul_kernel)
        .grid([x.blocks(0, bm)?, y.blocks(1, bn)?, x.blocks(1, bk)?])
        .input(x, BlockSpec::new([bm, bk], |[i, _, k]| [i, k]))
        .input(y, BlockSpec::new([bk, bn], |[_, j, k]| [k, j]))
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([bm, bn], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([bm, bn], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .cost_estimate(matmul_cost(m, n, k))
        .build()
}

fn matmul_cost(m: usize, n: usize, k: usize) -> CostEstimate {
    let (m, n, k) = (m as u64, n as u64, k as u64);
    CostEstimate {
        flops: 2 * m * n * k,
        transcendentals: 0,
        bytes_accessed: 2 * (m * k + k * n + m * n),
    }
}

#[tpu_kernel]
fn matmul_nt_kernel(g: Ref<bf16>, y: Ref<bf16>, dx: RefMut<bf16>, acc: RefMut<f32>) {
    if program_id(2) == 0 {
        acc.store(zeros());
    }
    acc.store(acc.load() + dot_nt(g.load(), y.load()));
    if program_id(2) == num_programs(2) - 1 {
        dx.store(acc.load().cast::<bf16>());
    }
}

/// The gradient of `matmul` with respect to `x`: `dx = g @ yᵀ` (`g: [m, n]`, `y: [k, n]`), blocks as
/// the forward's `(bm, bn, bk)`; the reduction runs over `n`.
#[export]
pub fn matmul_dx(
    g: ArrayType,
    y: ArrayType,
    #[default((128, 128, 128))] block: (usize, usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn, bk) = block;
    let ([m, n], [k, ny]) = (g.dims()?, y.dims()?);
    require(
        ny == n,
        format!("g is [{m}, {n}] but y is [{k}, {ny}]: g @ yᵀ needs as many columns in both"),
    )?;
    pallas_call(matmul_nt_kernel)
        .name("matmul_dx_kernel")
        .grid([g.blocks(0, bm)?, y.blocks(0, bk)?, g.blocks(1, bn)?])
        .input(g, BlockSpec::new([bm, bn], |[i, _, r]| [i, r]))
        .input(y, BlockSpec::new([bk, bn], |[_, j, r]| [j, r]))
        .output(
            ArrayType::new([m, k], BF16),
            BlockSpec::new([bm, bk], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([bm, bk], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .cost_estimate(matmul_cost(m, k, n))
        .build()
}

#[tpu_kernel]
fn matmul_tn_kernel(x: Ref<bf16>, g: Ref<bf16>, dw: RefMut<bf16>, acc: RefMut<f32>) {
    if program_id(2) == 0 {
        acc.store(zeros());
    }
    acc.store(acc.load() + dot_tn(x.load(), g.load()));
    if program_id(2) == num_programs(2) - 1 {
        dw.store(acc.load().cast::<bf16>());
    }
}

/// The gradient of `matmul` with respect to `y`: `dy = xᵀ @ g` (`x: [m, k]`, `g: [m, n]`), blocks as
/// the forward's `(bm, bn, bk)`; the reduction runs over `m`.
#[export]
pub fn matmul_dw(
    x: ArrayType,
    g: ArrayType,
    #[default((128, 128, 128))] block: (usize, usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn, bk) = block;
    let ([m, k], [mg, n]) = (x.dims()?, g.dims()?);
    require(
        mg == m,
        format!("x is [{m}, {k}] but g is [{mg}, {n}]: xᵀ @ g needs as many rows in both"),
    )?;
    pallas_call(matmul_tn_kernel)
        .name("matmul_dw_kernel")
        .grid([x.blocks(1, bk)?, g.blocks(1, bn)?, x.blocks(0, bm)?])
        .input(x, BlockSpec::new([bm, bk], |[i, _, r]| [r, i]))
        .input(g, BlockSpec::new([bm, bn], |[_, j, r]| [r, j]))
        .output(
            ArrayType::new([k, n], BF16),
            BlockSpec::new([bk, bn], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([bk, bn], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .cost_estimate(matmul_cost(k, n, m))
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    let a = ArrayType::new([512, 512], BF16);
    matmul(a.clone(), a, (128, 128, 128))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

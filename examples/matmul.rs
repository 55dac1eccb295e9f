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

/// `o = x @ y` for bf16 `x: [m, k]`, `y: [k, n]`, in `[bm, bn, bk]` blocks.
pub fn matmul(
    m: usize,
    n: usize,
    k: usize,
    [bm, bn, bk]: [usize; 3],
) -> Result<PallasCall, KernelError> {
    pallas_call(matmul_kernel)
        .grid([m / bm, n / bn, k / bk])
        .input(
            ArrayType::new([m, k], BF16),
            BlockSpec::new([bm, bk], |[i, _, k]| [i, k]),
        )
        .input(
            ArrayType::new([k, n], BF16),
            BlockSpec::new([bk, bn], |[_, j, k]| [k, j]),
        )
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([bm, bn], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([bm, bn], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    matmul(512, 512, 512, [128, 128, 128])
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

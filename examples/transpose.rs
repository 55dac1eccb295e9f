//! Blocked transpose: block (i, j) of the input becomes block (j, i) of the output, transposed in VMEM
//! (the Pallas reference `transpose`, 512² in 128² blocks).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn transpose_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().t());
}

/// `o = x.T` for an f32 `[m, n]` array.
#[export]
pub fn transpose(
    x: ArrayType,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn) = block;
    let [m, n] = x.dims()?;
    pallas_call(transpose_kernel)
        .grid([x.blocks(0, bm)?, x.blocks(1, bn)?])
        .input(x, BlockSpec::new([bm, bn], |[i, j]| [i, j]))
        .output(
            ArrayType::new([n, m], F32),
            BlockSpec::new([bn, bm], |[i, j]| [j, i]),
        )
        .dimension_semantics([Parallel, Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    transpose(ArrayType::new([512, 512], F32), (128, 128))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

//! Strided windows (Pallas `pl.ds(start, size, stride)`): a butterfly over row pairs. Each grid step
//! loads the even and the odd rows of its block with stride-2 windows (`tpu.strided_load`) and stores
//! their sum into the even rows and their difference into the odd rows (`tpu.strided_store`).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn strided_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let half = x.shape()[0] / 2;
    let even = x.at((ds(0, half).stride(2), ..)).load();
    let odd = x.at((ds(1, half).stride(2), ..)).load();
    o.at((ds(0, half).stride(2), ..)).store(even + odd);
    o.at((ds(1, half).stride(2), ..)).store(even - odd);
}

/// `o[2i] = x[2i] + x[2i+1]`, `o[2i+1] = x[2i] - x[2i+1]` for an f32 array of shape `[m, n]`, in
/// `bm`-row blocks (`bm` even). Mosaic strides refs of exactly 128 lanes: `n` must be 128.
#[export]
pub fn strided(x: ArrayType, #[default(64)] bm: usize) -> Result<PallasCall, KernelError> {
    let [_, n] = x.dims()?;
    let spec = || BlockSpec::new([bm, n], |[i]| (i, 0));
    pallas_call(strided_kernel)
        .grid([x.blocks(0, bm)?])
        .input(x.clone(), spec())
        .output(x, spec())
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    strided(ArrayType::new([512, 128], F32), 64)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

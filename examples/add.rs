//! Elementwise add of two f32 arrays in (256, 256) blocks (the Pallas reference `add`, 1024²).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn add_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() + y.load());
}

/// `o = x + y` for f32 arrays of shape `[m, n]`, in `[bm, bn]` blocks.
pub fn add(m: usize, n: usize, [bm, bn]: [usize; 2]) -> Result<PallasCall, KernelError> {
    let spec = || BlockSpec::new([bm, bn], |[i, j]| [i, j]);
    pallas_call(add_kernel)
        .grid([m / bm, n / bn])
        .input(ArrayType::new([m, n], F32), spec())
        .input(ArrayType::new([m, n], F32), spec())
        .output(ArrayType::new([m, n], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    add(1024, 1024, [256, 256])
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

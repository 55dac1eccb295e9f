//! Row softmax of a f32 array, 8 full rows per grid step (the Pallas reference `softmax`, 1024²).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn softmax_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let x = x.load();
    let m = x.max_keepdims(-1);
    let e = (x - m).exp();
    let s = e.sum_keepdims(-1);
    o.store(e / s);
}

/// Softmax over the last axis of an f32 `[m, n]` array, `block_rows` rows per block.
#[export]
pub fn softmax(x: ArrayType, #[default(8)] block_rows: usize) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let spec = || BlockSpec::new([block_rows, n], |[i]| (i, 0));
    pallas_call(softmax_kernel)
        .grid([x.blocks(0, block_rows)?])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    softmax(ArrayType::new([1024, 1024], F32), 8)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

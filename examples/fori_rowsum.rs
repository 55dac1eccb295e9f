//! A traced `for` loop over dynamic slices: each grid step owns a (256, 128) column strip and sums it in
//! 8-row chunks, carrying an (8, 128) partial sum (the Pallas reference `fori_rowsum`:
//! `out[r, c] = sum_k x[8k + r, c]`).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn fori_rowsum_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let n_chunks = x.shape()[0] / 8;
    let mut acc = full(o.shape(), 0.0f32);
    for i in 0..n_chunks {
        let start = multiple_of(i * 8, 8);
        acc += x.at((ds(start, 8), ..)).load();
    }
    o.store(acc);
}

/// Row-chunk sums of an f32 `[m, n]` array into an `[8, n]` output, `bn` columns per grid step.
#[export]
pub fn fori_rowsum(
    x: ArrayType,
    #[default(128)] block_cols: usize,
) -> Result<PallasCall, KernelError> {
    let bn = block_cols;
    let [m, n] = x.dims()?;
    pallas_call(fori_rowsum_kernel)
        .grid([x.blocks(1, bn)?])
        .input(x, BlockSpec::new([m, bn], |[j]| (0, j)))
        .output(
            ArrayType::new([8, n], F32),
            BlockSpec::new([8, bn], |[j]| (0, j)),
        )
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    fori_rowsum(ArrayType::new([256, 1024], F32), 128)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

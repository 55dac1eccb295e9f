//! Column sums with a revisited output block: the (8, bn) output block stays resident across the
//! `arbitrary` row-block axis k and is the accumulator (the Pallas reference `colsum`, 1024×256).
//! Every one of the 8 output rows holds the column sums (8 rows keep the block tile-aligned).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn colsum_kernel(x: Ref<f32>, o: RefMut<f32>) {
    if program_id(1) == 0 {
        o.store(zeros());
    }
    let s = x.load().sum_keepdims(0);
    o.store(o.load() + s.broadcast_to(o.shape()));
}

/// Column sums of an f32 `[m, n]` array, broadcast to an `[8, n]` output.
#[export]
pub fn colsum(
    x: ArrayType,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn) = block;
    let [_, n] = x.dims()?;
    pallas_call(colsum_kernel)
        .grid([x.blocks(1, bn)?, x.blocks(0, bm)?])
        .input(x, BlockSpec::new([bm, bn], |[j, k]| [k, j]))
        .output(
            ArrayType::new([8, n], F32),
            BlockSpec::new([8, bn], |[j, _]| (0, j)),
        )
        .dimension_semantics([Parallel, Arbitrary])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    colsum(ArrayType::new([1024, 256], F32), (128, 128))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

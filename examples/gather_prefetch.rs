//! A gather by scalar prefetch (the Pallas reference `gather_prefetch`): a table of block numbers is
//! placed in SMEM before the grid runs, and the input's index map reads it, so grid step `i` sees block
//! `idx[i]` of `x` (Pallas's `PrefetchScalarGridSpec`, `lambda i, idx_ref: (idx_ref[i], 0)`).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn gather_kernel(_idx: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() * 2.0);
}

/// `o[i*bm..(i+1)*bm] = 2 * x[idx[i]*bm..(idx[i]+1)*bm]` for an i32 table `idx` of block numbers and an
/// f32 array `x` of shape `[m, n]`, in `bm`-row blocks.
#[export]
pub fn gather_prefetch(
    idx: ArrayType,
    x: ArrayType,
    #[default(8)] bm: usize,
) -> Result<PallasCall, KernelError> {
    let [nb] = idx.dims()?;
    let [_, n] = x.dims()?;
    require(
        idx.dtype == I32,
        format!("idx is {}: the block table is i32", idx.dtype),
    )?;
    x.blocks(0, bm)?;
    pallas_call(gather_kernel)
        .grid([nb])
        .scalar_prefetch(idx)
        .input(
            x,
            BlockSpec::with_prefetch([bm, n], |[i], [idx]| (idx.at(i).load(), 0)),
        )
        .output(
            ArrayType::new([nb * bm, n], F32),
            BlockSpec::new([bm, n], |[i]| (i, 0)),
        )
        .dimension_semantics([Arbitrary])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    gather_prefetch(ArrayType::new([4], I32), ArrayType::new([64, 256], F32), 8)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

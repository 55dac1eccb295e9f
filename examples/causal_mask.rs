//! Causal masking of attention scores: scale the lower triangle, -inf above the diagonal (the Pallas
//! reference `causal_mask`, 512² in 128² blocks). Global row/column indices come from `iota` plus the
//! block offset `program_id * block`.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn causal_mask_kernel(x: Ref<f32>, o: RefMut<f32>, scale: f32) {
    let bm = x.shape()[0];
    let bn = x.shape()[1];
    let row = iota::<i32>([bm, bn], 0) + program_id(0) * bm;
    let col = iota::<i32>([bm, bn], 1) + program_id(1) * bn;
    o.store(select(row >= col, x.load() * scale, f32::NEG_INFINITY));
}

/// `o[r, c] = x[r, c] * scale` where `r >= c`, else `-inf`, for an f32 `[m, n]` array.
#[export]
pub fn causal_mask(
    x: ArrayType,
    #[default((128, 128))] block: (usize, usize),
    #[default(0.125)] scale: f32,
) -> Result<PallasCall, KernelError> {
    let (bm, bn) = block;
    let [m, n] = x.dims()?;
    let spec = || BlockSpec::new([bm, bn], |[i, j]| [i, j]);
    pallas_call(move |x: Ref<f32>, o: RefMut<f32>| causal_mask_kernel(x, o, scale))
        .name("causal_mask_kernel")
        .grid([x.blocks(0, bm)?, x.blocks(1, bn)?])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    causal_mask(ArrayType::new([512, 512], F32), (128, 128), 0.125)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

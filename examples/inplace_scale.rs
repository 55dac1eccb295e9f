//! An in-place update (the Pallas reference `inplace_scale`): the output aliases the input
//! (`input_output_aliases={0: 0}`), so XLA can scale a donated array without a second buffer.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn inplace_scale_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() * 3.0);
}

/// `x *= 3` for an f32 array of shape `[m, n]`, in `bm`-row blocks, the output aliasing the input
/// (a torch op writes `x`).
#[export(mutates(x))]
pub fn inplace_scale(x: ArrayType, #[default(128)] bm: usize) -> Result<PallasCall, KernelError> {
    let [_, n] = x.dims()?;
    let spec = || BlockSpec::new([bm, n], |[i]| (i, 0));
    pallas_call(inplace_scale_kernel)
        .grid([x.blocks(0, bm)?])
        .input(x.clone(), spec())
        .output(x, spec())
        .input_output_aliases([(0, 0)])
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    inplace_scale(ArrayType::new([256, 256], F32), 128)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

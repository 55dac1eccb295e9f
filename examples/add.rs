//! Elementwise add of two f32 arrays in (256, 256) blocks (the Pallas reference `add`, 1024²).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn add_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() + y.load());
}

/// `o = x + y` for f32 arrays of shape `[m, n]`, in `(bm, bn)` blocks.
#[export]
pub fn add(
    x: ArrayType,
    y: ArrayType,
    #[default((256, 256))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bm, bn) = block;
    let [m, n] = x.dims()?;
    require(
        y.shape == x.shape,
        format!(
            "x is {:?} but y is {:?}: add takes two arrays of one shape",
            x.shape, y.shape
        ),
    )?;
    let spec = || BlockSpec::new([bm, bn], |[i, j]| [i, j]);
    pallas_call(add_kernel)
        .grid([x.blocks(0, bm)?, x.blocks(1, bn)?])
        .input(x, spec())
        .input(y, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    let a = ArrayType::new([1024, 1024], F32);
    add(a.clone(), a, (256, 256))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

//! A crate outside the examples that exports kernels to Python, as a user's would: the README's
//! example (`scale`, differentiable through itself), kernels the Python suite uses for error paths
//! (`bad_rows` reads out of bounds at run time), and `by_target`, whose blocks follow the TPU
//! generation it is built for.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn scale_kernel(x: Ref<f32>, o: RefMut<f32>, factor: f32) {
    o.store(x.load() * factor);
}

/// `x * factor` for an f32 `[m, n]` array, 8 rows per step; its gradient is `g * factor`.
#[export(grad(x = scale(g, factor = factor)))]
pub fn scale(x: ArrayType, factor: f32) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = || BlockSpec::new([8, n], |[i]| (i, 0));
    pallas_call(move |x: Ref<f32>, o: RefMut<f32>| scale_kernel(x, o, factor))
        .grid([x.blocks(0, 8)?])
        .input(x, rows())
        .output(ArrayType::new([m, n], F32), rows())
        .build()
}

#[tpu_kernel]
fn bad_rows_kernel(x: Ref<f32>, o: RefMut<f32>) {
    // Block rows 8·i .. 8·i + 8 of an 8-row block: in bounds only at i = 0.
    let start = multiple_of(program_id(0) * 8, 8);
    o.store(x.at((ds(start, 8), ..)).load());
}

/// A kernel that is only wrong at run time: every grid step but the first reads past its block.
#[export]
pub fn bad_rows(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = || BlockSpec::new([8, n], |[i]| (i, 0));
    pallas_call(bad_rows_kernel)
        .grid([x.blocks(0, 8)?])
        .input(x, rows())
        .output(ArrayType::new([m, n], F32), rows())
        .build()
}

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

/// `x` copied in blocks of the MXU's size in rows (128 on v4/v5e/v5p, 256 on v6e/tpu7x), the kernel
/// named after the generation it is built for (`copy_v6e`): how a launch function reads its target.
#[export]
pub fn by_target(x: ArrayType, target: Target) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = target.info().mxu_size.min(m);
    let spec = || BlockSpec::new([rows, n], |[i]| (i, 0));
    pallas_call(copy_kernel)
        .name(format!("copy_{target}"))
        .grid([x.blocks(0, rows)?])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .build()
}

tpu_kernel::export_library!("user_crate", [scale, bad_rows, by_target]);

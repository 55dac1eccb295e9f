//! RMS normalization of bf16 rows with an f32 weight row (the Pallas reference `rmsnorm`, 1024², 16 rows
//! per step). `eps` is a compile-time parameter bound with a closure, like `functools.partial` in Pallas.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn rmsnorm_kernel(x: Ref<bf16>, w: Ref<f32>, o: RefMut<bf16>, eps: f32) {
    let x = x.load().cast::<f32>();
    let ms = (x * x).mean_keepdims(-1);
    let y = x * (ms + eps).rsqrt() * w.load();
    o.store(y.cast::<bf16>());
}

/// `o = x * rsqrt(mean(x², axis=-1) + eps) * w` for bf16 `x: [m, n]`, f32 `w: [1, n]`.
pub fn rmsnorm(m: usize, n: usize, br: usize, eps: f32) -> Result<PallasCall, KernelError> {
    pallas_call(move |x: Ref<bf16>, w: Ref<f32>, o: RefMut<bf16>| rmsnorm_kernel(x, w, o, eps))
        .name("rmsnorm_kernel")
        .grid([m / br])
        .input(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([br, n], |[i]| (i, 0)),
        )
        .input(
            ArrayType::new([1, n], F32),
            BlockSpec::new([1, n], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([br, n], |[i]| (i, 0)),
        )
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    rmsnorm(1024, 1024, 16, 1e-6)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

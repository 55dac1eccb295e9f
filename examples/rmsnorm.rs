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

/// `o = x * rsqrt(mean(x², axis=-1) + eps) * w` for bf16 `x: [m, n]`, f32 `w: [1, n]`, `block_rows`
/// rows per block.
#[export(grad((x, w) = rmsnorm_bwd(x, w, g, eps = eps, block_rows = block_rows)))]
pub fn rmsnorm(
    x: ArrayType,
    w: ArrayType,
    #[default(1e-6)] eps: f32,
    #[default(16)] block_rows: usize,
) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    require(
        w.shape == [1, n],
        format!("x is [{m}, {n}] so w must be [1, {n}], got {:?}", w.shape),
    )?;
    pallas_call(move |x: Ref<bf16>, w: Ref<f32>, o: RefMut<bf16>| rmsnorm_kernel(x, w, o, eps))
        .name("rmsnorm_kernel")
        .grid([x.blocks(0, block_rows)?])
        .input(x, BlockSpec::new([block_rows, n], |[i]| (i, 0)))
        .input(w, BlockSpec::new([1, n], |[_]| (0, 0)))
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([block_rows, n], |[i]| (i, 0)),
        )
        .dimension_semantics([Parallel])
        .build()
}

/// The backward of `rmsnorm`: with `r = rsqrt(mean(x²) + eps)` per row and `gw = g * w`,
/// `dx = r * gw - x * r³ * mean(gw * x)` and `dw = Σ_rows g * x * r` (accumulated in the revisited
/// `[1, n]` output block along the `arbitrary` row axis).
#[tpu_kernel]
fn rmsnorm_bwd_kernel(
    x: Ref<bf16>,
    w: Ref<f32>,
    g: Ref<bf16>,
    dx: RefMut<bf16>,
    dw: RefMut<f32>,
    eps: f32,
) {
    let x = x.load().cast::<f32>();
    let g = g.load().cast::<f32>();
    let r = ((x * x).mean_keepdims(-1) + eps).rsqrt();
    let gw = g * w.load();
    let s = (gw * x).mean_keepdims(-1);
    dx.store((r * gw - x * (r * r * r) * s).cast::<bf16>());
    if program_id(0) == 0 {
        dw.store(zeros());
    }
    dw.store(dw.load() + (g * x * r).sum_keepdims(0));
}

/// Gradients of `rmsnorm` for `x` (bf16, like `x`) and `w` (f32, like `w`) from the output's
/// cotangent `g` (bf16).
#[export]
pub fn rmsnorm_bwd(
    x: ArrayType,
    w: ArrayType,
    g: ArrayType,
    #[default(1e-6)] eps: f32,
    #[default(16)] block_rows: usize,
) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    require(
        w.shape == [1, n] && g.shape == x.shape,
        format!(
            "x is [{m}, {n}]: w must be [1, {n}] and g [{m}, {n}], got {:?} and {:?}",
            w.shape, g.shape
        ),
    )?;
    let rows = || BlockSpec::new([block_rows, n], |[i]| (i, 0));
    pallas_call(
        move |x: Ref<bf16>, w: Ref<f32>, g: Ref<bf16>, dx: RefMut<bf16>, dw: RefMut<f32>| {
            rmsnorm_bwd_kernel(x, w, g, dx, dw, eps)
        },
    )
    .name("rmsnorm_bwd_kernel")
    .grid([x.blocks(0, block_rows)?])
    .input(x, rows())
    .input(w, BlockSpec::new([1, n], |[_]| (0, 0)))
    .input(g, rows())
    .output(ArrayType::new([m, n], BF16), rows())
    .output(
        ArrayType::new([1, n], F32),
        BlockSpec::new([1, n], |[_]| (0, 0)),
    )
    .dimension_semantics([Arbitrary])
    .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    rmsnorm(
        ArrayType::new([1024, 1024], BF16),
        ArrayType::new([1, 1024], F32),
        1e-6,
        16,
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

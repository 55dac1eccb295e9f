//! The activation functions of today's models, on the new ops of the op table: an erf GELU, SwiGLU
//! (`silu(gate) * x` through `logistic`), a tanh soft-cap, and the rounding, clamping, sign, NaN and
//! integer shift/bitwise ops around them (f32 `[m, n]` x and gate, i32 `[m, n]` codes; 8 rows a step).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn activations_kernel(
    x: Ref<f32>,
    gate: Ref<f32>,
    codes: Ref<i32>,
    o: RefMut<f32>,
    packed: RefMut<i32>,
) {
    let x = x.load();
    let g = gate.load();
    let gelu = 0.5 * x * (1.0 + (x * 0.707_106_77).erf());
    let swiglu = g * g.logistic() * x;
    let capped = (swiglu * 0.1).tanh() * 10.0;
    // The sign before the chain it scales, as the Pallas twin computes it: libtpu schedules the ops in
    // about the order given, and on tpu7x the sign taken last costs a bundle (153 against 152).
    let sign = x.sign();
    let shaped =
        (x.abs().log1p() + (x * 0.25).expm1() + (x * 2.5).round() - x.floor() + x.ceil()) * sign;
    let y = gelu + capped + shaped.clamp(-4.0, 4.0);
    o.store(select(y.isnan(), 0.0, y));
    let c = codes.load();
    packed.store(((c << 3) >> 5) ^ (c & 255) | (c >> 31));
}

/// The activations of f32 `[m, n]` `x` and `gate` and the i32 `codes`, `block_rows` rows per step.
#[export]
pub fn activations(
    x: ArrayType,
    gate: ArrayType,
    codes: ArrayType,
    #[default(8)] block_rows: usize,
) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    require(
        gate.shape == x.shape && codes.shape == x.shape,
        format!(
            "x, gate and codes must have one shape, got {:?}, {:?}, {:?}",
            x.shape, gate.shape, codes.shape
        ),
    )?;
    let spec = || BlockSpec::new([block_rows, n], |[i]| (i, 0));
    pallas_call(activations_kernel)
        .grid([x.blocks(0, block_rows)?])
        .input(x, spec())
        .input(gate, spec())
        .input(codes, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .output(ArrayType::new([m, n], I32), spec())
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    activations(
        ArrayType::new([256, 512], F32),
        ArrayType::new([256, 512], F32),
        ArrayType::new([256, 512], I32),
        8,
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}

//! Each transcendental of the crate on one f32: the definition of its op, the one-lane instantiation
//! that the vector loops reproduce bit for bit. What Mosaic on CPU calls for the emitted `math.*` ops
//! (the interpreter reaches the same instantiations through the items' `scalar` and their loops); the
//! element functions it calls too (`max_f32`, `floor_f32`, `bf16_bits`, ...) are the crate root's.

/// `e^x` (≤ 2 ulp on the normal range; `math.exp`).
pub fn exp(x: f32) -> f32 {
    crate::exp_f32(x)
}

/// `ln x` (≤ 0.9 ulp; `math.log`).
pub fn log(x: f32) -> f32 {
    crate::approx::log(x)
}

/// `ln(1 + x)` (≤ 1 ulp; `math.log1p`).
pub fn log1p(x: f32) -> f32 {
    crate::approx::log1p(x)
}

/// `tanh x` (≤ 2 ulp; `math.tanh`).
pub fn tanh(x: f32) -> f32 {
    crate::approx::tanh(x)
}

/// `1 / (1 + e^-x)` (≤ 3 ulp; `tpu.logistic`).
pub fn logistic(x: f32) -> f32 {
    crate::approx::logistic(x)
}

/// `erf x` (≤ 1.1 ulp; `math.erf`).
pub fn erf(x: f32) -> f32 {
    crate::approx::erf(x)
}

/// `sin x` (≤ 1.6 ulp, huge arguments reduced exactly; `math.sin`).
pub fn sin(x: f32) -> f32 {
    crate::trig::sin(x)
}

/// `cos x` (≤ 1.6 ulp; `math.cos`).
pub fn cos(x: f32) -> f32 {
    crate::trig::cos(x)
}

/// `1/√x`, correctly rounded: the bits of `1/√x` in f64 rounded once to f32 (`math.rsqrt`).
pub fn rsqrt(x: f32) -> f32 {
    crate::pow::rsqrt(x)
}

/// `x^y` with C99 `powf`'s special cases (≤ 1 ulp; `math.powf`).
pub fn pow(x: f32, y: f32) -> f32 {
    crate::pow::pow(x, y)
}

/// `x % y` with the sign of `x`, exact (C `fmodf`; `arith.remf`).
pub fn rem(x: f32, y: f32) -> f32 {
    crate::pow::rem(x, y)
}

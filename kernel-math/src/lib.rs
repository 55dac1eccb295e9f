//! The vector math of tpu-kernel: every float function of the elementwise op table that IEEE
//! arithmetic does not define by itself — `exp`, `log`, `log1p`, `tanh`, `logistic`, `erf`, `sin`,
//! `cos`, `rsqrt`, `pow`, `rem` — and the element semantics XLA gives the rest (NaN-propagating
//! max/min, floor/ceil/round with one NaN rule, rounding to bf16, integer division by zero, shifts),
//! defined once, in f32.
//!
//! **One definition, two engines.** Both CPU engines of a kernel compute these ops by calling this
//! crate: the interpreter through the op table's `f32:` column (`kernel-runtime/src/ir/ops.rs`, whose
//! dispatch macros name the items below), Mosaic on CPU by calling [`scalar`]'s functions from the
//! JIT-compiled module where the emitted op is `math.exp`, `math.tanh`, ... So the two engines give the
//! same bits on every op — `tests/mosaic_cpu.rs` checks it over every float op of the table — and no
//! system libm is involved anywhere.
//!
//! **The scalar form is the definition.** Each transcendental is written once over `lanes.rs`'s
//! `Lanes` (`approx.rs`, `trig.rs`, `pow.rs`): an f32 or 8 / 16 f32 lanes (AVX2+FMA, AVX-512F). Every
//! lane operation is an IEEE operation (one rounding, `fma` included) or a bit manipulation, so the
//! vector instantiations give the one-lane instantiation's bits — the f32 function is the reference,
//! and `accuracy.rs` holds every width to it over a dense sweep of f32 bit patterns. `exp` has its own
//! hand-written vector forms (`exp.rs`, with a fused exp-and-sum), held to [`exp_f32`] the same way.
//! The accuracy of each function against f64 is documented on it and measured by the same tests.
//!
//! bf16 is not a type here: an op on bf16 is its f32 op on the widened values, its result rounded
//! once by [`bf16_bits`] (an integer cast to bf16 by [`bf16_bits_of_i64`]) — in both engines. What is not here: the loops over blocks, fusion and row
//! bands (the interpreter's), and the IEEE operations (`+`, `*`, `/`, `sqrt`, negation, `abs`), which
//! the hardware computes alike for every engine (floor, ceil and round are here for their NaN rule).
//!
//! No dependencies: plain Rust and `std::arch`.

// Every unsafe block says why it is sound; every unsafe fn, what its caller must uphold.
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[cfg(test)]
mod accuracy;
mod approx;
pub mod cpu;
mod element;
mod elementfn;
mod exp;
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes256;
#[cfg(target_arch = "x86_64")]
mod lanes512;
mod pow;
pub mod scalar;
mod trig;

pub use element::{
    add_f32, bf16_bits, bf16_bits_of_i64, ceil_f32, f32_of_bf16_bits, floor_f32, max_f32, min_f32,
    mul_f32, round_even_f32, IntOps,
};
pub use elementfn::{
    BinaryF32, Cos, Erf, Exp, Log, Log1p, Logistic, Operand, Pow, Pre, Rem, Rsqrt, Sin, Tanh,
    UnaryF32,
};
pub use exp::exp_f32;
#[cfg(target_arch = "x86_64")]
pub use exp::{exp_run, ExpIn, LaneSum};

// Mistake: an early `return` in a #[kernel_fn] helper.
use tpu_kernel::prelude::*;

#[kernel_fn]
fn scale(x: Array<f32>, s: f32) -> Array<f32> {
    if s == 1.0 {
        return x;
    }
    x * s
}

fn main() {}

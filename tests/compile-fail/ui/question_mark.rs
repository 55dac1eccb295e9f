// Mistake: the `?` operator in a #[kernel_fn] helper.
use tpu_kernel::prelude::*;

#[kernel_fn]
fn h(x: Array<f32>, s: Option<f32>) -> Option<Array<f32>> {
    Some(x * s?)
}

fn main() {}

// Mistake: a scalar's `.min` given an array (its result would be a vector typed as a scalar).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.load();
    let s = scalar(1.0f32).min(v);
    o.store(v * s);
}

fn main() {}

// Mistake: arithmetic on a bool mask.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.load();
    let count = (v > 0.0) + (v < 1.0);
    o.store(v * count.cast::<f32>());
}

fn main() {}

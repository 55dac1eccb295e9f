// Mistake: a #[tpu_kernel] that returns its result instead of storing it.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) -> Array<f32> {
    let y = x.load() * 2.0;
    o.store(y);
    y
}

fn main() {}

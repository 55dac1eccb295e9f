// Mistake: passing launch parameters to the attribute.
use tpu_kernel::prelude::*;

#[tpu_kernel(grid = 4)]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

fn main() {}

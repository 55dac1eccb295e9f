// Mistake: a float index into a ref window.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((1.5, ..)).load());
}

fn main() {}

// Mistake: a float start for a dynamic slice.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let start = 8.0;
    o.store(x.at((ds(start, 8), ..)).load());
}

fn main() {}

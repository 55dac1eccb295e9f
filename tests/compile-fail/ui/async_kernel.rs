// Mistake: an `async` kernel.
use tpu_kernel::prelude::*;

#[tpu_kernel]
async fn k(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

fn main() {}

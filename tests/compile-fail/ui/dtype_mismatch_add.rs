// Mistake: adding arrays of different element types without a cast.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, y: Ref<bf16>, o: RefMut<f32>) {
    o.store(x.load() + y.load());
}

fn main() {}

// Mistake: writing to a read-only input ref.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    x.store(zeros());
    o.store(x.load());
}

fn main() {}

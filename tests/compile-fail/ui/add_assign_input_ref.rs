// Mistake: `+=` on a kernel input (a read-only `Ref`).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    x += 1.0;
    o.store(x.load());
}

fn main() {}

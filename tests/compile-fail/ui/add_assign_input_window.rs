// Mistake: `+=` on a window of a kernel input (a read-only `Ref`).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    x.at((0..8, ..)) += 1.0;
    o.store(x.load());
}

fn main() {}

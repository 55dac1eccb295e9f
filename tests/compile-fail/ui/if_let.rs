// Mistake: `if let` in a kernel body.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    if let Some(scale) = Some(2.0f32) {
        o.store(x.load() * scale);
    }
}

fn main() {}

// Mistake: `let .. else` in a kernel body.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let Some(scale) = Some(2.0f32) else {
        return;
    };
    o.store(x.load() * scale);
}

fn main() {}

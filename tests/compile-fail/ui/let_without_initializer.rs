// Mistake: `let` without an initializer.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let acc;
    acc = x.load();
    o.store(acc);
}

fn main() {}

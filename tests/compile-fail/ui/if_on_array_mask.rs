// Mistake: branching on an elementwise (array) condition.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.load();
    if v > 0.0 {
        o.store(v);
    }
}

fn main() {}

// Mistake: taking a reference to a kernel value.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let v = &x.load();
    o.store(*v);
}

fn main() {}

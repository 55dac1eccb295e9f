// Mistake: a helper fn defined inside the kernel body.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    fn double(v: Array<f32>) -> Array<f32> {
        v * 2.0
    }
    o.store(double(x.load()));
}

fn main() {}

// Mistake: a closure inside a kernel body.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let double = |v: Array<f32>| v * 2.0;
    o.store(double(x.load()));
}

fn main() {}

// Mistake: a misspelled (unknown) kernel method.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.lod());
}

fn main() {}

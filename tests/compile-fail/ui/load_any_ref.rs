// Mistake: loading an ANY (HBM) ref, which only DMA can reach.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32, Any>, o: RefMut<f32>) {
    o.store(x.load());
}

fn main() {}

// Mistake: storing an f32 array into a bf16 output without a cast.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<bf16>) {
    o.store(x.load() * 2.0);
}

fn main() {}

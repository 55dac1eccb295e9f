// Mistake: taking the output ref by `&mut`.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: &mut RefMut<f32>) {
    o.store(x.load());
}

fn main() {}

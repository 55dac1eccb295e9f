// Mistake: `+=` on a whole SMEM ref (it holds scalars: index one element).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>, count: RefMut<i32, Smem>) {
    count += 1;
    o.store(x.load());
}

fn main() {}

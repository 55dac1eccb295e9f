// Mistake: `+=` of an i32 value into an f32 ref, without a cast.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<i32>, o: RefMut<f32>) {
    o += x.load();
}

fn main() {}

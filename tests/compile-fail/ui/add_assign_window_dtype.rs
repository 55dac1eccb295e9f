// Mistake: `+=` of an i32 value into a window of an f32 ref, without a cast.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<i32>, o: RefMut<f32>) {
    o.at((0..8, ..)) += x.load();
}

fn main() {}

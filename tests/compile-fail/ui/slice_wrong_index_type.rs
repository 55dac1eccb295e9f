// Mistake: an inclusive range slicing a value.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load().slice((.., 0..=1)));
}

fn main() {}

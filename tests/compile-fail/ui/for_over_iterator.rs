// Mistake: a `for` loop over an iterator adapter instead of a range.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    for _ in (0..4).rev() {
        o.store(x.load());
    }
}

fn main() {}

// Mistake: an inclusive range `lo..=hi` as a traced loop range.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    for _ in 0..=3 {
        o.store(x.load());
    }
}

fn main() {}

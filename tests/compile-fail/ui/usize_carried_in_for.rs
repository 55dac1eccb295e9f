// Mistake: updating a Rust integer inside a traced `for` loop.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let mut count = 0usize;
    for _ in 0..4 {
        count += 1;
    }
    o.store(x.load() * count as f32);
}

fn main() {}

// Mistake: a `while` loop whose condition is a compile-time Rust bool.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let mut acc = x.load();
    while x.shape()[0] > 8 {
        acc = acc * 0.5;
    }
    o.store(acc);
}

fn main() {}

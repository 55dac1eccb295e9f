// Mistake: a float loop bound.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let n = x.shape()[0] as f32 / 8.0;
    let mut acc = x.load();
    for _ in 0..n {
        acc = acc * 0.5;
    }
    o.store(acc);
}

fn main() {}

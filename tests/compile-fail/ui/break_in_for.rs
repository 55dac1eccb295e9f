// Mistake: `break` out of a traced `for` loop.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    for i in 0..4 {
        if i == 2 {
            break;
        }
        o.store(x.load());
    }
}

fn main() {}

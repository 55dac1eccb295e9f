// Mistake: `continue` inside a traced `while` loop.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let mut i = 0;
    while i < 4 {
        i += 1;
        if i == 2 {
            continue;
        }
        o.store(x.load());
    }
}

fn main() {}

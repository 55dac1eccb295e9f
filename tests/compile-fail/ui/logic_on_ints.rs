// Mistake: `&&` on integer values instead of conditions.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    if program_id(0) && program_id(1) {
        o.store(x.load());
    }
}

fn main() {}

// Mistake: comparing a traced i32 (program_id) with a float literal.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    if program_id(0) == 0.0 {
        o.store(x.load());
    }
}

fn main() {}

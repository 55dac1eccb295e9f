// Mistake: `match` on a traced value.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(o: RefMut<f32>) {
    match program_id(0) {
        _ => o.store(zeros()),
    }
}

fn main() {}

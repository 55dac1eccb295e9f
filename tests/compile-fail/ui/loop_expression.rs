// Mistake: an unbounded `loop`.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(o: RefMut<f32>) {
    loop {
        o.store(zeros());
    }
}

fn main() {}

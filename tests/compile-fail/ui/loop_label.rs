// Mistake: a labeled loop (for a labeled break).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    'rows: for _ in 0..4 {
        o.store(x.load());
    }
}

fn main() {}

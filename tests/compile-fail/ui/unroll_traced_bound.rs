// Mistake: an unrolled loop bounded by a traced value (known only when the kernel runs).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    for _ in unroll(0..program_id(0)) {
        o += 1.0;
    }
}

fn main() {}

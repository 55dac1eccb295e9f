// Mistake: counting a bool mask with `.sum` (reductions need a numeric element type).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<i32>) {
    let positive = x.load() > 0.0;
    let count = positive.sum_keepdims(1);
    o.store(count.cast::<i32>().broadcast_to(o.shape()));
}

fn main() {}

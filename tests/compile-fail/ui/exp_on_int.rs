// Mistake: a float-only op (`exp`) on an integer array.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<i32>, o: RefMut<i32>) {
    o.store(x.load().exp());
}

fn main() {}

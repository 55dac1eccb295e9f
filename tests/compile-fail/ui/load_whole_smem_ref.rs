// Mistake: loading a whole SMEM ref as a vector (SMEM holds scalars).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(idx: Ref<i32, Smem>, o: RefMut<i32>) {
    o.store(idx.load());
}

fn main() {}

// Mistake: `dot` on i32 arrays (the MXU takes bf16, f32 or i8).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<i32>, y: Ref<i32>, o: RefMut<i32>) {
    let p = dot(x.load(), y.load());
    o.store(p);
}

fn main() {}

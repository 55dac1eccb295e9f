// Mistake: a traced u32 index (ref windows take i32 starts) as the whole index.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0).cast::<u32>();
    o.store(x.at(i).load().reshape([1, 128]));
}

fn main() {}

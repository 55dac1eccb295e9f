// Mistake: a macro call (println!) inside a kernel body.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    println!("tracing k");
    o.store(x.load());
}

fn main() {}

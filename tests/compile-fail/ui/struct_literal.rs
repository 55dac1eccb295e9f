// Mistake: building a struct inside a kernel body.
use tpu_kernel::prelude::*;

struct Params {
    scale: f32,
}

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let p = Params { scale: 2.0 };
    o.store(x.load() * p.scale);
}

fn main() {}

// Mistake: launching a kernel that takes a plain Rust parameter.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn scale_kernel(x: Ref<f32>, o: RefMut<f32>, s: f32) {
    o.store(x.load() * s);
}

fn main() {
    let _builder = pallas_call(scale_kernel);
}

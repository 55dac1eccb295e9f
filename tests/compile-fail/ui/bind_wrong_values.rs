// Mistake: binding two values to a kernel with one compile-time parameter.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn scale_kernel(x: Ref<f32>, o: RefMut<f32>, s: f32) {
    o.store(x.load() * s);
}

fn main() {
    let _builder = pallas_call(scale_kernel.bind((2.0, 3.0)));
}

// Mistake: `+=` on a loaded value (a temporary, not a variable or a ref).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    x.load() += 1.0;
    o.store(x.load());
}

fn main() {}

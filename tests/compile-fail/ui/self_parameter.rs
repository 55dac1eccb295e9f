// Mistake: a #[tpu_kernel] method taking `self`.
use tpu_kernel::prelude::*;

struct Kernels;

impl Kernels {
    #[tpu_kernel]
    fn k(self, x: Ref<f32>, o: RefMut<f32>) {
        o.store(x.load());
    }
}

fn main() {}

// Mistakes: a default on an array parameter, a destructured static parameter, a generic launch fn.
use tpu_kernel::prelude::*;

#[export]
pub fn f<T>(#[default(1)] x: ArrayType, (a, b): (usize, usize)) -> Result<PallasCall, KernelError> {
    let _ = (x, a, b);
    unimplemented!()
}

fn main() {}

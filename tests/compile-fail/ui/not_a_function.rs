// Mistake: #[tpu_kernel] on something that is not a function.
use tpu_kernel::prelude::*;

#[tpu_kernel]
struct MyKernel;

fn main() {}

// Mistakes with the target parameter: a default, a second one, one by reference, and a static
// parameter named `target` (the JAX op's keyword for the generation).
use tpu_kernel::prelude::*;

#[export]
pub fn f(
    x: ArrayType,
    #[default(Target::V6e)] gen: Target,
    again: Target,
    by_ref: &Target,
    target: usize,
) -> Result<PallasCall, KernelError> {
    let _ = (x, gen, again, by_ref, target);
    unimplemented!()
}

fn main() {}

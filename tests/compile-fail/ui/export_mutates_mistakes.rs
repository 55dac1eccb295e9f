// Mistakes: `mutates(..)` naming a static parameter and an unknown name (it lists array inputs).
use tpu_kernel::prelude::*;

#[export(mutates(block, z))]
pub fn scale(x: ArrayType, #[default(8)] block: usize) -> Result<PallasCall, KernelError> {
    let _ = (x, block);
    unimplemented!()
}

fn main() {}

// Mistakes: a gradient rule naming an unknown array and a non-static parameter, and not covering `y`.
use tpu_kernel::prelude::*;

#[export(grad(x = mul_dx(g, z, block = size)))]
pub fn mul(x: ArrayType, y: ArrayType, #[default(8)] block: usize) -> Result<PallasCall, KernelError> {
    let _ = (x, y, block);
    unimplemented!()
}

fn main() {}

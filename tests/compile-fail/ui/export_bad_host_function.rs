// Mistake: export_library! lists a host function that does not return a Result with KernelError
// (and one taking a type with no JSON form); each error is at the listed path.
use tpu_kernel::prelude::*;

pub fn offsets(sizes: Vec<i32>) -> Vec<i32> {
    sizes
}

pub fn takes_an_array_type(x: ArrayType) -> Result<usize, KernelError> {
    Ok(x.shape.len())
}

tpu_kernel::export_library!("lib", [], host = [offsets, takes_an_array_type]);

fn main() {}

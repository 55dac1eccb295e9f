// Mistake: export_library! lists a function that is not #[export]ed (rustc: "not a type": the list names the type #[export] puts beside each launch fn).
use tpu_kernel::prelude::*;

pub fn not_exported(x: ArrayType) -> Result<PallasCall, KernelError> {
    let _ = x;
    unimplemented!()
}

tpu_kernel::export_library!("lib", [not_exported]);

fn main() {}

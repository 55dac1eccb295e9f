// Mistake: a crate with its own #[global_allocator] lets export_library! declare the library's too
// (rustc points at the library's name; `allocator = system` declares none: tests/ui_pass/export_own_allocator.rs).
use tpu_kernel::prelude::*;

#[global_allocator]
static MINE: std::alloc::System = std::alloc::System;

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

#[export]
pub fn copy(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let all = || BlockSpec::new([m, n], |[_i]| (0, 0));
    pallas_call(copy_kernel)
        .grid([1])
        .input(x, all())
        .output(ArrayType::new([m, n], F32), all())
        .build()
}

tpu_kernel::export_library!("lib", [copy]);

fn main() {}

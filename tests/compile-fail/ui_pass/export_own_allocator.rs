// Not a mistake: a crate with its own #[global_allocator] and `allocator = system` (the library
// declares none), the fix of tests/ui/export_second_allocator.rs.
#[global_allocator]
static MINE: std::alloc::System = std::alloc::System;

tpu_kernel::export_library!("lib", [], allocator = system);

fn main() {
    // The library's C ABI is generated all the same.
    assert_eq!(tpu_kernel_abi_version(), tpu_kernel::__private::export::ABI_VERSION);
}

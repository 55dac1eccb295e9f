// Mistake: a crate with its own #[global_allocator] lets export_library! declare the library's too
// (rustc points at the library's name; `allocator = system` declares none: tests/ui_pass/export_own_allocator.rs).
#[global_allocator]
static MINE: std::alloc::System = std::alloc::System;

tpu_kernel::export_library!("lib", []);

fn main() {}

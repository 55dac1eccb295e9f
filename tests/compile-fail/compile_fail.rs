//! Compile-fail tests: user mistakes that must be compile errors at the user's tokens, with a hint.
//!
//! `ui/*.rs` are the cases (one mistake each); the `.stderr` next to each is the expected rustc output.
//! Regenerate after an intended message change with `TRYBUILD=overwrite cargo test -p tpu-kernel-compile-fail`
//! and read the diff. The toolchain is pinned (`rust-toolchain.toml`) so the output is stable.
//! `ui_pass/*.rs` are their counterparts that must compile (the fix a message or doc suggests).

#[test]
fn compile_fail() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui_pass/*.rs");
}

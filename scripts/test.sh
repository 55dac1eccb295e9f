#!/usr/bin/env bash
# Run every test: Rust (unit, snapshot, parity, trace-error, compile-fail, interpreter) and the Python
# real-toolchain suite (jaxlib verify, libtpu compile for v5e/v6e/tpu7x, Pallas parity). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, so a slow CI run says where its minutes went.
phase_start=$SECONDS
phase() { echo "== ($((SECONDS - phase_start)) s so far) $*"; }

scripts/setup.sh --python

# Disk: a run once failed with "No space left on device". A test run builds once, so it writes no
# incremental caches (2.8 GB of target/debug/incremental), and its ~70 test and example binaries, each
# linking MLIR, carry no debug info (2.6 GB of line tables, most of it the standard library's): a
# panic still names its file and line, a backtrace its functions.
export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_DEV_STRIP=debuginfo

phase "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The same crates as a kernel crate builds them: default features, no MLIR (the cfg'd-out paths).
cargo clippy --workspace --lib --quiet -- -D warnings
phase "cargo test"
# Benches are compiled by clippy above but not run here: they are benchmarks, not tests (cargo bench).
cargo test --workspace --lib --bins --tests --examples
cargo test --workspace --doc --quiet
# trybuild's scratch project (tests/compile-fail) is used by that test alone.
rm -rf target/tests/trybuild
phase "memcheck (valgrind over the interpreter's unsafe code; reuses the test binaries above)"
scripts/memcheck.sh
phase "cargo doc (broken intra-doc links fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

if [ -d python/tests ] && ls python/tests/test_*.py >/dev/null 2>&1; then
    phase "pytest (real toolchain)"
    cargo build --quiet --examples
    # The tpu_kernel package, installed as a user would (its build runs cargo on examples-lib/, into
    # the same target/), and the user-crate fixture of the error tests.
    .venv/bin/pip install -q --disable-pip-version-check .
    phase "mypy (the package's type hints; pyproject.toml [tool.mypy])"
    .venv/bin/mypy
    cargo build --quiet -p tpu-kernel-user-crate
    phase "a kernel crate builds and runs with no LLVM/MLIR (fresh target, empty MLIR prefix)"
    scripts/no_mlir_build.sh
    phase "hostile input, dispatch paths and NaN payloads in release (overflow checks are explicit, not debug assertions; reuses pip's release build)"
    cargo test --release --quiet --test hostile_input
    # NaN payloads and every dispatch path in release, where the compiler may commute a float add's
    # operands (the ops choose the NaN explicitly; a debug build would hide a lapse).
    cargo test --release --quiet --test cpu_paths --test fuzz_interpret
    # Two workers (pytest-xdist): most of the suite is libtpu compiles and jax traces, each on one
    # core (measured: 849 tests in 10.3 min on 2 workers, beside other builds). The slowest tests
    # are listed, to keep CI's time in view.
    .venv/bin/python -m pytest python/tests -q -n 2 --durations=25
fi
phase "done"

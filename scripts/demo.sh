#!/usr/bin/env bash
# The demo: build the tiled bf16 matmul kernel, show its summary and its Mosaic MLIR, run it on the CPU
# (interpret mode) and check the result against a plain-Rust reference.
# Installs the LLVM/MLIR 22 packages the build needs on a fresh Debian 12 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "== building the examples (first build compiles MLIR bindings: a few minutes)"
cargo build --quiet --example matmul
echo
echo "== kernel summary (cargo run --example matmul)"
cargo run --quiet --example matmul
echo
echo "== Mosaic MLIR (cargo run --example matmul -- --emit mlir)"
cargo run --quiet --example matmul -- --emit mlir
echo
echo "== run it on the CPU in interpret mode and check the numbers (cargo run --example matmul -- --run)"
cargo run --quiet --example matmul -- --run

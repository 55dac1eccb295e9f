#!/usr/bin/env bash
# The demo: build the tiled bf16 matmul kernel, show its summary and its Mosaic MLIR, run it on the CPU
# (interpret mode) and check the result against a plain-Rust reference; then a user crate's kernel as a
# JAX op (jit + vmap + grad on CPU, and its TPU lowering).
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
echo
echo "== the same language as a JAX op: a user crate's kernel under jax.jit + vmap + grad on CPU, and its"
echo "   lowering (README, 'Kernels as JAX ops'); installs the venv and the tpu_kernel package first"
scripts/setup.sh --python
cargo build --quiet -p tpu-kernel-user-crate
.venv/bin/pip install -q --disable-pip-version-check .
JAX_PLATFORMS=cpu .venv/bin/python scripts/readme_example.py
echo "== the README's torchax example: the same kernels in a torch model"
JAX_PLATFORMS=cpu .venv/bin/python scripts/readme_example.py "Kernels in PyTorch (torchax)"

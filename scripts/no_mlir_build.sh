#!/usr/bin/env bash
# A kernel crate needs no LLVM/MLIR: build tests/user-crate (a crate exporting kernels, as a user
# writes one) in a fresh target folder with the MLIR/tablegen prefixes pointing at an empty folder —
# mlir-sys would fail to build there — and load the library through the Python package's ABI check.
#
#   scripts/no_mlir_build.sh            the proof (CI runs it)
#   scripts/no_mlir_build.sh --timing   also the same cold build with `--features tpu-kernel/mlir`
#                                       (the real LLVM 22 prefix), both timed, for comparison
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/empty"

cold_build() { # <target dir> <extra cargo args...>
    local target=$1
    shift
    local start=$SECONDS
    CARGO_TARGET_DIR="$target" cargo build --quiet -p tpu-kernel-user-crate "$@"
    echo $((SECONDS - start))
}

echo "no-mlir: cold build of tests/user-crate with MLIR_SYS_220_PREFIX=<empty folder>"
secs=$(MLIR_SYS_220_PREFIX="$work/empty" TABLEGEN_220_PREFIX="$work/empty" cold_build "$work/target-plain")
lib="$work/target-plain/debug/libtpu_kernel_user_crate.so"
[ -f "$lib" ] || { echo "no-mlir: $lib was not built" >&2; exit 1; }
if [ -d "$work/target-plain/debug/build" ] && ls "$work/target-plain/debug/build" | grep -q '^mlir-sys-\|^melior-'; then
    echo "no-mlir: the build compiled mlir-sys or melior" >&2
    exit 1
fi
echo "no-mlir: built in ${secs} s with no LLVM/MLIR; loading it"
[ -x .venv/bin/python ] || { echo "no-mlir: no .venv: run scripts/setup.sh --python" >&2; exit 1; }
.venv/bin/python - "$lib" <<'PY'
import sys
import numpy as np
import jax
import tpu_kernel
lib = tpu_kernel.load(sys.argv[1])
x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
y = np.asarray(jax.jit(lambda x: lib.scale(x, factor=2.0))(x))
assert np.array_equal(y, 2.0 * x), "scale gave wrong numbers"
print(f"no-mlir: tpu_kernel.load accepted it; jax.jit(lib.scale) on CPU is exact ({', '.join(sorted(lib.kernels))})")
PY

if [ "${1:-}" = "--timing" ]; then
    echo "no-mlir: the same cold build with --features tpu-kernel/mlir (LLVM/MLIR 22 from .cargo/config.toml)"
    with=$(cold_build "$work/target-mlir" --features tpu-kernel/mlir)
    echo "cold build of a kernel crate: ${secs} s without MLIR, ${with} s with the mlir feature"
fi

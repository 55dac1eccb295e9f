#!/usr/bin/env bash
# Install what the build and the tests need on a fresh Debian 12 machine; skips what is present.
#   scripts/setup.sh          LLVM/MLIR 22 packages (for melior) — enough for the Rust build and the demo
#   scripts/setup.sh --python also the pinned Python venv (.venv) with jax/jaxlib/libtpu for the real-toolchain tests
set -euo pipefail
cd "$(dirname "$0")/.."

# valgrind: scripts/memcheck.sh (memcheck over the interpreter's unsafe code) and the helgrind/drd run
# of the FFI handler (tests/ffi_concurrency.rs).
APT_PACKAGES=(llvm-22-dev libmlir-22-dev libclang1-22 libclang-common-22-dev libpolly-22-dev libzstd-dev mlir-22-tools valgrind)
PYTHON_VERSION=3.12.1

need_apt=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
[ -d /usr/lib/llvm-22/lib/cmake/mlir ] || { echo "setup: MLIR 22 is missing after install" >&2; exit 1; }

if [ "${1:-}" = "--python" ]; then
    if [ ! -x .venv/bin/python ]; then
        py=""
        for cand in "$(pyenv root 2>/dev/null)/versions/$PYTHON_VERSION/bin/python3" "$HOME/.pyenv/versions/$PYTHON_VERSION/bin/python3" python3.12 python3.13; do
            if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1; then
                if "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'; then py="$cand"; break; fi
            fi
        done
        [ -n "$py" ] || { echo "setup: need Python >= 3.12 (jax 0.12 requires it); none found" >&2; exit 1; }
        echo "setup: creating .venv with $py"
        "$py" -m venv .venv
    fi
    .venv/bin/pip install -q --disable-pip-version-check -r python/requirements.txt
    # tpu-inference (vLLM's TPU backend) for its ragged paged attention kernel and reference, which
    # python/tests/test_ragged_paged_attention.py compares ours with. Its own pins (jax 0.11.2, vllm)
    # are not installed: its kernel modules run under our jax (python/tests/tpu_inference_rpa.py).
    .venv/bin/pip install -q --disable-pip-version-check --no-deps tpu-inference==0.32.0
fi

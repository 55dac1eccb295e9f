#!/usr/bin/env bash
# The interpreter's unsafe code under valgrind memcheck (Debian's `valgrind`; scripts/setup.sh installs
# it): raw output destinations, the worker pool, the AVX2 loops, the gemm calls, borrowed XLA buffers
# and the FFI handler. Any invalid read or write, use of uninitialized memory, overlapping copy or
# definitely lost block fails the run.
#
#   scripts/memcheck.sh          the focused set CI runs (tests/memcheck.rs at small shapes and the unit
#                                tests of the raw-destination, worker, row-order and i8 GEMM loops, and
#                                of the vector math's loops in kernel-math): ~3 minutes
#   scripts/memcheck.sh --full   also the whole interpreter suite at its real shapes (tests/interpret.rs,
#                                tests/export.rs, every kernel-runtime unit test but loom's, every
#                                kernel-math unit test): hours
#
# Valgrind emulates AVX2 and FMA but not AVX-512, so the AVX2 paths are the ones checked here; the
# AVX-512 paths (F, BF16, VNNI: exp/unary loops, the bf16 and i8 GEMM tiles) are not reached under
# valgrind, which reports a CPU without them. Valgrind ignores MXCSR's DAZ and FTZ, so the portable bf16
# GEMM runs here on values that never meet a subnormal (its subnormal bits are checked natively, by
# `dot_bf16_order::tests::every_path_gives_vdpbf16ps_bits`). Valgrind 3.19 cannot read the DWARF 5 parts
# of the test binaries' debug info, so each binary runs as an `objcopy --strip-debug` copy (symbols
# stay, so reports still name functions).
set -euo pipefail
cd "$(dirname "$0")/.."

full=0
[ "${1:-}" = "--full" ] && full=1

if ! command -v valgrind >/dev/null 2>&1; then
    echo "memcheck: FAILED: valgrind is not installed (scripts/setup.sh installs it; apt-get install valgrind)" >&2
    exit 1
fi

# The test binaries `cargo test --workspace` builds anyway (same packages, profile and features as
# scripts/test.sh: nothing is compiled again).
executable() { # <target name> <cargo test args...>: the path of that target's test binary
    local name=$1; shift
    cargo test --workspace --no-run --message-format=json "$@" 2>/dev/null \
        | grep "\"name\":\"$name\"" | grep -o '"executable":"[^"]*"' | tail -1 \
        | sed 's/"executable":"\(.*\)"/\1/'
}
runtime=$(executable kernel_runtime --lib)
math=$(executable kernel_math --lib)
focused=$(executable memcheck --test memcheck)
[ -x "$runtime" ] && [ -x "$math" ] && [ -x "$focused" ] || { echo "memcheck: FAILED: could not build the test binaries" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
check() { # <binary> <label> <test args...>
    local bin=$1 label=$2; shift 2
    local copy="$work/$(basename "$bin")"
    [ -f "$copy" ] || objcopy --strip-debug "$bin" "$copy"
    echo "== memcheck: $label"
    local start=$SECONDS
    if valgrind --tool=memcheck --error-exitcode=97 --leak-check=full --errors-for-leak-kinds=definite \
        --show-leak-kinds=definite --num-callers=30 -q "$copy" --test-threads 1 "$@"; then
        echo "memcheck: $label: 0 errors ($((SECONDS - start)) s)"
    else
        echo "memcheck: FAILED: $label (exit $?; the valgrind report is above)" >&2
        failed=1
    fi
}

check "$runtime" "kernel-runtime unit tests (raw destinations, workers, row order, exp-and-sum, i8 GEMM)" \
    interpret::elementwise interpret::workers::tests interpret::row_order interpret::coalesce \
    interpret::dot::tests interpret::dot_bf16:: interpret::dot_bf16_order::tests::fma_kernels_on_ordinary_values
check "$math" "kernel-math unit tests (the vector math's loops: exp, every unary and binary width)" \
    exp::tests element::tests accuracy::vector_loops_stay accuracy::specials_follow_jnp
check "$focused" "tests/memcheck.rs (every example in every mode, borrowed buffers, FFI frames)"

if [ $full = 1 ]; then
    check "$runtime" "kernel-runtime unit tests (all but loom's model)" --skip interpret::workers::model
    check "$math" "kernel-math unit tests"
    check "$(executable interpret --test interpret)" "tests/interpret.rs"
    check "$(executable export --test export)" "tests/export.rs"
fi

if [ $failed = 1 ]; then
    echo "memcheck: FAILED" >&2
    exit 1
fi
echo "memcheck: all clean"

#!/usr/bin/env bash
# The XLA FFI handler under valgrind's helgrind: 8 threads calling the handler entry on XLA-shaped call
# frames (tests/ffi_concurrency.rs, `warm_threads_for_helgrind`) — a kernel all threads share, kernels of
# their own, a donated buffer, bad calls. Any race helgrind reports fails the run.
#
#   scripts/helgrind.sh [calls per thread, default 8]     (~1 minute; not part of scripts/test.sh)
#
# What helgrind can judge here, and what it cannot: it models pthreads, not atomics or futexes, and
# Rust's std::sync (Mutex, Once, Barrier, channels) is futexes and atomics. So
# - the handler's caches are warm before the threads start (their first insertion is under a
#   std::sync::Mutex, invisible to helgrind; safe Rust, so race-free by construction anyway);
# - the interpreter's worker pool is one thread (RAYON_NUM_THREADS=1): its hand-off is atomics, checked
#   under every interleaving by loom instead (kernel-runtime/src/interpret/workers.rs, `model`), and
#   its raw writes by memcheck (scripts/memcheck.sh). With a pool of 2 helgrind reports every chunk's
#   writes as racing with the caller that waited for them (450 contexts in one run), all of that hand-off;
# - scripts/helgrind.supp suppresses std's thread-start bookkeeping, memchr's cached function pointer,
#   the test runner's channel and the driver's Barrier — nothing of tpu-kernel's.
# Left for helgrind: the threads sharing one library, its built kernels and the handler's index, each
# reading XLA's frames and buffers and writing its outputs, errors through XLA_FFI_Error_Create.
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-8}

if ! command -v valgrind >/dev/null 2>&1; then
    echo "helgrind: FAILED: valgrind is not installed (scripts/setup.sh installs it)" >&2
    exit 1
fi
bin=$(cargo test --workspace --no-run --message-format=json --test ffi_concurrency 2>/dev/null \
    | grep '"name":"ffi_concurrency"' | grep -o '"executable":"[^"]*"' | tail -1 \
    | sed 's/"executable":"\(.*\)"/\1/')
[ -x "$bin" ] || { echo "helgrind: FAILED: could not build tests/ffi_concurrency.rs" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# valgrind 3.19 cannot read the DWARF 5 parts of the debug info: run a copy without it (symbols stay).
objcopy --strip-debug "$bin" "$work/ffi_concurrency"
start=$SECONDS
RAYON_NUM_THREADS=1 TPU_KERNEL_FFI_STRESS_CALLS=$calls \
    valgrind --tool=helgrind --error-exitcode=97 --suppressions=scripts/helgrind.supp \
    "$work/ffi_concurrency" --exact warm_threads_for_helgrind --test-threads 1 --nocapture
echo "helgrind: 8 threads x $calls calls: no races reported ($((SECONDS - start)) s)"

"""The Pallas side of `cargo bench --bench lowering` (P1): trace + lower for TPU of the Pallas version of
an example kernel (python/tests/pallas_kernels.py), one new signature per request, timed here.

Reads requests from stdin, one per line: `<case> <json [[shape, dtype], ...]>`; answers each with one
line: the milliseconds `jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))` took for those
input shapes (a shape never lowered before in this process, so jax's caches do not hide the work).
pallas_kernels.py imports `tpu_kernel.examples`: install the package or build the examples library
(`cargo build --release -p tpu-kernel-examples`; see repo_python.py).
"""
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import repo_python  # noqa: E402

repo_python.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pallas_kernels  # noqa: E402

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "i32": jnp.int32, "i8": jnp.int8}


def lower_ms(case: str, shapes) -> float:
    fn, _ = pallas_kernels.KERNELS[case]
    args = [jax.ShapeDtypeStruct(tuple(s), DTYPES[d]) for s, d in shapes]
    t = time.perf_counter()
    jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    return (time.perf_counter() - t) * 1e3


def main():
    for line in sys.stdin:
        case, shapes = line.strip().split(" ", 1)
        try:
            print(f"{lower_ms(case, json.loads(shapes)):.6f}", flush=True)
        except Exception as e:  # the bench prints the failure instead of a figure
            print(f"error {type(e).__name__}: {e}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()

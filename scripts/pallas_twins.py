"""Write the Pallas twin of every example, lowered for TPU per generation, as test data:
tests/data/pallas_twins/<example>.<generation>.mlir (StableHLO text holding the twin's
`tpu_custom_call`).

    .venv/bin/python scripts/pallas_twins.py

`tests/libtpu.rs` compiles these beside our kernels through libtpu from Rust (no Python in the Rust
test: the twin's program is data); `python/tests/test_libtpu.py::test_pallas_twin_programs_are_current`
fails when a stored program no longer compiles to what the live twin (python/tests/pallas_kernels.py)
compiles to: rerun this script then. Each program is the twin traced and lowered for its generation
(`tpu_toolchain.lower_jax_for_tpu`), as the Python parity tests compile it.
"""
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python" / "tests"))
sys.path.insert(0, str(REPO / "python"))

import tpu_toolchain as tc  # noqa: E402  (before jax)
import pallas_kernels  # noqa: E402

GENERATIONS = ("v5e", "v6e", "tpu7x")
OUT = REPO / "tests" / "data" / "pallas_twins"


def main(names=None):
    OUT.mkdir(parents=True, exist_ok=True)
    for name in sorted(names or pallas_kernels.KERNELS):
        fn, args = pallas_kernels.KERNELS[name]
        for g in GENERATIONS:
            text = tc.lower_jax_for_tpu(fn, args, g)
            path = OUT / f"{name}.{g}.mlir"
            path.write_text(text)
            print(f"{path.relative_to(REPO)}: {len(text)} chars", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

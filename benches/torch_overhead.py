"""Per-call overhead of our kernels as torch ops (issue 24, item 7), side by side in one process: the
same tiny kernel (`add`, one (8, 128) f32 block: the kernel's own work is negligible) called as

- `jax eager`      the JAX op on jax arrays, `tpu_kernel.examples.add(x, y)` (the reference: ratio 1)
- `jax jit`        the same inside `jax.jit`
- `torch op`       `tpu_kernel.torch.examples.add(x, y)` on CPU tensors (Python checks + the
                   `torch.library` op: dlpack copies in and out around the JAX op)
- `torch.ops`      `torch.ops.tpu_kernel_examples.add(x, y, block=[8, 128])` directly (no Python checks)
- `torch.compile`  a function calling the op, `torch.compile(fullgraph=True)` (inductor, CPU)
- `torch a + b`    plain torch, for scale

    .venv/bin/python benches/torch_overhead.py           # 3 interleaved rounds, ~0.5 s per case each
    .venv/bin/python benches/torch_overhead.py --quick   # 1 round

Each figure is the median per-call time of warm calls (results waited for: `block_until_ready` for jax);
rounds interleave the cases, rotating their order, and each case keeps its best round. The outputs are
checked equal before timing (exit status 1 otherwise).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repo_python  # noqa: E402

repo_python.setup()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import tpu_kernel.examples as ex  # noqa: E402
import tpu_kernel.torch.examples as tex  # noqa: E402

SHAPE, BLOCK = (8, 128), (8, 128)


def cases():
    xa = jax.numpy.arange(SHAPE[0] * SHAPE[1], dtype=jax.numpy.float32).reshape(SHAPE)
    ya = xa * 3
    xt, yt = torch.from_numpy(np.array(xa)), torch.from_numpy(np.array(ya))  # writable copies
    jitted = jax.jit(lambda a, b: ex.add(a, b, block=BLOCK))
    compiled = torch.compile(lambda a, b: tex.add(a, b, block=BLOCK), fullgraph=True)
    op = torch.ops.tpu_kernel_examples.add
    return {
        "jax eager": lambda: ex.add(xa, ya, block=BLOCK).block_until_ready(),
        "jax jit": lambda: jitted(xa, ya).block_until_ready(),
        "torch op": lambda: tex.add(xt, yt, block=BLOCK),
        "torch.ops": lambda: op(xt, yt, block=list(BLOCK))[0],
        "torch.compile": lambda: compiled(xt, yt),
        "torch a + b": lambda: xt + yt,
    }


def per_call(fn, budget: float) -> float:
    """Median seconds per call over batches filling `budget` seconds."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        fn()
        n += 1
    batch = max(1, n // 5)
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < budget or len(samples) < 5:
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t) / batch)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    table = cases()
    want = np.asarray(table["jax eager"]())
    for name, fn in table.items():
        got = fn()
        got = np.asarray(got) if not isinstance(got, torch.Tensor) else got.numpy()
        if not np.array_equal(got, want):
            print(f"{name}: output differs from the JAX op's", file=sys.stderr)
            return 1
    rounds, budget = (1, 0.3) if args.quick else (3, 0.5)
    best: dict[str, float] = {}
    names = list(table)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = per_call(table[name], budget)
            best[name] = min(best.get(name, t), t)
    ref = best["jax eager"]
    print(f"per-call time, add on one {SHAPE} f32 block (CPU; torch {torch.__version__}, jax {jax.__version__}):")
    print(f"{'call':<16} {'µs/call':>9} {'vs jax eager':>13} {'vs jax jit':>11}")
    for name in names:
        print(f"{name:<16} {best[name] * 1e6:>9.1f} {best[name] / ref:>12.2f}× {best[name] / best['jax jit']:>10.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cost model against a kernel timed on a TPU: where the per-step cost comes from (docs/tune.md).

jax's Pallas TPU guide "Matrix Multiplication" (https://docs.jax.dev/en/latest/pallas/tpu/matmul.html,
section "Performance of pipelined kernels") times its blocked bf16 matmul on a TPU v5e — the kernel
with an f32 accumulator in VMEM scratch, zeroed under `k == 0` and stored under `k == last`, grid
`(m / bm, n / bn, k / bk)` — at 1024³, 4096³ and 8192³ with blocks (128, 128, 128) and (512, 1024,
1024), and publishes the times (`MEASURED` below, seconds, the median of 100 timed calls each). That is
a measurement on hardware of a kernel none of the tables `tune_tpu_inference.py` checks against was
tuned from.

This script writes the same kernel (same blocks, grid, scratch and branches), compiles it for v5e with
libtpu through `tpu_kernel.tune` (no TPU), and sets the model's cycles against the measured time. With
blocks of 128 the kernel runs 512 to 262,144 grid steps of a few hundred cycles each: what the model
without its per-step cost leaves unexplained there, divided by the steps, is that cost
(`kernel_runtime::libtpu::cost::STEP_S` is taken from the 4096³ and 8192³ rows; the guide's timing
includes one dispatch per call, tens of microseconds, which the 1024³ rows cannot hide).

    .venv/bin/python benches/step_overhead.py            # six compiles for v5e, ~1 min
"""
from __future__ import annotations

import functools
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import tpu_kernel  # noqa: E402

#: docs.jax.dev/en/latest/pallas/tpu/matmul.html, "Performance of pipelined kernels" (TPU v5e):
#: (size, (bm, bk, bn)) -> seconds per call
MEASURED = {
    (1024, (128, 128, 128)): 0.00029766598949208854,
    (4096, (128, 128, 128)): 0.011771515250438824,
    (8192, (128, 128, 128)): 0.09183577066054567,
    (1024, (512, 1024, 1024)): 0.00012708659982308746,
    (4096, (512, 1024, 1024)): 0.00088908776990138,
    (8192, (512, 1024, 1024)): 0.006099433819763363,
}
GENERATION = "v5e"


def _body(x_ref, y_ref, z_ref, acc_ref, *, steps):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _zero():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == steps - 1)
    def _store():
        z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def blocked_matmul(x, y, *, block):
    bm, bk, bn = block
    (m, kk), n = x.shape, y.shape[1]
    return pl.pallas_call(
        functools.partial(_body, steps=kk // bk),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(m // bm, n // bn, kk // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                      pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def model_rows(sizes: tuple[int, ...] = (1024, 4096, 8192), workers: int = 2) -> list[dict]:
    """Per measured case of `sizes`: the model's estimate for v5e next to the measured time."""
    rows = []
    for size in sizes:
        a = jax.ShapeDtypeStruct((size, size), jnp.bfloat16)
        blocks = [b for s, b in MEASURED if s == size]
        t = tpu_kernel.tune(blocked_matmul, a, a, space={"block": blocks}, generation=GENERATION,
                            workers=workers, progress=False, name=f"blocked_matmul_{size}")
        for c in t.candidates:
            if c.outcome != "ranked":
                raise RuntimeError(f"{size}, {c.config}: {c.outcome}: {c.reason}")
            block = tuple(c.config["block"])
            est = c.estimate
            clock = est["cycles"] / est["seconds"]  # the model's clock for the generation (cost::constants)
            before = est["cycles"] - est["step_overhead"]  # the model without its per-step cost
            measured_s = MEASURED[(size, block)]
            rows.append({"size": size, "block": block, "steps": est["steps"], "before": before,
                         "cycles": est["cycles"], "measured_s": measured_s,
                         "before_s": before / clock, "model_s": est["seconds"],
                         "per_step_ns": (measured_s - before / clock) / est["steps"] * 1e9,
                         "per_step_cycles": (measured_s * clock - before) / est["steps"]})
    return rows


def main() -> int:
    rows = model_rows()
    print(f"blocked bf16 matmul on TPU {GENERATION}: the model (libtpu's schedule) against jax's published times")
    print("| size | block (bm, bk, bn) | grid steps | measured µs | model without the per-step cost, µs | "
          "what it leaves per step | the model, µs | measured / model |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']}³ | {', '.join(map(str, r['block']))} | {r['steps']:,} | {r['measured_s'] * 1e6:,.1f} | "
              f"{r['before_s'] * 1e6:,.1f} | {r['per_step_ns']:,.0f} ns ({r['per_step_cycles']:,.0f} cycles) | "
              f"{r['model_s'] * 1e6:,.1f} | {r['measured_s'] / r['model_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Baselines for `cargo bench --bench interpret`: XLA:CPU (`jax.jit` of the jnp computation) and Pallas
`interpret=True` (the same kernels as examples/, written in Pallas), on the same shapes.

Batch mode prints one line per case: `<case> <xla median ms> <pallas interpret median ms> <xla min ms>`.
With `--serve` it reads requests from stdin, one per line, and answers each with one line:
`xla <case>` -> `<median ms> <min ms>`, `pallas <case>` -> `<median ms> <min ms>` (so the benchmark can
interleave XLA and its own runs in time). Inputs are numpy-generated;
numpy does no timed work here, so OPENBLAS_CORETYPE does not matter.

usage: python xla_baselines.py [--quick]
"""
import statistics
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

QUICK = "--quick" in sys.argv


# ---------------------------------------------------------------- kernels (as in examples/)
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add_pallas(x, y, bm=256, bn=256):
    m, n = x.shape
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(
        add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(m // bm, n // bn),
        in_specs=[spec, spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=True)(x, y)


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _fin():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_pallas(x, y, b=128):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // b, n // b, k // b),
        in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)), pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=True)(x, y)


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax_pallas(x, br=8):
    m, n = x.shape
    spec = pl.BlockSpec((br, n), lambda i: (i, 0))
    return pl.pallas_call(
        softmax_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(m // br,),
        in_specs=[spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(x)


def rmsnorm_kernel(x_ref, w_ref, o_ref, eps=1e-6):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    o_ref[...] = (x * lax.rsqrt(ms + eps) * w_ref[...]).astype(o_ref.dtype)


def rmsnorm_pallas(x, w, br=16):
    m, n = x.shape
    return pl.pallas_call(
        rmsnorm_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(m // br,),
        in_specs=[pl.BlockSpec((br, n), lambda i: (i, 0)), pl.BlockSpec((1, n), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((br, n), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(x, w)


# ---------------------------------------------------------------- jnp references (what XLA:CPU runs)
def matmul_jnp(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def softmax_jnp(x):
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def rmsnorm_jnp(x, w, eps=1e-6):
    xf = x.astype(jnp.float32)
    return (xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * w).astype(x.dtype)


def add_jnp(x, y):
    return x + y


rng = np.random.default_rng(0)


def uni(shape, dtype):
    return jnp.asarray(rng.uniform(-1, 1, size=shape).astype(np.float32)).astype(dtype)


CASES = {
    "matmul_bf16_256": (matmul_jnp, matmul_pallas, lambda: [uni((256, 256), jnp.bfloat16), uni((256, 256), jnp.bfloat16)]),
    "matmul_bf16_512": (matmul_jnp, matmul_pallas, lambda: [uni((512, 512), jnp.bfloat16), uni((512, 512), jnp.bfloat16)]),
    "matmul_bf16_1024": (matmul_jnp, matmul_pallas, lambda: [uni((1024, 1024), jnp.bfloat16), uni((1024, 1024), jnp.bfloat16)]),
    "softmax_f32_1024": (softmax_jnp, softmax_pallas, lambda: [uni((1024, 1024), jnp.float32)]),
    "rmsnorm_bf16_1024": (rmsnorm_jnp, rmsnorm_pallas, lambda: [uni((1024, 1024), jnp.bfloat16), uni((1, 1024), jnp.float32)]),
    "add_f32_1024": (add_jnp, add_pallas, lambda: [uni((1024, 1024), jnp.float32), uni((1024, 1024), jnp.float32)]),
}


def times_ms(f, args, budget_s):
    jax.block_until_ready(f(*args))  # compile + warm up
    jax.block_until_ready(f(*args))
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def serve(budget):
    jitted, inputs = {}, {}
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 2 or parts[1] not in CASES:
            print("error", flush=True)
            continue
        engine, name = parts
        ref, kernel, make = CASES[name]
        if name not in inputs:
            inputs[name] = make()
        key = (engine, name)
        if key not in jitted:
            jitted[key] = jax.jit(ref if engine == "xla" else kernel)
        med, mn = times_ms(jitted[key], inputs[name], budget)
        print(f"{med:.6f} {mn:.6f}", flush=True)


def main():
    budget = 0.3 if QUICK else 1.0
    if "--serve" in sys.argv:
        serve(budget)
        return
    for name, (ref, kernel, make) in CASES.items():
        args = make()
        xla, xla_min = times_ms(jax.jit(ref), args, budget)
        pallas, _ = times_ms(jax.jit(kernel), args, budget)
        print(f"{name} {xla:.6f} {pallas:.6f} {xla_min:.6f}", flush=True)


if __name__ == "__main__":
    main()

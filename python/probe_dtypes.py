"""What libtpu compiles, per dtype × op × TPU generation: tiny Pallas kernels (jax's own Pallas, not
ours) compiled for each generation's topology with no TPU present.

    python python/probe_dtypes.py [--gens v5e,v6e,tpu7x,v4,v5p] [--dtypes f16,...] [--ops ...] [--json OUT]

`--ops` also takes the casts to and from the integer types and the mixed dots (`INT_OPS`), and
tiling cases `tile:R:C:BR:BC` (rank 2) / `tile:N:B` (rank 1): a copy of an (R, C) / (N,) array in
blocks of (BR, BC) / (B,) — how int4's tiling rules were found.

Each case is compiled in a worker process, because libtpu aborts the process on some programs
instead of raising: the parent starts a worker per generation, feeds it one case per line, and counts
a worker that dies on a case as `abort` (then starts another for the rest). The verdicts are `ok`,
`refused: <first line of libtpu's error>` or `abort`. The table this prints is the one in the README's
dtype section and in `kernel_runtime::dtype`'s `matmul`/`vpu` facts; `tests/test_dtypes.py` holds
our checks to it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# The dtypes the probe knows (ours by name → jnp name), and the ops.
DTYPES = {"f32": "float32", "bf16": "bfloat16", "i8": "int8", "f16": "float16",
          "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "int4": "int4"}
OPS = ["copy", "to_f32", "from_f32", "to_bf16", "from_bf16", "add", "dot"]
# Casts to and from the integer types and mixed-dtype dots (int4 weights): `--ops` picks them.
INT_OPS = ["to_i32", "from_i32", "to_i8", "from_i8", "dot_bf16_lhs", "dot_i8_lhs"]
GENS = ["v5e", "v6e", "tpu7x", "v4", "v5p"]
SHAPE = (128, 256)


def _case(dtype: str, op: str):
    """(fn, args) of one case: a Pallas kernel over one whole-array block."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    d = jnp.dtype(DTYPES[dtype])
    acc = jnp.int32 if jnp.issubdtype(d, jnp.integer) else jnp.float32
    f32, bf16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)
    i32, i8 = jnp.dtype(jnp.int32), jnp.dtype(jnp.int8)
    if op.startswith("dot_"):
        # A mixed dot: lhs of another dtype (bf16 activations, i8 activations) times `d` weights.
        lhs = {"dot_bf16_lhs": bf16, "dot_i8_lhs": i8}[op]
        acc = jnp.int32 if jnp.issubdtype(lhs, jnp.integer) else jnp.float32

        def kernel(x, y, o):
            o[...] = jnp.dot(x[...], y[...], preferred_element_type=acc)
        fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), acc))
        return fn, [jax.ShapeDtypeStruct((128, 256), lhs), jax.ShapeDtypeStruct((256, 128), d)]
    src, dst = {"copy": (d, d), "to_f32": (d, f32), "from_f32": (f32, d), "to_bf16": (d, bf16),
                "from_bf16": (bf16, d), "add": (d, d), "dot": (d, acc), "to_i32": (d, i32),
                "from_i32": (i32, d), "to_i8": (d, i8), "from_i8": (i8, d)}[op]
    if op == "dot":
        def kernel(x, y, o):
            o[...] = jnp.dot(x[...], y[...], preferred_element_type=acc)
        shapes = [(128, 256), (256, 128)]
        out = (128, 128)
    elif op == "add":
        def kernel(x, y, o):
            o[...] = x[...] + y[...]
        shapes, out = [SHAPE, SHAPE], SHAPE
    else:
        def kernel(x, o):
            o[...] = x[...].astype(o.dtype)
        shapes, out = [SHAPE], SHAPE
    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(out, dst))
    return fn, [jax.ShapeDtypeStruct(s, src) for s in shapes]


def _tile_case(dtype: str, spec: str):
    """`tile:R:C:BR:BC` (rank 2) or `tile:N:B` (rank 1): a copy of an array of `dtype` in blocks."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    d = jnp.dtype(DTYPES[dtype])
    dims = [int(v) for v in spec.split(":")[1:]]
    shape, block = dims[: len(dims) // 2], dims[len(dims) // 2:]
    grid = tuple(-(-a // b) for a, b in zip(shape, block))

    def kernel(x, o):
        o[...] = x[...]
    spec_ = pl.BlockSpec(tuple(block), (lambda i, j: (i, j)) if len(block) == 2 else (lambda i: (i,)))
    fn = pl.pallas_call(kernel, grid=grid, in_specs=[spec_], out_specs=spec_,
                        out_shape=jax.ShapeDtypeStruct(tuple(shape), d))
    return fn, [jax.ShapeDtypeStruct(tuple(shape), d)]


def worker(gen: str) -> None:
    """Compile the cases read from stdin (`dtype op` per line) for `gen`; one verdict line each."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tpu_toolchain as tc
    for line in sys.stdin:
        dtype, op = line.split()
        try:
            fn, args = _tile_case(dtype, op) if op.startswith("tile:") else _case(dtype, op)
            r = tc.compile_jax(fn, args, gen)
            verdict = "ok" if r.ok else "refused: " + tc.first_line(r.error)
        except Exception as e:  # Pallas itself refuses to lower
            verdict = "refused: " + f"{type(e).__name__}: {e}".splitlines()[0]
        print(verdict.replace("\n", " ")[:300], flush=True)


def probe(gens, dtypes, ops=OPS) -> dict:
    """{gen: {dtype: {op: verdict}}}."""
    table: dict = {}
    for gen in gens:
        cases = [(d, o) for d in dtypes for o in ops]
        table[gen] = {d: {} for d in dtypes}
        i = 0
        while i < len(cases):
            p = subprocess.Popen([sys.executable, __file__, "--worker", gen], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            while i < len(cases):
                d, o = cases[i]
                try:
                    p.stdin.write(f"{d} {o}\n")
                    p.stdin.flush()
                    line = p.stdout.readline()
                except BrokenPipeError:
                    line = ""
                if not line:  # the worker died on this case
                    table[gen][d][o] = "abort"
                    i += 1
                    break
                table[gen][d][o] = line.strip()
                i += 1
            p.stdin.close()
            p.wait()
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--gens", default=",".join(GENS))
    ap.add_argument("--dtypes", default="f16,float8_e4m3fn,float8_e5m2,int4")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    gens, dtypes, ops = a.gens.split(","), a.dtypes.split(","), a.ops.split(",")
    table = probe(gens, dtypes, ops)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)
    print("| dtype | op | " + " | ".join(gens) + " |")
    print("|---|---|" + "---|" * len(gens))
    for d in dtypes:
        for o in ops:
            cells = [("ok" if table[g][d][o] == "ok" else "abort" if table[g][d][o] == "abort" else "refused")
                     for g in gens]
            print(f"| {d} | {o} | " + " | ".join(cells) + " |")
    for g in gens:
        for d in dtypes:
            for o in ops:
                if table[g][d][o] != "ok":
                    print(f"{g} {d} {o}: {table[g][d][o]}")


if __name__ == "__main__":
    main()

"""Compile launches written in Pallas with libtpu for v5e, one per line of stdin (JSON as
`tests/fuzz_launches.rs` dumps a rejected launch), answering one line each on stdout: `ok`, `refused
<first line of the error>` or `inexpressible`. A separate process because libtpu aborts the process on
some launches (a constant out-of-range block index: "Check failed: llo::CouldLtS32") rather than
returning an error: the caller counts a dead worker as libtpu refusing that launch, and starts another.
"""
import json
import sys

import tpu_toolchain as tc
import jax
import jax.numpy as jnp
from jax._src import mesh as mesh_lib
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def pallas_launch(d):
    """The launch `d` written in Pallas: `(fn, args)`, or None when Pallas cannot express it."""
    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[d["dtype"]]
    shape, block, squeezed = tuple(d["shape"]), d["block"], set(d["squeeze"])
    if any(s >= len(block) or block[s] != 1 for s in squeezed):
        return None  # Pallas's squeezed dimension is a size-1 block dimension by construction
    block_shape = tuple(pl.Squeezed() if i in squeezed else b for i, b in enumerate(block))

    def index_map(terms):
        return lambda *g: tuple(c * g[axis] + o for axis, c, o in terms)

    def kernel(x, o, *scratch):
        o[...] = x[...]

    kw = {}
    if d["scratch"] is not None:
        kw["scratch_shapes"] = [pltpu.VMEM(tuple(d["scratch"]), jnp.float32)]
    if d["vmem_limit"] is not None:
        kw["compiler_params"] = pltpu.CompilerParams(vmem_limit_bytes=d["vmem_limit"])
    fn = pl.pallas_call(kernel, grid=tuple(d["grid"]),
                        in_specs=[pl.BlockSpec(block_shape, index_map(d["in_terms"]))],
                        out_specs=pl.BlockSpec(block_shape, index_map(d["out_terms"])),
                        out_shape=jax.ShapeDtypeStruct(shape, dtype), **kw)
    return fn, [jax.ShapeDtypeStruct(shape, dtype)]


def main():
    # Pallas's rank-1 tiling rules need the target chip; there is none here, so name it.
    v5e = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=mesh_lib.AbstractDevice(
        device_kind="TPU v5 lite", num_cores=1, platform="tpu"))
    for line in sys.stdin:
        built = pallas_launch(json.loads(line))
        if built is None:
            answer = "inexpressible"
        else:
            with jax.sharding.use_abstract_mesh(v5e):
                r = tc.compile_jax(*built, "v5e")
            answer = "ok" if r.ok else "refused " + tc.first_line(r.error)
        print(answer.replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()

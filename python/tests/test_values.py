"""The values of issue 21 item 5 through the real toolchain, one kernel per construct (the kernels of
`tests/values.rs`, exported by its ignored test `export_construct_kernels` for each generation): libtpu
compiles each for v5e, v6e and tpu7x, and its LLO ops and scheduled bundles are <= those of a Pallas twin
written here with the same shapes, grid and blocks. Numbers: each twin run in Pallas's interpret mode
equals our interpreter's bits (`jnp.roll`'s sign and modulus, jnp's first-index rule of argmax)."""
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpu_toolchain as tc
from conftest import GENERATIONS, REPO, compiled

S = jax.ShapeDtypeStruct
f32 = jnp.float32


def _row_blocks(kernel, steps, block, name):
    rows, cols = block

    def f(x):
        spec = pl.BlockSpec(block, lambda i: (i, 0))
        return pl.pallas_call(kernel, out_shape=S((steps * rows, cols), f32), grid=(steps,), in_specs=[spec],
                              out_specs=spec, name=name)(x)
    return f, [S((steps * rows, cols), f32)]


def _select(x_ref, o_ref):
    a, i = x_ref[...], pl.program_id(0)
    b = jnp.where(i == 1, a * 2.0, a + 1.0)
    o_ref[...] = jnp.where(i >= 2, -1.0, b)


def _full(x_ref, o_ref):
    a, i = x_ref[...], pl.program_id(0)
    s = i.astype(f32) * 0.75
    steps = jnp.full((8, 128), i * 3).astype(f32)
    o_ref[...] = a + steps + jnp.full((8, 128), s) + jnp.full_like(a, s * 0.5) + jnp.full((8, 128), 0.25, f32)


def _concatenate(x_ref, o_ref):
    a = x_ref[...]
    lanes = jnp.concatenate([a[:, 128:], a[:, :128]], axis=1)
    rows = jnp.concatenate([a[8:], a[:8]], axis=0)
    o_ref[...] = lanes * 2.0 + rows


def _roll(x_ref, o_ref):
    a, i = x_ref[...], pl.program_id(0)
    o_ref[...] = pltpu.roll(a, 3, 1) + pltpu.roll(a, i + 1, 0) * 2.0 + pltpu.roll(a, i - 5, 1) * 4.0


def _argmax(x_ref, o_ref):
    a = x_ref[...]
    rows = jnp.broadcast_to(jnp.argmax(a, axis=1)[:, None], (8, 256))
    cols = jnp.broadcast_to(jnp.argmin(a, axis=0)[None, :], (8, 256))
    o_ref[...] = (rows * 1000 + cols).astype(f32)


# name -> (Pallas twin, grid steps, block); the names, kernels and launches of tests/values.rs
TWINS = {
    "select_scalar": (_select, 4, (8, 128)),
    "full_scalar": (_full, 3, (8, 128)),
    "concatenate": (_concatenate, 2, (16, 256)),
    "roll": (_roll, 3, (8, 256)),
    "argmax": (_argmax, 2, (8, 256)),
}

_exported = {}


def ours(name, generation, tmp_path_factory):
    if generation not in _exported:
        out = tmp_path_factory.mktemp(f"values_{generation}")
        env = dict(os.environ, TPU_KERNEL_VALUES_OUT=str(out), TPU_KERNEL_VALUES_TARGET=generation)
        p = subprocess.run(["cargo", "test", "--quiet", "--test", "values", "--", "--ignored", "--exact",
                            "export_construct_kernels"], cwd=REPO, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        _exported[generation] = out
    return (_exported[generation] / f"{name}.stablehlo.mlir").read_text()


def twin(name):
    kernel, steps, block = TWINS[name]
    return _row_blocks(kernel, steps, block, f"{name}_twin")


@pytest.mark.parametrize("name", sorted(TWINS))
def test_compiles_with_pallas_parity(name, generation, tmp_path_factory):
    hlo = ours(name, generation, tmp_path_factory)
    fn, args = twin(name)
    mine = compiled("ours", f"values:{name}", generation, lambda: tc.compile_stablehlo(hlo, generation))
    theirs = compiled("pallas", f"values:{name}", generation, lambda: tc.compile_jax(fn, args, generation))
    assert mine.ok, f"libtpu rejected {name} for {generation}:\n{mine.error}"
    assert theirs.ok, theirs.error
    [call] = tc.tpu_custom_calls(hlo)
    [pcall] = tc.tpu_custom_calls(tc.lower_jax_for_tpu(fn, args))
    assert (call["operand_types"], call["result_types"]) == (pcall["operand_types"], pcall["result_types"])
    print(f"{name} {generation}: LLO ours {mine.llo_total} / Pallas {theirs.llo_total}; "
          f"bundles ours {mine.bundles} / Pallas {theirs.bundles}")
    assert mine.llo_total <= theirs.llo_total, (mine.llo_counts, theirs.llo_counts)
    assert mine.bundles is not None and theirs.bundles is not None
    assert mine.bundles <= theirs.bundles


@pytest.mark.parametrize("name", sorted(TWINS))
def test_twin_in_interpret_mode_gives_our_bits(name):
    """The twin under Pallas's `interpret=True` (jax's own rules for `where`, `full`, `concatenate`,
    `pltpu.roll` and `argmax`) gives, bit for bit, the plain formulas `tests/values.rs` holds both of our
    engines to on the same input (`REFERENCES`, numpy): so our roll has `pltpu.roll`'s sign and modulus
    and our argmax jnp's first-index rule."""
    kernel, steps, block = TWINS[name]
    rows, cols = block
    n = steps * rows * cols
    x = ((np.arange(n) * 37 % 101).astype(np.float32) - 50.0) * 0.25
    x = x.reshape(steps * rows, cols)
    spec = pl.BlockSpec(block, lambda i: (i, 0))
    got = pl.pallas_call(kernel, out_shape=S(x.shape, f32), grid=(steps,), in_specs=[spec], out_specs=spec,
                         interpret=True)(jnp.asarray(x))
    want = REFERENCES[name](x, steps, rows, cols)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.astype(np.float32).view(np.uint32))


def _blocks(x, rows):
    return x.reshape(-1, rows, x.shape[1])


def _ref_select(x, steps, rows, cols):
    i = np.arange(steps)[:, None, None]
    b = _blocks(x, rows)
    return np.where(i >= 2, np.float32(-1.0), np.where(i == 1, b * np.float32(2.0), b + np.float32(1.0))).reshape(x.shape)


def _ref_full(x, steps, rows, cols):
    i = np.arange(steps)[:, None, None]
    s = i.astype(np.float32) * np.float32(0.75)
    b = _blocks(x, rows)
    return ((((b + (i * 3).astype(np.float32)) + s) + s * np.float32(0.5)) + np.float32(0.25)).reshape(x.shape)


def _ref_concatenate(x, steps, rows, cols):
    b = _blocks(x, rows)
    return (np.roll(b, cols // 2, axis=2) * np.float32(2.0) + np.roll(b, rows // 2, axis=1)).reshape(x.shape)


def _ref_roll(x, steps, rows, cols):
    b = _blocks(x, rows)
    out = []
    for i in range(steps):
        a = b[i]
        out.append(np.roll(a, 3, axis=1) + np.roll(a, i + 1, axis=0) * np.float32(2.0)
                   + np.roll(a, i - 5, axis=1) * np.float32(4.0))
    return np.stack(out).reshape(x.shape)


def _ref_argmax(x, steps, rows, cols):
    b = _blocks(x, rows)
    r = np.argmax(b, axis=2)[:, :, None]
    c = np.argmin(b, axis=1)[:, None, :]
    return (r * 1000 + c).astype(np.float32).reshape(x.shape)


REFERENCES = {"select_scalar": _ref_select, "full_scalar": _ref_full, "concatenate": _ref_concatenate,
              "roll": _ref_roll, "argmax": _ref_argmax}

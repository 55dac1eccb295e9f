"""A launch without a grid is Pallas's grid-free `pallas_call`: whole-array blocks, and a Mosaic
kernel with no `iteration_bounds` and no `window_params` (libtpu refuses window attributes without
explicit iteration bounds, which our checks used to accept). Compiled for every generation we check;
the numbers through the FFI path; a block that is a window is refused with a hint that libtpu accepts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tpu_toolchain as tc

GENERATIONS = ["v5e", "v6e", "tpu7x"]


@pytest.mark.parametrize("g", GENERATIONS)
def test_a_grid_free_launch_compiles_with_libtpu(user_crate, g):
    s = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    r = tc.compile_jax(lambda a, b: user_crate.whole_add(a, b, target=g), [s, s], g)
    assert r.ok, r.error[:2000]


def test_a_grid_free_launch_computes_and_its_mosaic_has_no_windows(user_crate):
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    np.testing.assert_array_equal(np.asarray(jax.jit(user_crate.whole_add)(x, x)), 2 * x)
    s = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    text = tc.lower_jax_for_tpu(user_crate.whole_add, [s, s])
    body = tc.deserialize_body(tc.b64_body(tc.tpu_custom_calls(text)[0]["config"]))
    kernel = next(line for line in body.splitlines() if "func.func @" in line and "dimension_semantics" in line)
    assert "iteration_bounds" not in kernel and "window_params" not in kernel, kernel

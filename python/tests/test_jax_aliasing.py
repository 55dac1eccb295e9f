"""`input_output_aliases` through the JAX front door: the kernel's aliases reach XLA on CPU (FFI) and
on TPU (tpu_custom_call), a donated input is updated in place with the right numbers, and libtpu
compiles the aliased call."""
import jax
import jax.numpy as jnp
import numpy as np

import tpu_kernel.examples as ex
import tpu_toolchain as tc


def _x():
    return jnp.arange(256 * 256, dtype=jnp.float32).reshape(256, 256) * 0.5 - 100.0


def test_the_tpu_call_declares_the_alias_and_libtpu_compiles_it():
    hlo = tc.lower_jax_for_tpu(ex.inplace_scale, [jax.ShapeDtypeStruct((256, 256), jnp.float32)])
    assert "output_operand_aliases" in hlo and "operand_index = 0" in hlo, hlo
    for gen in ("v5e", "v6e"):
        r = tc.compile_stablehlo(hlo, gen)
        assert r.ok, r.error


def test_the_cpu_call_declares_the_alias():
    text = jax.jit(ex.inplace_scale).lower(_x()).as_text()
    assert "output_operand_aliases" in text, text


def test_a_donated_input_is_scaled_in_place():
    x = _x()
    want = np.asarray(x) * 3.0
    out = jax.jit(ex.inplace_scale, donate_argnums=0)(x)
    np.testing.assert_array_equal(np.asarray(out), want)
    assert x.is_deleted()  # XLA took the donated buffer for the output
    # And without donation the input is left alone.
    y = _x()
    out = jax.jit(ex.inplace_scale)(y)
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(_x()))

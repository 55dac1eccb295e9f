"""The TPU lowering of the primitive: `jax.jit(f).lower(lowering_platforms=("tpu",))` holds the
`tpu_custom_call` Rust's "lower" answer describes (backend_config, kernel_name), and libtpu compiles
the program for v5e — plain, inside a jnp program, and vmapped (a batch grid axis)."""
import json

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
import tpu_kernel.examples as ex
import tpu_toolchain as tc
from conftest import example_names

f32, bf16 = jnp.float32, jnp.bfloat16


def only_custom_call(text):
    calls = tc.tpu_custom_calls(text)
    assert len(calls) == 1, f"expected one tpu_custom_call, found {len(calls)}"
    return calls[0]


@pytest.mark.parametrize("name", example_names(include_spmd=False))
def test_tpu_lowering_is_our_custom_call_and_compiles_for_v5e(name):
    args = pk.KERNELS[name][1]
    kernel = ex.library.kernels[ex.WRAPPERS.get(name, name)]
    expected = kernel.lower(*args)
    text = tc.lower_jax_for_tpu(kernel, args)
    call = only_custom_call(text)
    assert call["config"] == json.loads(expected["backend_config"])
    assert call["attrs"]["kernel_name"] == json.dumps(expected["kernel_name"])
    # the custom call is the one jax emits for the Pallas version of the kernel: same attributes
    # (api_version 1 and no side effect are the defaults, so neither is printed), same result types
    pallas_fn = pk.KERNELS[name][0]
    pallas = only_custom_call(tc.lower_jax_for_tpu(pallas_fn, args, "v5e"))
    pallas["attrs"].pop("mhlo.frontend_attributes", None)  # Pallas's (empty) kernel_metadata
    assert call["attrs"] == pallas["attrs"]
    assert call["result_types"] == pallas["result_types"] and call["operand_types"] == pallas["operand_types"]
    assert "tpu_kernel_examples" not in text  # the CPU FFI call is not in a TPU program
    res = tc.compile_jax(kernel, args, "v5e")
    assert res.ok, res.error
    assert res.n_custom_calls == 1


def test_tpu_lowering_inside_a_jnp_program_with_cost_estimate():
    x, y = jax.ShapeDtypeStruct((256, 512), bf16), jax.ShapeDtypeStruct((512, 256), bf16)

    def f(x, y):
        return jnp.tanh(ex.matmul(x * 2, y).astype(f32)).sum(axis=0)

    call = only_custom_call(tc.lower_jax_for_tpu(f, [x, y]))
    lower = ex.matmul.lower(x, y)
    assert call["config"] == json.loads(lower["backend_config"])
    # Rust's cost estimate reaches XLA's scheduler inside the custom call config
    cost = lower["cost_estimate"]
    assert cost["flops"] == 2 * 256 * 512 * 256 and cost["bytes_accessed"] == 2 * (256 * 512 * 2 + 256 * 256)
    in_config = call["config"]["custom_call_config"]["cost_estimate"]
    assert {k: in_config[k] for k in cost} == cost
    res = tc.compile_jax(f, [x, y], "v5e")
    assert res.ok, res.error


def test_vmapped_kernel_lowers_with_a_batch_grid_axis_and_compiles():
    xb, y = jax.ShapeDtypeStruct((3, 256, 256), bf16), jax.ShapeDtypeStruct((256, 256), bf16)
    f = jax.vmap(ex.matmul, in_axes=(0, None))
    call = only_custom_call(tc.lower_jax_for_tpu(f, [xb, y]))
    assert call["result_types"] == ["tensor<3x256x256xbf16>"]
    plain = ex.matmul.lower(jax.ShapeDtypeStruct((256, 256), bf16), y)
    assert call["config"] != json.loads(plain["backend_config"])  # another kernel: one more grid axis
    res = tc.compile_jax(f, [xb, y], "v5e")
    assert res.ok, res.error

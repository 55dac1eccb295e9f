"""tpu-inference's all-gather matmul as a drop-in (issue 26, item 3): `tpu_kernel.examples.all_gather_matmul`
has tpu-inference 0.32.0's signature and defaults, equals `all_gather(x) @ y` on CPU meshes (through the
multi-device interpreter, in jax and in torch), and — tpu-inference's own kernel beside it in the same
sharded program — compiles for v5e:2x2, v6e:2x2 and tpu7x:2x2x1 with no more LLO ops and no more
scheduled bundles.

tpu-inference's own fallback when its tuned table has no entry is `bn = n` (the global n), whose `[.., bn]`
windows run past the per-device arrays; the parity compiles therefore name `bn` for both kernels, and ours
falls back to `n / tp` (tests/remote.rs refuses tpu-inference's fallback with an error naming `bn`)."""
import importlib
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tpu_inference_rpa
import tpu_kernel.examples as ex
import tpu_toolchain as tc
from conftest import GENERATIONS, compiled

SHARDED = {"v5e": "v5e:2x2", "v6e": "v6e:2x2", "tpu7x": "tpu7x:2x2x1"}
GENERATION_NUMBER = {"v5e": 5, "v6e": 6, "tpu7x": 7}


def theirs():
    """tpu-inference's `all_gather_matmul` module (imported with jax alone)."""
    tpu_inference_rpa._register_bare_package()
    return importlib.import_module("tpu_inference.kernels.collectives.all_gather_matmul")


def test_the_signature_is_tpu_inferences():
    mine = inspect.signature(ex.all_gather_matmul).parameters
    ref = inspect.signature(theirs().all_gather_matmul).parameters
    assert list(mine) == list(ref)
    assert [p.default for p in mine.values()] == [p.default for p in ref.values()]


def _mesh(n, names=("x",), shape=None):
    devices = jax.devices("cpu")
    assert len(devices) == 8, "conftest sets --xla_force_host_platform_device_count=8"
    return Mesh(np.array(devices[:n]).reshape(shape or (n,)), names)


CASES = {  # name: (mesh devices, mesh axes, mesh shape, axis, m, k, n, bn, bk, rhs_transpose)
    "tp4 default blocks": (4, ("x",), None, "x", 128, 256, 512, None, None, False),
    "tp4 bn 64 bk 128": (4, ("x",), None, "x", 128, 256, 512, 64, 128, False),
    "tp4 rhs_transpose": (4, ("x",), None, "x", 128, 256, 512, None, 128, True),
    "tp2": (2, ("x",), None, "x", 64, 128, 256, None, None, False),
    "tp8": (8, ("x",), None, "x", 128, 128, 1024, None, None, False),
    "2x4 mesh over y": (8, ("x", "y"), (2, 4), "y", 128, 256, 512, 64, None, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_numbers_on_a_cpu_mesh(name):
    n_dev, names, shape, axis, m, k, n, bn, bk, t = CASES[name]
    mesh = _mesh(n_dev, names, shape)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.uniform(-1, 1, (m, k)), jnp.bfloat16)
    y = jnp.asarray(rng.uniform(-1, 1, (n, k) if t else (k, n)), jnp.bfloat16)
    out = ex.all_gather_matmul(x, y, mesh, axis, bn=bn, bk=bk, rhs_transpose=t)
    assert out.shape == (m, n) and out.dtype == jnp.bfloat16
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P(None, axis)), 2)
    # tpu-inference's own check (tests/kernels/collectives/all_gather_matmul_test.py): jnp.dot of the
    # same bf16 arrays, atol = rtol = 1e-2
    want = jnp.dot(x, y.T if t else y)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-2)


def test_torch_tensors_in_torch_tensor_out():
    import torch
    import tpu_kernel.torch.examples as tex
    mesh = _mesh(4)
    g = torch.Generator().manual_seed(4)
    x = (torch.rand(128, 256, generator=g) * 2 - 1).to(torch.bfloat16)
    y = (torch.rand(256, 512, generator=g) * 2 - 1).to(torch.bfloat16)
    out = tex.all_gather_matmul(x, y, mesh, "x")
    assert isinstance(out, torch.Tensor) and out.shape == (128, 512) and out.dtype == torch.bfloat16
    jx = ex.all_gather_matmul(jnp.asarray(x.float().numpy(), jnp.bfloat16),
                              jnp.asarray(y.float().numpy(), jnp.bfloat16), mesh, "x")
    assert np.array_equal(out.float().numpy(), np.asarray(jx, np.float32))


def _program(fn, topo, m, k, n):
    _, desc = tc.topology(topo)
    mesh = Mesh(np.array(desc.devices), ("x",))
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=NamedSharding(mesh, P("x", None))),
            jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "x"))))
    return mesh, args


def _compile(fn, topo, m, k, n, generation):
    mod = theirs()
    mesh, args = _program(fn, topo, m, k, n)
    old = mod.all_gather_matmul_tuned_block_sizes.get_tpu_version
    mod.all_gather_matmul_tuned_block_sizes.get_tpu_version = lambda: GENERATION_NUMBER[generation]
    try:
        return tc._compile_in(topo, mesh, jax.jit(lambda a, b: fn(a, b, mesh)), args)
    finally:
        mod.all_gather_matmul_tuned_block_sizes.get_tpu_version = old


# (m, k, n, bn, bk): tp 4 on the 2x2s, 8 on tpu7x:2x2x1 (a TensorCore per device); a small config, then
# larger ones with one n and one k block (bn None: n / tp, named for both kernels — tpu-inference's own
# fallback, n, runs past the arrays) and with several (the f32 accumulator)
PARITY = [(256, 512, 1024, 128, None), (1024, 2048, 4096, None, 2048), (1024, 2048, 4096, 512, 512)]


@pytest.mark.parametrize("config", PARITY, ids=["small", "1024x2048x4096", "1024x2048x4096 bk 512"])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_compiles_sharded_and_not_above_tpu_inferences_kernel(generation, config):
    topo = SHARDED[generation]
    m, k, n, bn, bk = config
    bn = bn or n // len(tc.topology(topo)[1].devices)
    mod = theirs()
    key = "all_gather_matmul" if config == PARITY[0] else f"all_gather_matmul {m}x{k}x{n}/{bn}/{bk}"
    mine = compiled("ours", key, topo, lambda: _compile(
        lambda a, b, mesh: ex.all_gather_matmul(a, b, mesh, "x", bn=bn, bk=bk), topo, m, k, n, generation))
    ref = compiled("pallas", key, topo, lambda: _compile(
        lambda a, b, mesh: mod.all_gather_matmul(a, b, mesh.abstract_mesh, "x", bn=bn, bk=bk), topo, m, k, n,
        generation))
    assert mine.ok, mine.error
    assert ref.ok, ref.error
    assert mine.n_custom_calls == ref.n_custom_calls == 1
    assert mine.bundles is not None and ref.bundles is not None, (mine.bundles_by_program, ref.bundles_by_program)
    print(f"all_gather_matmul {topo}: ours {mine.llo_total} LLO ops / {mine.bundles} bundles, "
          f"tpu-inference {ref.llo_total} / {ref.bundles}")
    assert mine.llo_total <= ref.llo_total, (mine.llo_counts, ref.llo_counts)
    assert mine.bundles <= ref.bundles


def test_the_custom_call_is_tpu_inferences_in_name_config_and_types():
    topo = SHARDED["v6e"]
    m, k, n, bn, _ = PARITY[0]
    mod = theirs()
    mesh, args = _program(None, topo, m, k, n)
    calls = []
    for fn in (lambda a, b: ex.all_gather_matmul(a, b, mesh, "x", bn=bn),
               lambda a, b: mod.all_gather_matmul(a, b, mesh.abstract_mesh, "x", bn=bn)):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            [call] = tc.tpu_custom_calls(jax.jit(fn).trace(*args).lower().as_text())
        calls.append(call)
    mine, ref = calls
    assert mine["attrs"]["kernel_name"] == ref["attrs"]["kernel_name"]
    assert (mine["operand_types"], mine["result_types"]) == (ref["operand_types"], ref["result_types"])
    keys = ("has_communication", "collective_id", "cost_estimate")
    assert {k: mine["config"]["custom_call_config"][k] for k in keys} == \
        {k: ref["config"]["custom_call_config"][k] for k in keys}
    tc.verify_mosaic(tc.deserialize_body(tc.b64_body(mine["config"])))


def test_the_kernel_program_holds_no_collective_where_gspmd_puts_two():
    """docs/stack-map.md, Part B case 6: `x @ w` with x `P('y', None)`, w and the output `P(None, 'y')`
    on v5e:2x2 compiles, by GSPMD, to a collective-permute and an all-gather of x
    (test_sharding_collectives.py holds that); the same product through our kernel is one
    tpu_custom_call and no collective at all — the kernel moves x itself."""
    _, desc = tc.topology("v5e:2x2")
    mesh = Mesh(np.array(desc.devices).reshape(2, 2), ("x", "y"))
    args = (jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("y", None))),
            jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "y"))))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        hlo = jax.jit(lambda a, b: ex.all_gather_matmul(a, b, mesh, "y")).trace(*args).lower().compile().as_text()
    assert hlo.count('custom_call_target="tpu_custom_call"') == 1
    assert tc.hlo_collectives(hlo) == []


def test_at_tpu_inferences_tuned_config_on_8_v6e_chips():
    """tpu-inference's tuned table entry (6, m 2048, n 51200, k 5120, bf16, tp 8) -> (bn 1280, bk 5120),
    taken by both kernels from their tables (no bn/bk named) on v6e:2x4: the same kernel name, and ours
    at or under tpu-inference's LLO ops and bundles."""
    topo, (m, k, n) = "v6e:2x4", (2048, 5120, 51200)
    mod = theirs()
    mesh, args = _program(None, topo, m, k, n)
    names = []
    for fn in (lambda a, b: ex.all_gather_matmul(a, b, mesh, "x"),
               lambda a, b: mod.all_gather_matmul(a, b, mesh.abstract_mesh, "x")):
        old = mod.all_gather_matmul_tuned_block_sizes.get_tpu_version
        mod.all_gather_matmul_tuned_block_sizes.get_tpu_version = lambda: 6
        try:
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                [call] = tc.tpu_custom_calls(jax.jit(fn).trace(*args).lower().as_text())
        finally:
            mod.all_gather_matmul_tuned_block_sizes.get_tpu_version = old
        names.append(call["attrs"]["kernel_name"])
    assert names[0] == names[1] == '"all_gather_matmul_kernel_bn_1280_bk_5120_rhs_transpose_False"'
    mine = compiled("ours", "all_gather_matmul tuned", topo, lambda: _compile(
        lambda a, b, mesh: ex.all_gather_matmul(a, b, mesh, "x"), topo, m, k, n, "v6e"))
    ref = compiled("pallas", "all_gather_matmul tuned", topo, lambda: _compile(
        lambda a, b, mesh: mod.all_gather_matmul(a, b, mesh.abstract_mesh, "x"), topo, m, k, n, "v6e"))
    assert mine.ok, mine.error
    assert ref.ok, ref.error
    print(f"all_gather_matmul tuned {topo}: ours {mine.llo_total} LLO ops / {mine.bundles} bundles, "
          f"tpu-inference {ref.llo_total} / {ref.bundles}")
    assert mine.llo_total <= ref.llo_total and mine.bundles <= ref.bundles

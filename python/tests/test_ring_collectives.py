"""Kernels that talk across chips (issue 26): the SPMD examples (conftest.SPMD_EXAMPLES), each run per
device inside `jax.shard_map` over a one-axis mesh of every device of a sharded topology, next to its
Pallas twin (pallas_kernels.SPMD) in the same program:

- the custom call says it communicates (`has_communication`, the collective id) as Pallas's does;
- our Mosaic body holds the ops the twin's does, op for op (constants aside), remote copies, remote
  signals and the barrier semaphore included, and verifies under jaxlib's own tpu dialect;
- libtpu compiles both for v5e:2x2, v6e:2x2 and tpu7x:2x2x1, and ours needs no more LLO ops and no more
  scheduled bundles than the twin.
"""
import collections
import json
import re

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pallas_kernels as pk
import tpu_kernel.examples as ex
import tpu_toolchain as tc
from conftest import GENERATIONS, SPMD_EXAMPLES, compiled

SHARDED = {"v5e": "v5e:2x2", "v6e": "v6e:2x2", "tpu7x": "tpu7x:2x2x1"}
NAMES = sorted(pk.SPMD)


def test_every_spmd_example_has_a_twin_and_a_jax_op():
    # all_gather_matmul's twin is tpu-inference's own kernel (test_all_gather_matmul.py)
    assert set(pk.SPMD) | {"all_gather_matmul"} == set(SPMD_EXAMPLES)
    assert {ex.WRAPPERS.get(n, n) for n in SPMD_EXAMPLES} <= set(ex.library.kernels)


def _program(name, topo):
    """(ours, twin, mesh, global args): the example and its twin per device inside shard_map over
    every device of `topo`."""
    twin, shard_args, axis, in_axes, out_axis = pk.SPMD[name]
    _, desc = tc.topology(topo)
    n = len(desc.devices)
    mesh = Mesh(np.array(desc.devices), (axis,))
    in_specs = [P(a) for a in in_axes]
    global_args = [jax.ShapeDtypeStruct((a.shape[0] * n, *a.shape[1:]), a.dtype) for a in shard_args(n)]
    ours = getattr(ex, name)
    return (lambda *xs: ours(*xs, axis=axis)), (lambda *xs: twin(*xs, axis=axis)), mesh, in_specs, \
        P(out_axis), global_args


def _custom_call(fn, mesh, in_specs, out_spec, args):
    program = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_spec,
                                    check_vma=False))
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)) for a, s in zip(args, in_specs)]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        text = program.trace(*sds).lower().as_text()
    [call] = tc.tpu_custom_calls(text)
    return call


_OP = re.compile(r'"stable_mosaic\.([a-z_]+\.[a-z_0-9.]+)"')


def _ops(call):
    """The body's ops (generic form), constants left out: how many of each."""
    ops = _OP.findall(tc.body_generic(tc.b64_body(call["config"])))
    return collections.Counter(o for o in ops if o != "arith.constant")


@pytest.mark.parametrize("name", NAMES)
def test_the_custom_call_communicates_as_the_twins_does(name):
    ours, twin, mesh, in_specs, out_spec, args = _program(name, SHARDED["v5e"])
    mine = _custom_call(ours, mesh, in_specs, out_spec, args)
    theirs = _custom_call(twin, mesh, in_specs, out_spec, args)
    cc = lambda c: {k: v for k, v in c["config"]["custom_call_config"].items()  # noqa: E731
                    if k not in ("body", "debug_locations")}
    assert cc(mine)["has_communication"] is True and cc(mine)["collective_id"] == 0
    for key in ("has_communication", "collective_id"):
        assert cc(mine)[key] == cc(theirs)[key], key
    assert (mine["operand_types"], mine["result_types"]) == (theirs["operand_types"], theirs["result_types"])
    # jaxlib's own tpu dialect parses and verifies the body (strict: no unregistered op)
    tc.verify_mosaic(tc.deserialize_body(tc.b64_body(mine["config"])))


@pytest.mark.parametrize("name", NAMES)
def test_the_body_holds_the_twins_ops(name):
    ours, twin, mesh, in_specs, out_spec, args = _program(name, SHARDED["v6e"])
    mine = _ops(_custom_call(ours, mesh, in_specs, out_spec, args))
    theirs = _ops(_custom_call(twin, mesh, in_specs, out_spec, args))
    for op in ("tpu.device_id", "tpu.sem_barrier", "tpu.sem_signal", "tpu.enqueue_dma", "tpu.wait_dma"):
        assert mine[op] >= 1, (op, mine)
    # The copies, signals and waits are the twin's, one for one; the arithmetic and views around them
    # no more than the twin's (Pallas recomputes each remote device id at every use, `x * 1 + 0` per
    # axis, and slices a window anew for each descriptor).
    communication = {"tpu.enqueue_dma", "tpu.wait_dma", "tpu.sem_signal", "tpu.sem_wait", "tpu.sem_barrier",
                     "scf.for"}
    assert set(mine) <= set(theirs), (mine, theirs)
    for op in communication:
        assert mine[op] == theirs[op], (op, mine, theirs)
    for op in set(theirs) - communication:
        assert mine[op] <= theirs[op], (op, mine, theirs)


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("name", NAMES)
def test_compiles_sharded_and_not_above_the_twin(name, generation):
    topo = SHARDED[generation]
    ours, twin, mesh, in_specs, out_spec, args = _program(name, topo)
    axes = ((mesh.axis_names[0], mesh.size),)
    mine = compiled("ours", name, topo, lambda: tc.compile_shard_map(ours, topo, axes, in_specs, out_spec, args))
    theirs = compiled("pallas", name, topo,
                      lambda: tc.compile_shard_map(twin, topo, axes, in_specs, out_spec, args))
    assert mine.ok, mine.error
    assert theirs.ok, theirs.error
    assert mine.n_custom_calls == 1 and mine.bundles is not None and theirs.bundles is not None
    print(f"{name} {topo}: ours {mine.llo_total} LLO ops / {mine.bundles} bundles, "
          f"Pallas {theirs.llo_total} / {theirs.bundles}")
    assert mine.llo_total <= theirs.llo_total, (mine.llo_counts, theirs.llo_counts)
    assert mine.bundles <= theirs.bundles, (mine.bundles, theirs.bundles)


def test_called_outside_shard_map_the_op_names_what_it_needs():
    x = jax.ShapeDtypeStruct((8, 128), np.float32)
    with pytest.raises(Exception, match="jax.shard_map"):
        jax.eval_shape(ex.ring_all_gather, x)


def test_an_axis_not_in_the_mesh_is_an_error_naming_the_argument():
    ours, _, mesh, in_specs, out_spec, args = _program("ring_all_gather", SHARDED["v5e"])
    with pytest.raises(Exception, match=r"no mesh axis \"y\"") as e:
        _custom_call(lambda x: ex.ring_all_gather(x, axis="y"), mesh, in_specs, out_spec, args)
    assert json.dumps(getattr(e.value, "argument", None)) == '"axis"'


# -- numbers on a CPU mesh: each device's FFI call runs its device of one launch (`interpret_spmd`)

CPU_MESHES = [((4,), ("x",), [0, 1, 2, 3]), ((2, 2), ("x", "y"), [3, 1, 0, 2]), ((8,), ("x",), list(range(8)))]


@pytest.mark.parametrize("dtype", [np.float32, jax.numpy.bfloat16, np.int32])
@pytest.mark.parametrize("shape,names,order", CPU_MESHES, ids=["4", "2x2 permuted", "8"])
def test_ring_all_gather_on_a_cpu_mesh_equals_lax_all_gather(shape, names, order, dtype):
    devices = jax.devices("cpu")
    assert len(devices) == 8, "conftest sets --xla_force_host_platform_device_count=8"
    mesh = Mesh(np.array([devices[i] for i in order]).reshape(shape), names)
    rows = 8 * int(np.prod(shape))
    x = jax.numpy.asarray(np.random.default_rng(1).uniform(-100, 100, (rows, 128))).astype(dtype)
    spec = P(names)

    def program(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))

    ours = program(lambda s: ex.ring_all_gather(s, axis="x"))(x)
    want = program(lambda s: jax.lax.all_gather(s, "x", tiled=True))(x)
    assert ours.dtype == want.dtype and ours.shape == want.shape
    assert np.array_equal(np.asarray(ours).view(np.uint8), np.asarray(want).view(np.uint8))


def test_two_launches_in_one_program_and_again():
    """Each device's calls pair up in order: two gathers in one jitted program, run twice."""
    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("x",))
    x = jax.numpy.arange(32 * 128, dtype=np.float32).reshape(32, 128)
    f = jax.jit(jax.shard_map(lambda s: ex.ring_all_gather(ex.ring_all_gather(s, axis="x")[:8] + 1, axis="x"),
                              mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
    want = jax.jit(jax.shard_map(lambda s: jax.lax.all_gather(
        jax.lax.all_gather(s, "x", tiled=True)[:8] + 1, "x", tiled=True),
        mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))(x)
    for _ in range(2):
        assert np.array_equal(np.asarray(f(x)), np.asarray(want))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("shape,names,order", CPU_MESHES, ids=["4", "2x2 permuted", "8"])
def test_ring_reduce_scatter_on_a_cpu_mesh_equals_psum_scatter(shape, names, order, dtype):
    """int32 bit for bit; float32 within the rounding of sums taken in another order (ours adds in
    ring order, XLA in its own)."""
    devices = jax.devices("cpu")
    mesh = Mesh(np.array([devices[i] for i in order]).reshape(shape), names)
    n = mesh.shape["x"]
    per_device_rows = 8 * n
    rng = np.random.default_rng(2)
    x = rng.uniform(-100, 100, (per_device_rows * int(np.prod(shape)), 128)).astype(dtype)
    spec = P(names)

    def program(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))

    ours = np.asarray(program(lambda s: ex.ring_reduce_scatter(s, axis="x"))(x))
    want = np.asarray(program(lambda s: jax.lax.psum_scatter(s, "x", scatter_dimension=0, tiled=True))(x))
    assert ours.shape == want.shape and ours.dtype == want.dtype
    if dtype == np.int32:
        assert np.array_equal(ours, want)
    else:
        np.testing.assert_allclose(ours, want, rtol=0, atol=1e-4 * n * 100)


@pytest.mark.parametrize("name,reference", [
    ("ring_all_gather", lambda s: jax.lax.all_gather(s, "x", tiled=True)),
    ("ring_reduce_scatter", lambda s: jax.lax.psum_scatter(s, "x", scatter_dimension=0, tiled=True)),
])
def test_the_torch_ops_inside_shard_map_through_torchax(name, reference):
    """The rings as torch ops: inside a jax.shard_map body, on the shard viewed as a torchax tensor
    (as tpu-inference's torch layers call kernels); int32, so both are exact."""
    import torchax
    from torchax import interop
    import tpu_kernel.torch.examples as tex
    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("x",))
    env = torchax.default_env()

    def body(s):
        with env:
            return interop.jax_view(getattr(tex, name)(interop.torch_view(s), axis="x"))

    x = np.random.default_rng(5).integers(-1000, 1000, (4 * 32, 128)).astype(np.int32)

    def program(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))

    assert np.array_equal(np.asarray(program(body)(x)), np.asarray(program(reference)(x)))

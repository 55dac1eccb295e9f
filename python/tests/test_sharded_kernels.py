"""The sharded matmuls of docs/stack-map.md, written by hand: our matmul kernel per shard inside
`jax.shard_map` with the explicit collectives each sharding needs (`all_gather`, `psum_scatter`,
`psum`). Checked twice: the numbers on a 2×2 mesh of host CPU devices, and libtpu's compile of the
same program for `v5e:2x2`, which must contain our `tpu_custom_call` and exactly the collectives
written here — GSPMD adds nothing inside a shard_map."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tpu_kernel.examples as ex
import tpu_toolchain as tc

bf16, f32 = jnp.bfloat16, jnp.float32
M, K, N = 512, 1024, 512
X_AXIS, Y_AXIS = 0, 1  # mesh axis positions of "x" and "y"


def mm(a, b):
    return ex.matmul(a, b).astype(f32)


# name: (x spec, w spec, out spec, per-shard function, the collectives it writes)
CASES = {
    "rows x cols (no collective)": (
        P("x", None), P(None, "y"), P("x", "y"),
        lambda x, w: mm(x, w), []),
    "contraction sharded, psum": (
        P(None, "y"), P("y", None), P(None, None),
        lambda x, w: jax.lax.psum(mm(x, w), "y"), [("all-reduce", Y_AXIS, None)]),
    "rows and contraction sharded, psum to P('x', None)": (
        P("x", "y"), P("y", None), P("x", None),
        lambda x, w: jax.lax.psum(mm(x, w), "y"), [("all-reduce", Y_AXIS, None)]),
    "contraction sharded, psum_scatter over columns": (
        P(None, "y"), P("y", None), P(None, "y"),
        lambda x, w: jax.lax.psum_scatter(mm(x, w), "y", scatter_dimension=1, tiled=True),
        [("reduce-scatter", Y_AXIS, 1)]),
    "x's contraction sharded where w's is not: all_gather x first": (
        P("x", "y"), P(None, "y"), P("x", "y"),
        lambda x, w: mm(jax.lax.all_gather(x, "y", axis=1, tiled=True), w),
        [("all-gather", Y_AXIS, 1)]),
}


def program(mesh, name):
    xs, ws, outs, fn, _ = CASES[name]
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(xs, ws), out_specs=outs))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.uniform(-1, 1, (M, K)), bf16)
    w = jnp.asarray(rng.uniform(-1, 1, (K, N)), bf16)
    return x, w


@pytest.mark.parametrize("name", list(CASES))
def test_numbers_on_a_2x2_cpu_mesh(name, data):
    devices = jax.devices("cpu")
    assert len(devices) == 8, "conftest sets --xla_force_host_platform_device_count=8"
    mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "y"))
    xs, ws, outs, _, _ = CASES[name]
    x, w = data
    out = program(mesh, name)(jax.device_put(x, NamedSharding(mesh, xs)), jax.device_put(w, NamedSharding(mesh, ws)))
    assert out.shape == (M, N) and out.sharding.is_equivalent_to(NamedSharding(mesh, outs), 2)
    want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    err = np.max(np.abs(np.asarray(out) - want))
    assert err <= 0.01 * np.max(np.abs(want)), f"{name}: max error {err}"  # bf16 rounding of partials only


@pytest.mark.parametrize("name", list(CASES))
def test_v5e_2x2_compile_has_our_kernel_and_exactly_our_collectives(name):
    _, topo = tc.topology("v5e:2x2")
    mesh = Mesh(np.array(topo.devices).reshape(2, 2), ("x", "y"))
    xs, ws, _, _, written = CASES[name]
    args = (jax.ShapeDtypeStruct((M, K), bf16, sharding=NamedSharding(mesh, xs)),
            jax.ShapeDtypeStruct((K, N), bf16, sharding=NamedSharding(mesh, ws)))
    hlo = program(mesh, name).trace(*args).lower().compile().as_text()
    assert 'custom_call_target="tpu_custom_call"' in hlo
    got = sorted((c["kind"], c["groups"], c["dimension"]) for c in tc.hlo_collectives(hlo))
    want = sorted((kind, tc.mesh_axis_groups((2, 2), axis), dim) for kind, axis, dim in written)
    assert got == want, f"{name}: libtpu compiled collectives {got}, the program wrote {want}"


def test_collective_parser_reads_every_replica_group_form():
    hlo = "\n".join([
        "HloModule m, num_partitions=4",
        "  %a = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups={{0,2},{1,3}}, to_apply=%add",
        "  %b = (f32[8]{0}, f32[16]{0}) all-gather-start(%p), replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}",
        "  %c = f32[16]{0} all-gather-done(%b)",
        "  %d = f32[4]{0} reduce-scatter(%p), replica_groups=mesh['x'=2,'y'=2] {'x'}, dimensions={0}",
        "  %e = f32[8]{0} all-to-all(%p), replica_groups=[1,4]<=[4], dimensions={0}",
    ])
    got = [(c["kind"], c["groups"], c["dimension"]) for c in tc.hlo_collectives(hlo)]
    assert got == [("all-reduce", [[0, 2], [1, 3]], None), ("all-gather", [[0, 2], [1, 3]], 0),
                   ("reduce-scatter", [[0, 2], [1, 3]], 0), ("all-to-all", [[0, 1, 2, 3]], 0)]
    assert tc.mesh_axis_groups((2, 2), 0) == [[0, 2], [1, 3]] and tc.mesh_axis_groups((2, 2), 1) == [[0, 1], [2, 3]]

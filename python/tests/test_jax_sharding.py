"""jax.shard_map with our kernel per shard and explicit collectives around it: run on the 8-device
host CPU mesh (conftest sets --xla_force_host_platform_device_count=8), and the same program compiled
by libtpu for a 4-chip v5e:2x2 topology with no TPU present."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tpu_kernel.examples as ex
import tpu_toolchain as tc

f32, bf16 = jnp.float32, jnp.bfloat16


def k_sharded_matmul(mesh):
    """x @ y with the contraction dim split over the mesh axis "k": each device multiplies its
    [m, K/n] x [K/n, n] slabs with our kernel, then the partial products are summed with psum."""
    def per_shard(x, y):
        return jax.lax.psum(ex.matmul(x, y).astype(f32), "k")

    return jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(P(None, "k"), P("k", None)), out_specs=P()))


def test_k_sharded_matmul_on_8_cpu_devices():
    devices = jax.devices("cpu")
    assert len(devices) == 8, f"expected 8 host devices (XLA_FLAGS), got {len(devices)}"
    mesh = Mesh(np.array(devices), ("k",))
    rng = np.random.default_rng(1)
    m, k, n = 128, 8 * 128, 256
    xh = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    yh = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    x = jax.device_put(jnp.asarray(xh, bf16), NamedSharding(mesh, P(None, "k")))
    y = jax.device_put(jnp.asarray(yh, bf16), NamedSharding(mesh, P("k", None)))
    f = k_sharded_matmul(mesh)
    assert "tpu_kernel_examples" in f.lower(x, y).as_text()  # our FFI call inside the SPMD program
    out = f(x, y)
    assert out.shape == (m, n) and out.dtype == f32
    # reference: the same per-shard bf16 products, summed in f32
    xs, ys = np.asarray(x.astype(f32)), np.asarray(y.astype(f32))
    parts = [jnp.asarray(xs[:, s * 128:(s + 1) * 128] @ ys[s * 128:(s + 1) * 128], f32).astype(bf16).astype(f32)
             for s in range(8)]
    np.testing.assert_allclose(np.asarray(out), np.asarray(sum(parts)), rtol=2e-2, atol=0.05)
    # and close to the unsharded f32 product (bf16 rounding of the 8 partial sums only)
    full = xs @ ys
    assert np.max(np.abs(np.asarray(out) - full)) < 0.02 * np.max(np.abs(full)) + 0.1


def test_the_same_shard_map_program_compiles_for_v5e_2x2():
    _, topo = tc.topology("v5e:2x2")
    devices = topo.devices
    assert len(devices) == 4
    mesh = Mesh(np.array(devices), ("k",))
    m, k, n = 256, 4 * 128, 256
    x = jax.ShapeDtypeStruct((m, k), bf16, sharding=NamedSharding(mesh, P(None, "k")))
    y = jax.ShapeDtypeStruct((k, n), bf16, sharding=NamedSharding(mesh, P("k", None)))
    lowered = k_sharded_matmul(mesh).trace(x, y).lower()
    text = lowered.as_text()
    assert "tpu_custom_call" in text and "tpu_kernel_examples" not in text  # the TPU lowering only
    compiled = lowered.compile()
    hlo = compiled.as_text()
    assert 'custom_call_target="tpu_custom_call"' in hlo
    kernel_name = ex.matmul.lower(jax.ShapeDtypeStruct((m, k // 4), bf16),
                                  jax.ShapeDtypeStruct((k // 4, n), bf16))["kernel_name"]
    assert f'kernel_name = "{kernel_name}"' in text
    assert "all-reduce" in hlo  # the psum around it

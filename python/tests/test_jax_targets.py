"""The TPU generation a JAX op builds its kernel for (issue 20): the TPU lowering takes it from the
device kind of what it lowers for — a topology's devices when cross-lowering through
`jax.experimental.topologies`, the abstract mesh in scope (`use_abstract_mesh`, as Pallas reads it) —
the call's `target=` overrides it, and with no TPU in sight it is the library's default (v5e).

`by_target` (tests/user-crate) copies in blocks of the MXU's size (128 or 256 rows) and names its
kernel after the generation it is built for (`copy_v6e`): the custom call shows what was built."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tpu_kernel
import tpu_kernel.examples as ex
import tpu_toolchain as tc

X = jax.ShapeDtypeStruct((512, 128), jnp.float32)
GENERATIONS = list(tc.GENERATION_TOPOLOGIES)  # every target row: v4, v5e, v5p, v6e, tpu7x
MXU = {"v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "tpu7x": 256}  # kernel_runtime::target's mxu_size


def custom_call(text):
    [call] = tc.tpu_custom_calls(text)
    return call


def built_for(call) -> str:
    """The generation the custom call's kernel was built for (by_target names it)."""
    name = json.loads(call["attrs"]["kernel_name"])
    assert name.startswith("copy_"), name
    return name[len("copy_"):]


def on_device(generation):
    """`X` placed on the first device of the generation's topology (no abstract mesh in scope)."""
    _, desc = tc.topology(generation)
    mesh = Mesh(np.array(desc.devices[:1]), ("x",))
    return jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=NamedSharding(mesh, P())), mesh


@pytest.mark.parametrize("generation", GENERATIONS)
def test_cross_lowering_for_a_topology_builds_for_its_generation(user_crate, generation):
    x, mesh = on_device(generation)
    # The jit's devices are the topology's: their device kind picks the target.
    call = custom_call(jax.jit(user_crate.by_target).trace(x).lower().as_text())
    assert built_for(call) == generation
    # Inside the topology's abstract mesh (how Pallas is cross-lowered on a CPU host), the same.
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        call = custom_call(jax.jit(user_crate.by_target).trace(X).lower(lowering_platforms=("tpu",)).as_text())
    assert built_for(call) == generation
    # What libtpu gets is the kernel built for it: the scoped VMEM limit of that generation.
    answer = user_crate.by_target.lower(X, target=generation)
    assert call["config"] == json.loads(answer["backend_config"])
    assert answer["target"] == generation


@pytest.mark.parametrize("generation", ["v5e", "tpu7x"])
def test_the_kernel_built_for_a_generation_compiles_there(user_crate, generation):
    res = tc.compile_jax(user_crate.by_target, [X], generation)
    assert res.ok, res.error
    assert res.n_custom_calls == 1


def test_the_calls_target_overrides_the_device(user_crate):
    x, _ = on_device("v5e")
    call = custom_call(jax.jit(lambda a: user_crate.by_target(a, target="tpu7x")).trace(x).lower().as_text())
    assert built_for(call) == "tpu7x"
    # A jax device kind names a target too.
    call = custom_call(tc.lower_jax_for_tpu(lambda a: user_crate.by_target(a, target="TPU v6 lite"), [X]))
    assert built_for(call) == "v6e"


def test_without_a_tpu_the_default_target(user_crate):
    call = custom_call(tc.lower_jax_for_tpu(user_crate.by_target, [X]))
    assert built_for(call) == user_crate.default_target == "v5e"
    # The CPU lowering runs the kernel built for the default target (or the call's).
    x = jnp.arange(512 * 128, dtype=jnp.float32).reshape(512, 128)
    np.testing.assert_array_equal(np.asarray(jax.jit(user_crate.by_target)(x)), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(user_crate.by_target(x, target="v6e")), np.asarray(x))


def test_blocks_follow_the_generation(user_crate):
    for g in GENERATIONS:
        answer = user_crate.by_target.lower(X, target=g)
        body = tc.deserialize_body(tc.b64_body(json.loads(answer["backend_config"])))
        assert f"window_bounds = array<i64: {MXU[g]}, 128>" in body, (g, body)


def test_an_unknown_target_is_a_kernel_error_naming_the_targets(user_crate):
    with pytest.raises(tpu_kernel.KernelError) as e:
        jax.eval_shape(lambda a: user_crate.by_target(a, target="v7x"), X)
    assert "unknown TPU target `v7x`" in str(e.value) and "v4, v5e, v5p, v6e, tpu7x" in str(e.value)


def test_differentiable_kernels_build_their_backward_for_the_same_target():
    x, y = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    f = jax.grad(lambda a, b: ex.matmul(a, b, target="tpu7x").astype(jnp.float32).sum(), argnums=(0, 1))
    calls = tc.tpu_custom_calls(tc.lower_jax_for_tpu(f, [x, y]))
    names = sorted(json.loads(c["attrs"]["kernel_name"]) for c in calls)
    assert names == ["matmul_dw_kernel", "matmul_dx_kernel"], names  # (the unused forward is dropped)
    for c in calls:
        [scoped] = c["config"]["scoped_memory_configs"]
        assert scoped["size"] == 32 << 20, c["attrs"]["kernel_name"]  # tpu7x's default, not v5e's 16 MiB


def test_the_library_lists_the_rust_target_table(user_crate):
    """Rust's target table (name, topology, device kinds) is what the toolchain helpers compile for,
    and each topology's devices report one of its row's device kinds."""
    assert {t["name"]: t["topology"] for t in user_crate.targets} == tc.GENERATION_TOPOLOGIES
    for t in user_crate.targets:
        _, desc = tc.topology(t["name"])
        assert desc.devices[0].device_kind in t["device_kinds"], t


def test_v4_refuses_int8_matmuls_as_libtpu_does():
    """What our checks accept, libtpu accepts for the target in hand: an i8 × i8 matmul is refused for
    v4 at build time, as libtpu refuses the Pallas twin there (E2001 unsupported matmul RHS type), and
    compiles for the generations that take it."""
    import pallas_kernels as pk
    fn, args = pk.KERNELS["quantized_matmul_w8a8"]
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.quantized_matmul_w8a8.build(*args, target="v4")
    assert "v4 does not multiply i8 blocks" in str(e.value), str(e.value)
    pallas = tc.compile_jax(fn, args, "v4")
    assert not pallas.ok and "Unsupported matmul RHS type" in pallas.error, pallas.error
    assert ex.quantized_matmul_w8a8.build(*args, target="v5p")["target"] == "v5p"


def _raises_its_vmem_limit_as_its_error_suggests(op, args, block, target, limit):
    """Blocks over `target`'s default scoped VMEM: `op` refuses them naming `vmem_limit_bytes`; a limit
    that is not positive is refused naming it; with `limit` the lowering carries that scoped limit
    and libtpu compiles it for `target`."""
    with pytest.raises(tpu_kernel.KernelError) as e:
        op.build(*args, block=block, target=target)
    assert "scoped VMEM limit" in str(e.value) and "vmem_limit_bytes" in str(e.value), str(e.value)
    for bad in (0, -1):
        with pytest.raises(tpu_kernel.KernelError) as e:
            op.build(*args, block=block, vmem_limit_bytes=bad, target=target)
        assert "vmem_limit_bytes" in str(e.value) and "must be positive" in str(e.value), str(e.value)
    built = op.lower(*args, block=block, vmem_limit_bytes=limit, target=target)
    assert json.loads(built["backend_config"])["scoped_memory_configs"][0]["size"] == limit

    def fn(*a):
        return op(*a, block=block, vmem_limit_bytes=limit)
    res = tc.compile_jax(fn, args, target)
    assert res.ok, res.error


def test_grouped_matmul_raises_its_vmem_limit_as_its_error_suggests():
    """megablox gmm's table choice for 128 tokens, k = n = 6144, 20 groups (128 x 2048 x 6144) with
    bf16 weights needs 55 MiB of VMEM, over tpu7x's default scoped 32 MiB: refused, naming
    `vmem_limit_bytes`; with it (60 MiB) it builds, and libtpu compiles it for tpu7x."""
    S = jax.ShapeDtypeStruct
    m, k, n, g, tm = 128, 6144, 6144, 20, 128
    visits = m // tm + g - 1
    args = (S((g + 1,), jnp.int32), S((visits,), jnp.int32), S((visits,), jnp.int32),
            S((m, k), jnp.bfloat16), S((g, k, n), jnp.bfloat16))
    _raises_its_vmem_limit_as_its_error_suggests(ex.grouped_matmul, args, (tm, 2048, 6144), "tpu7x", 60 << 20)


def test_w8a8_raises_its_vmem_limit_as_its_error_suggests():
    """tpu-inference's largest v6 qmm blocks (2048 x 1024 x 3584) need ~39 MiB of VMEM, over v6e's
    default scoped 32 MiB: refused, naming `vmem_limit_bytes`; with the example's `vmem_limit_bytes`
    (tpu-inference's v6 ceiling, 96 MiB) it builds, and libtpu compiles it for v6e."""
    S = jax.ShapeDtypeStruct
    args = (S((2048, 3584), jnp.int8), S((2048, 1), jnp.float32), S((3584, 1024), jnp.int8),
            S((1, 1024), jnp.float32))
    _raises_its_vmem_limit_as_its_error_suggests(ex.quantized_matmul_w8a8, args, (2048, 1024, 3584), "v6e", 96 << 20)

"""The example kernels as JAX ops under jax.jit, jax.vmap and jax.grad, on CPU (our interpreter through
XLA FFI), against plain jnp references; and the trace-time cache (a second trace does not call Rust;
two spellings of a static parameter are one primitive, as Rust canonicalizes them)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas_kernels as pk
import tpu_kernel
import tpu_kernel.examples as ex
from conftest import example_names

f32, bf16 = jnp.float32, jnp.bfloat16
rng = np.random.default_rng(0)


def rand(shape, dtype=f32, lo=-1.0, hi=1.0):
    return jnp.asarray(rng.uniform(lo, hi, size=shape).astype(np.float32)).astype(dtype)


def close(ours, ref, dtype=None):
    """Compare in f32 with a tolerance fitting the dtype: bf16 results may differ from XLA's by a
    rounding step (different summation order before the final bf16 cast)."""
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    dtype = dtype or f32
    scale = float(np.max(np.abs(ref))) if ref.size and np.isfinite(ref).all() else 1.0
    if dtype == bf16:
        np.testing.assert_allclose(ours, ref, rtol=2e-2, atol=1e-2 * scale)
    else:
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * max(scale, 1.0))


# ------------------------------------------------------------------------------------------ jit

@pytest.mark.parametrize("name", example_names(include_spmd=False))
def test_jit_matches_the_jnp_reference(name):
    """Every examples/ kernel at the example's shapes and default parameters."""
    assert name in pk.KERNELS and name in pk.REFERENCES, f"no Pallas twin/reference for {name}"
    args = pk.valid_inputs(name, [rand(s.shape, s.dtype) for s in pk.KERNELS[name][1]])
    kernel = ex.library.kernels[ex.WRAPPERS.get(name, name)]
    ours = jax.jit(kernel)(*args)
    ref = jax.jit(pk.REFERENCES[name])(*args)
    ours, ref = (ours, ref) if isinstance(ours, tuple) else ((ours,), (ref,))
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert o.dtype == r.dtype and o.shape == r.shape
        if jnp.issubdtype(o.dtype, jnp.integer):
            np.testing.assert_array_equal(np.asarray(o), np.asarray(r))
        else:
            close(o, r, o.dtype)


def test_eager_call_runs_the_same_as_jit():
    x = rand((64, 256))
    np.testing.assert_array_equal(np.asarray(ex.softmax(x)), np.asarray(jax.jit(ex.softmax)(x)))


def matmul_ref(x, y):
    return jnp.dot(x, y, preferred_element_type=f32).astype(x.dtype)


def rmsnorm_ref(x, w, eps=1e-6):
    xf = x.astype(f32)
    return (xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * w).astype(x.dtype)


def test_shapes_other_than_the_examples():
    x, y = rand((256, 384), bf16), rand((384, 512), bf16)
    out = jax.jit(lambda a, b: ex.matmul(a, b, block=(128, 128, 128)))(x, y)
    assert out.shape == (256, 512) and out.dtype == bf16
    close(out, matmul_ref(x, y), bf16)
    # a non-square block
    close(jax.jit(lambda a, b: ex.matmul(a, b, block=(128, 256, 128)))(x, y), matmul_ref(x, y), bf16)
    s = rand((48, 384))
    close(jax.jit(lambda a: ex.softmax(a, block_rows=16))(s), jax.nn.softmax(s, axis=-1))
    xr, w = rand((32, 256), bf16), rand((1, 256))
    close(jax.jit(lambda a, b: ex.rmsnorm(a, b, eps=1e-5, block_rows=8))(xr, w), rmsnorm_ref(xr, w, 1e-5), bf16)
    a, b = rand((512, 768)), rand((512, 768))
    np.testing.assert_array_equal(np.asarray(jax.jit(ex.add)(a, b)), np.asarray(a + b))
    np.testing.assert_array_equal(np.asarray(ex.add(a, b, block=(128, 256))), np.asarray(a + b))


def test_inside_a_larger_jnp_program():
    """Kernels fed by and feeding XLA ops, two of ours chained, a kernel output used twice."""
    x, y, w = rand((128, 256), bf16), rand((256, 384), bf16), rand((1, 384))

    def program(ex_matmul, ex_rmsnorm, ex_softmax):
        def f(x, y, w):
            h = ex_matmul(jnp.tanh(x.astype(f32)).astype(bf16), y)
            n = ex_rmsnorm(h, w)
            p = ex_softmax(n.astype(f32) * 0.5 + 1.0)
            return p @ jnp.ones((384, 4), f32) + jnp.sum(h.astype(f32), axis=1, keepdims=True)
        return f

    ours = jax.jit(program(ex.matmul, ex.rmsnorm, ex.softmax))(x, y, w)
    ref = jax.jit(program(matmul_ref, rmsnorm_ref, lambda a: jax.nn.softmax(a, axis=-1)))(x, y, w)
    close(ours, ref, bf16)  # bf16 intermediates


# ----------------------------------------------------------------------------------------- vmap

def test_vmap_in_axes_0():
    x, y = rand((3, 128, 256), bf16), rand((3, 256, 128), bf16)
    out = jax.jit(jax.vmap(ex.matmul))(x, y)
    assert out.shape == (3, 128, 128)
    close(out, jax.vmap(matmul_ref)(x, y), bf16)


def test_vmap_other_axes_and_unbatched_operand():
    x, y = rand((128, 4, 256), bf16), rand((256, 128), bf16)
    out = jax.vmap(ex.matmul, in_axes=(1, None))(x, y)
    assert out.shape == (4, 128, 128)
    close(out, jnp.stack([matmul_ref(x[:, i], y) for i in range(4)]), bf16)
    yb = rand((256, 2, 128), bf16)
    out = jax.jit(jax.vmap(ex.matmul, in_axes=(None, 1), out_axes=2))(x[:, 0], yb)
    assert out.shape == (128, 128, 2)
    close(out, jnp.stack([matmul_ref(x[:, 0], yb[:, i]) for i in range(2)], axis=2), bf16)
    # the common case of a normalization: a batch of rows, one weight row
    xr, w = rand((5, 32, 256), bf16), rand((1, 256))
    close(jax.vmap(ex.rmsnorm, in_axes=(0, None))(xr, w), jax.vmap(rmsnorm_ref, in_axes=(0, None))(xr, w), bf16)


def test_nested_vmap():
    # outer over y (axis 0), inner over x (axis 1): out[i, j] = x[:, j] @ y[i]
    x, y = rand((128, 3, 128), bf16), rand((2, 128, 256), bf16)
    f = jax.vmap(jax.vmap(ex.matmul, in_axes=(1, None)), in_axes=(None, 0))
    out = jax.jit(f)(x, y)
    assert out.shape == (2, 3, 128, 256)
    ref = jnp.stack([jnp.stack([matmul_ref(x[:, j], y[i]) for j in range(3)]) for i in range(2)])
    close(out, ref, bf16)
    s = rand((2, 3, 16, 128))
    close(jax.vmap(jax.vmap(ex.softmax))(s), jax.nn.softmax(s, axis=-1))


def test_vmap_of_a_multi_output_kernel():
    name = "ops_tour"
    xs = [rand(s.shape, s.dtype) for s in pk.KERNELS[name][1]]
    xb = jnp.stack([xs[0], xs[0] * 0.5])
    o, c = jax.vmap(ex.ops_tour, in_axes=(0, None))(xb, xs[1])
    for i in range(2):
        ro, rc = pk.REFERENCES[name](xb[i], xs[1])
        close(o[i], ro)
        np.testing.assert_array_equal(np.asarray(c[i]), np.asarray(rc))


# ----------------------------------------------------------------------------------------- grad

def test_grad_of_matmul_in_both_inputs():
    x, y, c = rand((128, 256), bf16), rand((256, 384), bf16), rand((128, 384))

    def loss(mm):
        return lambda x, y: jnp.sum(mm(x, y).astype(f32) * c)

    gx, gy = jax.jit(jax.grad(loss(ex.matmul), argnums=(0, 1)))(x, y)
    rx, ry = jax.grad(loss(matmul_ref), argnums=(0, 1))(x, y)
    assert gx.dtype == bf16 and gy.dtype == bf16 and gx.shape == x.shape and gy.shape == y.shape
    close(gx, rx, bf16)
    close(gy, ry, bf16)
    # the backward kernels are ours: the gradient's jaxpr calls matmul_dx and matmul_dw
    jaxpr = str(jax.make_jaxpr(jax.grad(loss(ex.matmul), argnums=(0, 1)))(x, y))
    for entry in ex.matmul.grad:
        assert f"kernel={entry['kernel']}" in jaxpr


def test_grad_of_rmsnorm_in_x_and_w():
    x, w, c = rand((64, 256), bf16), rand((1, 256), f32, 0.5, 1.5), rand((64, 256))

    def loss(rms):
        return lambda x, w: jnp.sum(rms(x, w).astype(f32) * c)

    gx, gw = jax.jit(jax.grad(loss(ex.rmsnorm), argnums=(0, 1)))(x, w)
    rx, rw = jax.grad(loss(rmsnorm_ref), argnums=(0, 1))(x, w)
    assert gx.dtype == bf16 and gw.dtype == f32 and gw.shape == w.shape
    close(gx, rx, bf16)
    close(gw, rw, bf16)  # accumulated from bf16 rows


def test_grad_under_vmap_per_example():
    x, y = rand((2, 128, 128), bf16), rand((128, 128), bf16)
    per_example = jax.vmap(jax.grad(lambda x, y: jnp.sum(ex.matmul(x, y).astype(f32) ** 2)), in_axes=(0, None))
    ref = jax.vmap(jax.grad(lambda x, y: jnp.sum(matmul_ref(x, y).astype(f32) ** 2)), in_axes=(0, None))
    close(per_example(x, y), ref(x, y), bf16)


def test_grad_of_a_kernel_without_backward_kernels_is_a_clear_error():
    x = rand((16, 128))
    with pytest.raises(tpu_kernel.KernelError) as e:
        jax.grad(lambda x: jnp.sum(ex.softmax(x)))(x)
    msg = str(e.value)
    assert "'softmax'" in msg and "no backward kernels" in msg
    assert "Differentiation rule" not in msg


def test_static_parameters_are_not_differentiated():
    x, y = rand((128, 128), bf16), rand((128, 128), bf16)
    g1 = jax.grad(lambda x: jnp.sum(ex.matmul(x, y, block=(128, 128, 128)).astype(f32)))(x)
    g2 = jax.grad(lambda x: jnp.sum(ex.matmul(x, y, block=(64, 128, 128)).astype(f32)))(x)
    close(g1, g2, bf16)


# ---------------------------------------------------------------------------------------- cache

def test_second_trace_of_a_signature_does_not_call_rust():
    lib = ex.library
    x, y = rand((384, 128), bf16), rand((128, 256), bf16)  # a signature no other test uses
    jax.jit(lambda a, b: ex.matmul(a, b)).lower(x, y)       # first trace: build (and CPU lowering)
    stats, calls = lib.stats(), lib.rust_calls
    # a new function object (so jax's own trace cache cannot help), same kernel signature
    jax.jit(lambda a, b: ex.matmul(a, b) + 0).lower(x, y)
    jax.make_jaxpr(lambda a, b: ex.matmul(a, b))(x, y)
    assert lib.rust_calls == calls, "a second trace of the same signature called into Rust"
    assert lib.stats() == stats
    # different static parameters are another signature: one new build
    jax.make_jaxpr(lambda a, b: ex.matmul(a, b, block=(128, 256, 128)))(x, y)
    assert lib.stats()["builds"] == stats["builds"] + 1


def test_ffi_handler_builds_once_per_signature():
    lib = ex.library
    x = rand((40, 384))  # a signature no other test uses
    f = jax.jit(lambda a: ex.softmax(a))
    before = lib.stats()["ffi_builds"]
    f(x).block_until_ready()
    first = lib.stats()["ffi_builds"]
    f(x).block_until_ready()
    jax.jit(lambda a: ex.softmax(a) * 1)(x).block_until_ready()
    assert first - before <= 1
    assert lib.stats()["ffi_builds"] == first


def tpu_kernel_eqns(jaxpr):
    """The `tpu_kernel` equations of a jaxpr, nested ones (custom_vjp, pjit) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "tpu_kernel":
            found.append(eqn)
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += tpu_kernel_eqns(inner)
    return found


def assert_one_signature(kernel, call, args, spellings, canonical):
    """Every spelling of the static parameters is one primitive (equal equation parameters carrying
    Rust's `canonical` text), one build, one cache entry and one custom_vjp function, the same lowered
    program and the same result bits; a spelling seen before does not call into Rust again."""
    lib = kernel.library
    builds, entries, vjps = lib.stats()["builds"], len(lib._cache), len(kernel._vjp_cache)
    eqns = [tpu_kernel_eqns(jax.make_jaxpr(call(s))(*args).jaxpr) for s in spellings]
    assert all(len(e) == 1 for e in eqns), eqns
    assert {e[0].params["params"] for e in eqns} == {canonical}
    assert all(e[0].params == eqns[0][0].params for e in eqns)
    assert lib.stats()["builds"] == builds + 1 and len(lib._cache) == entries + 1
    # (keyed by the target too: None, the one the lowering finds)
    assert (canonical, None) in kernel._vjp_cache and len(kernel._vjp_cache) <= vjps + 1  # (+0: made before)
    texts = {call(s).lower(*args).as_text() for s in spellings}
    assert len(texts) == 1, texts
    assert len({np.asarray(call(s)(*args)).tobytes() for s in spellings}) == 1
    calls = lib.rust_calls
    for s in spellings:
        jax.make_jaxpr(call(s))(*args)
    assert lib.rust_calls == calls, "a static parameter spelling seen before was sent to Rust again"


def test_an_int_and_a_float_eps_are_one_primitive():
    """Rust is the only canonicalizer of static parameters: `eps=1` (an int), `eps=1.0` and numpy
    scalars of either are rmsnorm's `eps: f32` = 1.0."""
    x, w = rand((48, 256), bf16), rand((1, 256), f32)  # a signature no other test uses
    assert_one_signature(ex.rmsnorm, lambda eps: jax.jit(lambda a, b: ex.rmsnorm(a, b, eps=eps, block_rows=8)),
                         (x, w), [1, 1.0, np.float32(1), np.int64(1)], '{"eps":1.0,"block_rows":8}')


def test_a_tuple_and_a_list_block_are_one_primitive():
    x, y = rand((128, 384), bf16), rand((384, 128), bf16)  # a signature no other test uses
    assert_one_signature(ex.matmul, lambda block: jax.jit(lambda a, b: ex.matmul(a, b, block=block)),
                         (x, y), [(128, 128, 128), [128, 128, 128], (np.int32(128), 128, np.uint16(128))],
                         '{"block":[128,128,128]}')


def test_defaults_are_rusts_and_a_default_spelled_out_is_the_same_primitive():
    assert ex.softmax.canonical_params({}) == ex.softmax.canonical_params({"block_rows": 8}) \
        == '{"block_rows":8}'
    # rmsnorm's default eps is 1e-6 as f32 writes it (the shortest decimal that reads back)
    assert json.loads(ex.rmsnorm.canonical_params({}))["eps"] == 1e-6


def test_a_user_crate_kernel_differentiates_through_its_declared_backward(user_crate):
    """`scale(x, factor)`'s backward entry is `scale(g, factor=factor)`: the forward's static
    parameter reaches the backward kernel."""
    x = rand((16, 128))
    g = jax.jit(jax.grad(lambda x: jnp.sum(user_crate.scale(x, factor=2.5) * x)))(x)
    close(g, 2.5 * x + 2.5 * x)  # d/dx sum(2.5 x * x) = 5 x

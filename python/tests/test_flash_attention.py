"""Flash attention as a JAX op and a torch op (issue 12, item 1): `tpu_kernel.examples.flash_attention(q,
k, v, causal=False)` matches attention in jnp, `jax.grad` (custom_vjp: the forward with residuals, then the
Rust dK/dV and dQ kernels) matches `jax.grad` of the jnp reference for q, k and v, torch autograd through
torchax matches torch's `scaled_dot_product_attention`, and every flash kernel — forward and both
backward kernels, causal and not — compiles with libtpu for v5e and v6e at no more LLO ops and scheduled
bundles than its Pallas twin (`pallas_kernels.py`)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import pallas_kernels as pk
import tpu_kernel
import tpu_kernel.examples as ex
import tpu_kernel.torch.examples as tex
import tpu_toolchain as tc
from conftest import compiled

bf16, f32 = jnp.bfloat16, jnp.float32
SHAPE = (2, 512, 128)  # [batch * heads, seq, head_dim]: seq 512, the smallest the default blocks serve


def qkv(seed, shape=SHAPE):
    keys = jax.random.split(jax.random.key(seed), 4)
    return [jax.random.normal(k, shape, f32).astype(bf16) for k in keys]


def assert_close(what, ours, ref, rel=2e-2):
    """Within `rel` of the reference's largest magnitude elementwise, and normwise within rel / 2."""
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    assert ours.shape == ref.shape, what
    scale = np.abs(ref).max()
    err = np.abs(ours - ref).max()
    assert err <= rel * scale, f"{what}: max error {err} vs scale {scale}"
    norm = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert norm <= rel / 2, f"{what}: normwise error {norm}"


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_jnp(causal):
    q, k, v, _ = qkv(0)
    out = jax.jit(lambda q, k, v: ex.flash_attention(q, k, v, causal=causal))(q, k, v)
    assert out.dtype == bf16 and out.shape == SHAPE
    assert_close("o", out, pk.attention_ref(q, k, v, causal=causal))


@pytest.mark.parametrize("causal", [False, True])
def test_grad_matches_jax_grad_of_the_jnp_reference(causal):
    q, k, v, w = qkv(1)

    def loss(attention):
        return lambda q, k, v: jnp.sum(attention(q, k, v).astype(f32) * w.astype(f32))

    ours = jax.jit(jax.grad(loss(lambda q, k, v: ex.flash_attention(q, k, v, causal=causal)), argnums=(0, 1, 2)))(
        q, k, v)
    ref = jax.jit(jax.grad(loss(lambda q, k, v: pk.attention_ref(q, k, v, causal=causal)), argnums=(0, 1, 2)))(
        q, k, v)
    for name, o, r in zip("qkv", ours, ref):
        assert o.dtype == bf16 and o.shape == SHAPE, name
        assert_close(f"d{name} (causal={causal})", o, r)


def test_plain_calls_write_no_residuals_and_grads_run_the_rust_backward_kernels():
    """Without differentiation only `flash_attention` runs; under `jax.grad`, `flash_attention_fwd` (its
    log-sum-exp residual) and the dK/dV and dQ kernels do — FFI calls, not jnp."""
    q, k, v, _ = qkv(2)
    kernels = lambda text: set(re.findall(r"\bkernel=(\w+)", text))  # noqa: E731 (the primitive's param)
    plain = str(jax.make_jaxpr(lambda q, k, v: ex.flash_attention(q, k, v))(q, k, v))
    grad = str(jax.make_jaxpr(jax.grad(lambda q, k, v: ex.flash_attention(q, k, v).astype(f32).sum(),
                                       argnums=(0, 1, 2)))(q, k, v))
    assert kernels(plain) == {"flash_attention"}, plain
    assert kernels(grad) == {"flash_attention_fwd", "flash_attention_dkv", "flash_attention_dq"}, grad


def test_residual_is_the_log_sum_exp():
    q, k, v, _ = qkv(3)
    o, lse = ex.flash_attention_fwd(q, k, v, causal=True)
    s = jnp.einsum("hqd,hkd->hqk", q.astype(f32), k.astype(f32)) / SHAPE[2] ** 0.5
    s = jnp.where(jnp.tril(jnp.ones(SHAPE[1:2] * 2, bool)), s, -jnp.inf)
    want = jax.nn.logsumexp(s, axis=-1)
    assert lse.shape == SHAPE[:2] + (128,) and lse.dtype == f32
    np.testing.assert_allclose(np.asarray(lse), np.broadcast_to(np.asarray(want)[..., None], lse.shape),
                               rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(o).view(np.int16),
                                  np.asarray(ex.flash_attention(q, k, v, causal=True)).view(np.int16))


def test_bad_calls_are_errors_naming_the_argument():
    q, k, v, _ = qkv(4)
    with pytest.raises(tpu_kernel.KernelError, match=r"k is \[2, 256, 128\] but q is \[2, 512, 128\]"):
        ex.flash_attention(q, k[:, :256], v)
    with pytest.raises(tpu_kernel.KernelError, match="v is f32: flash attention takes bf16"):
        ex.flash_attention(q, k, v.astype(f32))
    with pytest.raises(tpu_kernel.KernelError, match=r"block \(384, 128\) must divide seq = 512"):
        ex.flash_attention(q, k, v, block=(384, 128))


@pytest.mark.parametrize("causal", [False, True])
def test_torch_autograd_matches_scaled_dot_product_attention(causal):
    gen = torch.Generator().manual_seed(7)
    q, k, v, w = (torch.randn(*SHAPE, generator=gen).to(torch.bfloat16) for _ in range(4))
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tex.flash_attention(*ours, causal=causal)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == SHAPE
    (out.float() * w.float()).sum().backward()
    theirs = [t.float().requires_grad_() for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*theirs, is_causal=causal)
    (ref * w.float()).sum().backward()
    assert_close("torch o", out.detach().float().numpy(), ref.detach().numpy())
    for name, o, t in zip("qkv", ours, theirs):
        assert o.grad is not None and o.grad.dtype == torch.bfloat16, name
        assert_close(f"torch d{name} (causal={causal})", o.grad.float().numpy(), t.grad.numpy())


# -- libtpu: every flash kernel, causal and not, vs its Pallas twin

def flash_kernels():
    a = jax.ShapeDtypeStruct((2, 1024, 128), bf16)
    lse = jax.ShapeDtypeStruct((2, 1024, 128), f32)
    return {"flash_attention": (pk.flash_attention, [a, a, a]),
            "flash_attention_dkv": (pk.flash_attention_dkv, [a, a, a, a, lse, a]),
            "flash_attention_dq": (pk.flash_attention_dq, [a, a, a, a, lse, a])}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", ["flash_attention", "flash_attention_dkv", "flash_attention_dq"])
def test_not_above_pallas_on_tpu(name, causal, generation):
    twin, args = flash_kernels()[name]
    kernel = getattr(ex, name)
    key = f"{name}[{'causal' if causal else 'full'}]"
    ours = compiled("ours", key, generation,
                    lambda: tc.compile_jax(lambda *a: kernel(*a, causal=causal), args, generation))
    theirs = compiled("pallas", key, generation,
                      lambda: tc.compile_jax(lambda *a: twin(*a, causal=causal), args, generation))
    assert ours.ok, f"libtpu rejected our {key} for {generation}:\n{ours.error}"
    assert theirs.ok, f"libtpu rejected the Pallas {key} for {generation}:\n{theirs.error}"
    assert ours.llo_total <= theirs.llo_total, f"{key} {generation}: LLO {ours.llo_total} > {theirs.llo_total}"
    assert ours.bundles <= theirs.bundles, f"{key} {generation}: bundles {ours.bundles} > {theirs.bundles}"

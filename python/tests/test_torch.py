"""tpu_kernel.torch: our kernels on torch tensors through torchax — plain CPU tensors and torchax
tensors alike, eagerly and inside `torchax.interop.jax_jit`, as `nn.Module` layers, and with
`loss.backward()` reaching the Rust backward kernels (gradients checked against plain torch)."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchax

import tpu_kernel
import tpu_kernel.examples as ex
import tpu_kernel.torch as tkt
import tpu_kernel.torch.examples as tex

ENV = torchax.default_env()


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def bits(t: torch.Tensor) -> np.ndarray:
    """A torch tensor's bits (bf16 viewed as int16), to compare bit for bit."""
    t = t.detach()
    if tkt._is_torchax(t):
        t = tkt._jax_to_cpu(t.jax())
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def jax_bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int16) if a.dtype == jnp.bfloat16 else a


CASES = {  # name: (tensors, static params)
    "matmul": lambda: ([rand(256, 256, dtype=torch.bfloat16), rand(256, 128, dtype=torch.bfloat16, seed=1)],
                       dict(block=(128, 128, 128))),
    "softmax": lambda: ([rand(64, 1024)], dict(block_rows=8)),
    "rmsnorm": lambda: ([rand(64, 1024, dtype=torch.bfloat16), rand(1, 1024, seed=2)], dict(eps=1e-5)),
    "add": lambda: ([rand(512, 512), rand(512, 512, seed=3)], dict()),
    # int32 lengths and block table (1 token, every page, empty, ragged), bf16 q and k/v pages
    "paged_attention": lambda: ([torch.tensor([1, 64, 0, 17], dtype=torch.int32),
                                 torch.randperm(16, generator=torch.Generator().manual_seed(4))
                                 .to(torch.int32).reshape(4, 4),
                                 rand(4, 8, 128, dtype=torch.bfloat16, seed=5),
                                 rand(1, 16, 16, 128, dtype=torch.bfloat16, seed=6),
                                 rand(1, 16, 16, 128, dtype=torch.bfloat16, seed=7)],
                                dict(pages_per_compute_block=2)),
}


def to_jax(t: torch.Tensor):
    """The same values as a jax array of the same dtype (bf16, int32, else f32)."""
    if t.dtype == torch.int32:
        return jnp.asarray(t.numpy())
    return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16 if t.dtype == torch.bfloat16 else jnp.float32)


def test_every_example_has_a_torch_op_with_the_jax_signature():
    assert tex.__all__ == ex.__all__
    for name in ex.__all__:
        op = getattr(tex, name)
        if name in ex.WRAPPERS:  # a function over a kernel: its torch face takes the same arrays
            params = list(inspect.signature(getattr(ex, name)).parameters)
            assert list(inspect.signature(op).parameters) == params, name
            continue
        assert inspect.signature(op) == inspect.signature(getattr(ex, name)), name
        assert op.kernel is getattr(ex, name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_tensors_in_cpu_tensors_out_same_bits_as_the_jax_op(name):
    tensors, params = CASES[name]()
    out = getattr(tex, name)(*tensors, **params)
    assert type(out) is torch.Tensor and out.device.type == "cpu"
    want = getattr(ex, name)(*[to_jax(t) for t in tensors], **params)
    assert tuple(out.shape) == want.shape
    np.testing.assert_array_equal(bits(out), jax_bits(want))


@pytest.mark.parametrize("name", sorted(CASES))
def test_torchax_tensors_in_torchax_tensors_out_eager_and_under_jax_jit(name):
    tensors, params = CASES[name]()
    plain = getattr(tex, name)(*tensors, **params)
    with ENV:
        xs = [ENV.to_xla(t) for t in tensors]
        eager = getattr(tex, name)(*xs, **params)
        assert isinstance(eager, torchax.tensor.Tensor)
        jitted = torchax.interop.jax_jit(lambda *a: getattr(tex, name)(*a, **params))(*xs)
        assert isinstance(jitted, torchax.tensor.Tensor)
    np.testing.assert_array_equal(bits(eager), bits(plain))
    np.testing.assert_array_equal(bits(jitted), bits(plain))


def test_inside_jax_jit_the_kernel_is_traced_into_the_program():
    x, y = CASES["add"]()[0]
    with ENV:
        f = torchax.interop.jax_view(lambda a, b: tex.add(a, b) * 2)
        text = jax.jit(f).lower(*(jnp.asarray(t.numpy()) for t in (x, y))).as_text()
    assert "tpu_kernel_examples" in text  # our FFI target, inside the jitted program


def reference_rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(torch.bfloat16)


def test_layers_forward_and_backward_match_plain_torch():
    torch.manual_seed(0)
    norm, lin = tkt.RMSNorm(256, eps=1e-6), tkt.Linear(256, 384)
    with torch.no_grad():
        norm.weight.copy_(rand(256, seed=4) + 1.5)
    x = rand(4, 32, 256, dtype=torch.bfloat16, seed=5).requires_grad_()
    out = lin(norm(x))
    loss = (out.float() ** 2).mean()
    loss.backward()
    assert out.shape == (4, 32, 384) and out.dtype == torch.bfloat16
    # The same computation in plain torch, same weights.
    xr = x.detach().clone().requires_grad_()
    wn = norm.weight.detach().clone().requires_grad_()
    wl = lin.weight.detach().clone().requires_grad_()
    ref = (reference_rmsnorm(xr, wn, 1e-6).float() @ wl.float()).to(torch.bfloat16)
    ((ref.float() ** 2).mean()).backward()
    scale = lambda t: t.detach().float().abs().max().item()  # noqa: E731
    for ours, theirs, what in [(out, ref, "output"), (x.grad, xr.grad, "dx"),
                               (norm.weight.grad, wn.grad, "d norm.weight"), (lin.weight.grad, wl.grad, "d lin.weight")]:
        assert ours is not None, what
        err = (ours.detach().float() - theirs.detach().float()).abs().max().item()
        assert err <= 0.02 * scale(theirs) + 1e-3, f"{what}: max error {err} vs scale {scale(theirs)}"


def test_backward_reaches_the_rust_backward_kernels():
    """The gradient program is our matmul_dx / matmul_dw kernels (their FFI calls), not jnp."""
    x, w = CASES["matmul"]()[0]
    xa, wa = jnp.asarray(x.float().numpy()).astype(jnp.bfloat16), jnp.asarray(w.float().numpy()).astype(jnp.bfloat16)
    grad_text = jax.jit(jax.grad(lambda a, b: ex.matmul(a, b).astype(jnp.float32).sum(), argnums=(0, 1))) \
        .lower(xa, wa).as_text()
    names = {ex.matmul_dx.lower(jnp.zeros((256, 128), jnp.bfloat16), wa)["kernel_name"],
             ex.matmul_dw.lower(xa, jnp.zeros((256, 128), jnp.bfloat16))["kernel_name"]}
    assert grad_text.count("tpu_kernel_examples") >= 2, grad_text[:2000]
    # and through torch: the grads equal jax.grad of the jax op, bit for bit
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    tex.matmul(xt, wt).float().sum().backward()
    gx, gw = jax.grad(lambda a, b: ex.matmul(a, b).astype(jnp.float32).sum(), argnums=(0, 1))(xa, wa)
    np.testing.assert_array_equal(bits(xt.grad), jax_bits(gx))
    np.testing.assert_array_equal(bits(wt.grad), jax_bits(gw))
    assert all(n for n in names)


def test_backward_through_torchax_tensors():
    x, w = CASES["matmul"]()[0]
    with ENV:
        xt, wt = ENV.to_xla(x).requires_grad_(), ENV.to_xla(w).requires_grad_()
        tex.matmul(xt, wt).float().sum().backward()
        assert isinstance(xt.grad, torchax.tensor.Tensor)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    tex.matmul(xc, wc).float().sum().backward()
    np.testing.assert_array_equal(bits(xt.grad), bits(xc.grad))
    np.testing.assert_array_equal(bits(wt.grad), bits(wc.grad))


def test_mistakes_are_kernel_errors_with_the_rust_message():
    x, w = CASES["matmul"]()[0]
    with pytest.raises(tpu_kernel.KernelError, match=r"matmul\.rs:\d+"):
        tex.matmul(x[:, :200], w[:200])  # 200 is not a multiple of the 128 block: Rust says so, with its line
    with pytest.raises(tpu_kernel.KernelError, match="no static parameter `blok`"):
        tex.matmul(x, w, blok=(1, 1, 1))
    with pytest.raises(tpu_kernel.KernelError, match="expected a torch tensor"):
        tex.matmul(x, np.zeros((256, 128)))
    with ENV:
        xt = ENV.to_xla(x)
    with pytest.raises(tpu_kernel.KernelError, match="mixes torchax tensors and plain CPU tensors"):
        tex.matmul(xt, w)
    with pytest.raises(tpu_kernel.KernelError, match="declares no backward kernels"):
        tex.softmax(rand(8, 128).requires_grad_())

"""Our kernels as `torch.library` custom ops (issue 24, items 1 and 2): every kernel of a loaded library is
`torch.ops.tpu_kernel_{lib}.{name}`, the op `tpu_kernel.torch.examples.<name>` calls; its fake
implementation is Rust's build answer (no kernel runs); CPU tensors, torchax tensors and autograd are
registered; and `torch.library.opcheck` passes for every example op, backward kernels included."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchax
from torch._subclasses.fake_tensor import FakeTensorMode

import tpu_kernel
import tpu_kernel.examples as ex
import tpu_kernel.torch as tkt
import tpu_kernel.torch.examples as tex
from conftest import SPMD_EXAMPLES

# The kernels of the SPMD examples (a wrapped example's is its launch's).
SPMD_KERNELS = {ex.WRAPPERS.get(n, n) for n in SPMD_EXAMPLES}

ENV = torchax.default_env()
NS = torch.ops.tpu_kernel_examples


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def ints(*shape, high, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


bf16 = torch.bfloat16

# A small valid call of every forward kernel of the examples library: (tensors, static parameters).
FORWARD = {
    "activations": lambda: ([rand(16, 128), rand(16, 128, seed=1), ints(16, 128, high=8)], {}),
    "add": lambda: ([rand(256, 256), rand(256, 256, seed=1)], {}),
    "causal_mask": lambda: ([rand(256, 256)], {}),
    "colsum": lambda: ([rand(256, 128)], {}),
    "dma_double": lambda: ([rand(256, 128)], {}),
    "flash_attention": lambda: ([rand(1, 256, 128, dtype=bf16, seed=s) for s in range(3)], dict(causal=True)),
    "flash_attention_fwd": lambda: ([rand(1, 256, 128, dtype=bf16, seed=s) for s in range(3)], {}),
    "fori_rowsum": lambda: ([rand(64, 256)], {}),
    "gather_prefetch": lambda: ([torch.tensor([3, 0, 7, 3], dtype=torch.int32), rand(64, 256)], {}),
    "grouped_matmul": lambda: ([*tex.group_metadata(torch.tensor([100, 0, 156], dtype=torch.int32), 256),
                                rand(256, 128, dtype=bf16), rand(3, 128, 128, dtype=bf16, seed=1)], {}),
    "inplace_scale": lambda: ([rand(128, 128)], {}),
    "matmul": lambda: ([rand(256, 128, dtype=bf16), rand(128, 256, dtype=bf16, seed=1)], {}),
    "ops_tour": lambda: ([rand(64, 128), rand(128, 128, seed=1)], {}),
    "paged_attention": lambda: ([torch.tensor([1, 64, 0, 17], dtype=torch.int32),
                                 torch.randperm(16, generator=torch.Generator().manual_seed(4))
                                 .to(torch.int32).reshape(4, 4),
                                 rand(4, 8, 128, dtype=bf16, seed=5), rand(1, 16, 16, 128, dtype=bf16, seed=6),
                                 rand(1, 16, 16, 128, dtype=bf16, seed=7)], dict(pages_per_compute_block=2)),
    "paged_gather": lambda: ([ints(8, 8, high=64), rand(64, 16, 128)], {}),
    # the launch behind tpu_kernel.torch.examples.ragged_paged_attention (tables first; q and kv in
    # tpu-inference's kernel layouts): a decode and a 4-token sequence, 1 kv head of 4 query heads
    "ragged_paged_attention_launch": lambda: ([
        torch.tensor([5, 20], dtype=torch.int32), torch.tensor([2, 0, 3, 1], dtype=torch.int32),
        torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([1, 1, 2], dtype=torch.int32),
        rand(1, 8, 2, 2, 128, dtype=bf16, seed=1), rand(8, 1, 2, 128, dtype=bf16, seed=2),
        rand(4, 16, 1, 2, 128, dtype=bf16, seed=3)], dict(sm_scale=0.1)),
    "quantized_matmul": lambda: ([rand(128, 256, dtype=bf16), torch.randint(-128, 128, (256, 128), dtype=torch.int8),
                                  rand(1, 128) / 64], {}),
    "quantized_matmul_w8a8": lambda: ([torch.randint(-128, 128, (128, 256), dtype=torch.int8), rand(128, 1) / 64,
                                       torch.randint(-128, 128, (256, 128), dtype=torch.int8), rand(1, 128) / 64], {}),
    "rmsnorm": lambda: ([rand(32, 256, dtype=bf16), rand(1, 256, seed=1) + 1.5], dict(eps=1e-5)),
    "softmax": lambda: ([rand(16, 256)], {}),
    "strided": lambda: ([rand(128, 128)], {}),
    "transpose": lambda: ([rand(128, 256)], {}),
    "values": lambda: ([rand(32, 256)], {}),
}


def backward_calls():
    """The calls of every backward kernel, derived from its forward's grad rules: forward inputs,
    outputs (of the `fwd` kernel when there is one) and cotangents by name, parameters by mapping."""
    calls = {}
    for name, kernel in ex.library.kernels.items():
        if not kernel.grad:
            continue
        tensors, params = FORWARD[name]()
        outs = getattr(tex, kernel.fwd or name)(*tensors, **params)
        outs = outs if isinstance(outs, tuple) else (outs,)
        n = 1 if not kernel.fwd else len(outs) - 1  # flash attention: o, then the log-sum-exp residual
        names = lambda p, k: [p] if k == 1 else [f"{p}{i}" for i in range(k)]  # noqa: E731
        env = dict(zip(kernel.inputs, tensors))
        env.update(zip(names("out", len(outs)), outs))
        env.update(zip(names("g", n), [rand(*o.shape, dtype=o.dtype, seed=9) for o in outs[:n]]))
        for entry in kernel.grad:
            calls[entry["kernel"]] = ([env[a] for a in entry["args"]],
                                      {b: params[f] for b, f in entry["params"].items() if f in params})
    return calls


def all_calls():
    calls = {name: make() for name, make in FORWARD.items()}
    calls.update(backward_calls())
    return calls


def test_every_example_kernel_has_a_call_here():
    assert set(all_calls()) == set(ex.library.kernels) - SPMD_KERNELS, \
        "add a call for a new example kernel to FORWARD"


def test_every_kernel_is_an_op_and_the_torch_examples_call_it():
    for name, kernel in ex.library.kernels.items():
        overload = getattr(NS, name).default
        assert getattr(tex, name).op is overload, name
        schema = overload._schema
        assert [a.name for a in schema.arguments if not a.kwarg_only] == kernel.inputs, name
        assert [a.name for a in schema.arguments if a.kwarg_only] == \
            sorted((p["name"] for p in kernel.params), key=lambda n: "default" in
                   next(p for p in kernel.params if p["name"] == n)) + ["target"], name
    assert str(NS.matmul.default._schema) == (
        "tpu_kernel_examples::matmul(Tensor x, Tensor y, *, int[] block=128, str? target=None) -> Tensor[]")
    # Tracing the torch wrapper records the op itself: they are one op.
    x, w = FORWARD["matmul"]()[0]
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a, b: tex.matmul(a, b))(x, w)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert NS.matmul.default in targets, gm.graph


def test_direct_op_calls_give_the_jax_ops_bits():
    tensors, params = FORWARD["rmsnorm"]()
    (out,) = NS.rmsnorm(*tensors, eps=1e-5)
    want = ex.rmsnorm(*(jnp.asarray(t.float().numpy()).astype(jnp.bfloat16 if t.dtype == bf16 else jnp.float32)
                        for t in tensors), eps=1e-5)
    np.testing.assert_array_equal(out.view(torch.int16).numpy(), np.asarray(want).view(np.int16))


def test_fake_tensors_get_rusts_shapes_without_running_the_kernel():
    before = ex.library.stats()["ffi_builds"]
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 512, 128, dtype=bf16) for _ in range(3))
        o, lse = NS.flash_attention_fwd(q, k, v)
        (c,) = NS.colsum(torch.empty(512, 128))
    assert (tuple(o.shape), o.dtype, tuple(lse.shape), lse.dtype) == ((2, 512, 128), bf16, (2, 512, 128), torch.float32)
    assert (tuple(c.shape), c.dtype) == ((8, 128), torch.float32)
    assert ex.library.stats()["ffi_builds"] == before  # nothing ran
    # meta tensors too, and Rust's verdict on a bad shape names the argument at trace time
    (m,) = NS.matmul(torch.empty(256, 128, dtype=bf16, device="meta"), torch.empty(128, 384, dtype=bf16, device="meta"))
    assert m.device.type == "meta" and tuple(m.shape) == (256, 384)
    with pytest.raises(tpu_kernel.KernelError, match=r"matmul\.rs:\d+"):
        NS.matmul(torch.empty(256, 200, dtype=bf16, device="meta"), torch.empty(200, 384, dtype=bf16, device="meta"))
    with pytest.raises(tpu_kernel.KernelError, match="float64"):
        NS.softmax(torch.empty(16, 256, dtype=torch.float64, device="meta"))


def test_torchax_tensors_through_the_op():
    tensors, params = FORWARD["matmul"]()
    plain = tex.matmul(*tensors)
    with ENV:
        xs = [ENV.to_xla(t) for t in tensors]
        (out,) = NS.matmul(*xs)
        assert isinstance(out, torchax.tensor.Tensor)
    np.testing.assert_array_equal(np.asarray(out.jax()).view(np.int16), plain.view(torch.int16).numpy())


def test_autograd_of_the_op_reaches_the_backward_ops():
    """`torch.ops...matmul` differentiates through matmul_dx / matmul_dw — ops, visible to a dispatch
    mode — and gives jax.grad's bits."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    x, w = (t.requires_grad_() for t in FORWARD["matmul"]()[0])
    with Log() as log:
        (y,) = NS.matmul(x, w)
        y.float().sum().backward()
    assert {NS.matmul.default, NS.matmul_dx.default, NS.matmul_dw.default} <= set(log.ops)
    xa, wa = (jnp.asarray(t.detach().float().numpy()).astype(jnp.bfloat16) for t in (x, w))
    gx, gw = jax.grad(lambda a, b: ex.matmul(a, b).astype(jnp.float32).sum(), argnums=(0, 1))(xa, wa)
    np.testing.assert_array_equal(x.grad.view(torch.int16).numpy(), np.asarray(gx).view(np.int16))
    np.testing.assert_array_equal(w.grad.view(torch.int16).numpy(), np.asarray(gw).view(np.int16))


def test_a_kernel_without_backward_kernels_says_so_when_differentiated():
    (y,) = NS.softmax(rand(16, 256).requires_grad_())
    with pytest.raises(tpu_kernel.KernelError, match="softmax.*declares no backward kernels"):
        y.sum().backward()


def test_a_library_loaded_later_gets_its_ops(user_crate):
    ns = getattr(torch.ops, f"tpu_kernel_{user_crate.name}")
    x = rand(16, 128).requires_grad_()
    (y,) = ns.scale(x, factor=3.0)
    y.sum().backward()
    torch.testing.assert_close(y, 3 * x.detach())
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    assert tkt.ops(user_crate).scale.op is ns.scale.default


@pytest.fixture
def torchax_rng_state_fixed(monkeypatch):
    """torchax 0.0.13 registers the `jax` device module with `set_rng_state(new_state, device)`, a
    required `device` torch's `freeze_rng_state` (used by opcheck) does not pass; its body is `pass`."""
    import torchax.device_module as dm
    monkeypatch.setattr(dm, "set_rng_state", lambda new_state, device=None: None)


# The SPMD examples run per device inside jax.shard_map: called alone, outside one, they are refused.
@pytest.mark.parametrize("name", sorted(set(ex.library.kernels) - SPMD_KERNELS))
def test_opcheck(name, torchax_rng_state_fixed):
    tensors, params = all_calls()[name]
    kernel = ex.library.kernels[name]
    differentiable = kernel.grad or any(k.fwd == name for k in ex.library.kernels.values())
    if differentiable:  # the float inputs require grad, so autograd is checked too
        tensors = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    kwargs = tkt._ops.register(ex.library)[name].op_kwargs(params)
    torch.library.opcheck(getattr(NS, name).default, tuple(tensors), kwargs)


# -- layers over any library (item 5)

def test_layers_take_the_kernel_op_to_use():
    lin_default = tkt.Linear(128, 256)
    assert lin_default.kernel is tex.matmul and tkt.RMSNorm(128).kernel is tex.rmsnorm
    assert tkt.Attention().kernel is tex.flash_attention
    # any library's op, through tkt.ops(library), or a tpu_kernel.Kernel (made its op)
    ops = tkt.ops(ex.library)
    norm = tkt.RMSNorm(256, kernel=ops.rmsnorm)
    lin = tkt.Linear(256, 128, kernel=ex.matmul)
    assert norm.kernel is ops.rmsnorm and lin.kernel.op is NS.matmul.default
    assert "kernel=examples.matmul" in repr(lin)
    x = rand(2, 64, 256, dtype=bf16)
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a: lin(norm(a)))(x)
    assert {n.target for n in gm.graph.nodes if n.op == "call_function"} >= {NS.rmsnorm.default, NS.matmul.default}
    with pytest.raises(tpu_kernel.KernelError, match="kernel=.* is not a tpu_kernel torch op") as e:
        tkt.Linear(256, 128, kernel=torch.matmul)
    assert e.value.argument == "kernel"


def test_a_layer_runs_another_librarys_op(user_crate):
    """A layer's kernel is only an op with the layer's signature: a user library's op runs in one (here
    `scale` stands in for RMSNorm's op: rows × factor, the weight ignored by a wrapper op)."""
    scale = tkt.ops(user_crate).scale

    def rows_times_two(x, w, *, eps, block_rows):  # RMSNorm's call, answered by the user crate's kernel
        return scale(x, factor=2.0)
    rows_times_two.kernel = scale.kernel
    norm = tkt.RMSNorm(128, kernel=rows_times_two)
    x = rand(2, 8, 128)
    torch.testing.assert_close(norm(x), 2 * x)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_layer_matches_scaled_dot_product_attention(causal):
    q, k, v = (rand(2, 2, 256, 128, dtype=bf16, seed=s) for s in range(3))
    out = tkt.Attention(causal=causal)(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert out.dtype == bf16 and out.shape == q.shape
    err = (out.float() - ref).abs().max().item()
    assert err <= 0.02 * ref.abs().max().item(), err
    with pytest.raises(tpu_kernel.KernelError, match=r"q must be \[batch, heads, seq, head_dim\]") as e:
        tkt.Attention()(q[0], k, v)
    assert e.value.argument == "q"


def test_eager_flash_attention_grads_run_the_fwd_kernel_once_and_no_plain_forward():
    """With inputs requiring grad the wrapper runs flash_attention_fwd (outputs and residuals) and the
    backward reads its residuals: no recomputation. The op itself, differentiated directly, recomputes
    them — same gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    tensors, params = FORWARD["flash_attention"]()
    a = [t.clone().requires_grad_() for t in tensors]
    with Log() as log:
        o = tex.flash_attention(*a, **params)
        o.float().sum().backward()
    ours = [op for op in log.ops if op.namespace == "tpu_kernel_examples"]
    assert ours == [NS.flash_attention_fwd.default, NS.flash_attention_dkv.default, NS.flash_attention_dq.default] \
        or ours == [NS.flash_attention_fwd.default, NS.flash_attention_dq.default, NS.flash_attention_dkv.default], ours
    b = [t.clone().requires_grad_() for t in tensors]
    (o2,) = NS.flash_attention(*b, **params)
    o2.float().sum().backward()
    assert torch.equal(o, o2)
    for x, y in zip(a, b):
        assert torch.equal(x.grad, y.grad)


def test_an_aliased_input_is_a_mutated_argument_the_op_writes():
    """`inplace_scale` aliases its output to x (`#[export(mutates(x))]`): the op's schema marks x
    mutated (`Tensor(a!) x`) and returns nothing; it writes x — CPU and torchax tensors alike — and
    `tex.inplace_scale(x)` returns x; opcheck (above) holds the declaration to what the op does."""
    assert str(NS.inplace_scale.default._schema) == (
        "tpu_kernel_examples::inplace_scale(Tensor(a!) x, *, int bm=128, str? target=None) -> ()")
    assert ex.library.kernels["inplace_scale"].mutates == ["x"]
    assert ex.library.kernels["ragged_paged_attention_launch"].mutates == ["q", "kv_cache"]
    assert all(not k.mutates for n, k in ex.library.kernels.items()
               if n not in ("inplace_scale", "ragged_paged_attention_launch"))
    x = rand(128, 128)
    want = x * 3
    out = tex.inplace_scale(x)
    assert out is x and torch.equal(x, want)
    assert NS.inplace_scale(x) is None and torch.equal(x, want * 3)
    x2 = rand(128, 128, seed=2)
    want = x2 * 3
    with ENV:
        xt = ENV.to_xla(x2)
        assert tex.inplace_scale(xt) is xt
        got = xt.cpu()
    assert torch.equal(got, want)

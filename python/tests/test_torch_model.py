"""A small torch model end to end — an MLP block (RMSNorm → Linear → GELU → Linear, bf16 weights) —
run as plain torch, as torchax with jnp ops, and as torchax with our kernels; then with the weights
sharded by NamedSharding over a 2×2 mesh of CPU devices and our kernels in shard_map. Same outputs."""
import copy

import jax
import numpy as np
import pytest
import torch
import torchax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tpu_kernel.torch as tkt

ENV = torchax.default_env()
DIM, HIDDEN, TOKENS = 256, 512, (2, 128)  # 256 rows: 128 per data shard, a matmul block


class TorchMLP(torch.nn.Module):
    """The reference: plain torch ops only."""

    def __init__(self, dim=DIM, hidden=HIDDEN, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.norm_weight = torch.nn.Parameter(torch.ones(dim))
        self.w1 = torch.nn.Parameter(torch.zeros(dim, hidden, dtype=torch.bfloat16))
        self.w2 = torch.nn.Parameter(torch.zeros(hidden, dim, dtype=torch.bfloat16))

    def forward(self, x):
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight).to(torch.bfloat16)
        h = torch.nn.functional.gelu(h @ self.w1)
        return h @ self.w2


class KernelMLP(torch.nn.Module):
    """The same block on tpu_kernel.torch layers; with a mesh, tensor-parallel (column then row)."""

    def __init__(self, dim=DIM, hidden=HIDDEN, eps=1e-6, mesh=None):
        super().__init__()
        par = dict(mesh=mesh) if mesh is not None else {}
        self.norm = tkt.RMSNorm(dim, eps=eps, **par)
        self.up = tkt.Linear(dim, hidden, **par, **({"parallel": "column"} if mesh is not None else {}))
        self.down = tkt.Linear(hidden, dim, **par, **({"parallel": "row"} if mesh is not None else {}))

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    def load_from(self, ref: TorchMLP):
        with torch.no_grad():
            self.norm.weight.copy_(ref.norm_weight)
            self.up.weight.copy_(ref.w1)
            self.down.weight.copy_(ref.w2)
        return self


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    ref = TorchMLP()
    with torch.no_grad():
        ref.norm_weight.copy_(torch.rand(DIM) + 0.5)
        ref.w1.copy_((torch.randn(DIM, HIDDEN) / DIM ** 0.5).to(torch.bfloat16))
        ref.w2.copy_((torch.randn(HIDDEN, DIM) / HIDDEN ** 0.5).to(torch.bfloat16))
    x = torch.randn(*TOKENS, DIM).to(torch.bfloat16)
    return ref, x


def as_cpu(t):
    return tkt._jax_to_cpu(t.jax()) if tkt._is_torchax(t) else t.detach()


def assert_close(ours, ref, what):
    ours, ref = as_cpu(ours).float(), as_cpu(ref).float()
    assert ours.shape == ref.shape, what
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= 0.03 * scale, f"{what}: max error {err} vs output scale {scale}"  # a few bf16 ulps


def test_three_ways_on_cpu_agree(model_and_input):
    ref, x = model_and_input
    plain = ref(x)
    with ENV:
        jnp_model = copy.deepcopy(ref).to("jax")
        xt = ENV.to_xla(x)
        via_jnp = jnp_model(xt)
        ours_model = KernelMLP().load_from(ref).to("jax")
        via_kernels = ours_model(xt)
        jitted = torchax.interop.jax_jit(lambda a: ours_model(a))(xt)
    assert isinstance(via_jnp, torchax.tensor.Tensor) and isinstance(via_kernels, torchax.tensor.Tensor)
    assert_close(via_jnp, plain, "torchax (jnp ops) vs torch")
    assert_close(via_kernels, plain, "torchax (our kernels) vs torch")
    assert_close(via_kernels, via_jnp, "our kernels vs jnp ops")
    # (not bit-equal to eager: under jit XLA fuses the GELU between the kernels and rounds differently)
    assert_close(jitted, plain, "torchax (our kernels) under jax_jit vs torch")
    # The kernels path really runs our kernels: its jitted program calls our FFI target three times.
    text = jax.jit(torchax.interop.jax_view(lambda a: ours_model(a))).lower(xt.jax()).as_text()
    assert text.count("tpu_kernel_examples") == 3


def test_sharded_over_a_2x2_mesh_agrees(model_and_input):
    ref, x = model_and_input
    devices = jax.devices("cpu")
    assert len(devices) == 8, "conftest sets --xla_force_host_platform_device_count=8"
    mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "y"))
    with ENV:
        model = KernelMLP(mesh=mesh).load_from(ref).to("jax")
        model.norm.weight.apply_jax_(jax.device_put, NamedSharding(mesh, P(None)))
        for lin in (model.up, model.down):
            lin.weight.apply_jax_(jax.device_put, NamedSharding(mesh, lin.weight_spec()))
        xt = ENV.to_xla(x)
        xt.apply_jax_(jax.device_put, NamedSharding(mesh, P("x", None, None)))
        out = model(xt)
    assert model.up.weight.jax().sharding.spec == P(None, "y")
    assert model.down.weight.jax().sharding.spec == P("y", None)
    sharding = out.jax().sharding
    assert isinstance(sharding, NamedSharding) and sharding.mesh.shape == {"x": 2, "y": 2}
    assert_close(out, ref(x), "sharded (our kernels in shard_map) vs torch")
    with ENV:
        unsharded = KernelMLP().load_from(ref).to("jax")(ENV.to_xla(x))
    assert_close(out, unsharded, "sharded vs unsharded kernels")

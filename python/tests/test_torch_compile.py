"""torch.compile and torch.export over our ops (issue 24, items 3 and 4), on CPU tensors: the README's MLP
block (RMSNorm → Linear → GELU → Linear) and an attention block on `flash_attention` compile with
`fullgraph=True` and zero graph breaks, give eager's numbers forward and backward, and
`torch.export.export` captures them with our ops as graph nodes; the exported program runs and gives
eager's numbers, also after `torch.export.save` / `load`."""
import pytest
import torch

import tpu_kernel.torch as tkt

NS = torch.ops.tpu_kernel_examples
DIM, HIDDEN = 256, 512


class MLP(torch.nn.Module):
    """The README's block."""

    def __init__(self):
        super().__init__()
        self.norm, self.up = tkt.RMSNorm(DIM), tkt.Linear(DIM, HIDDEN)
        self.down = tkt.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class AttentionBlock(torch.nn.Module):
    """x → RMSNorm → q, k, v projections → causal flash attention over 2 heads of 128 → output projection,
    residual."""

    def __init__(self, heads=2, head_dim=128):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.norm = tkt.RMSNorm(width)
        self.qkv = tkt.Linear(width, 3 * width)
        self.attn = tkt.Attention(causal=True)
        self.out = tkt.Linear(width, width)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        o = self.attn(q.contiguous(), k.contiguous(), v.contiguous())
        return x + self.out(o.transpose(1, 2).reshape(b, s, -1))


def make(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model = MLP()
        with torch.no_grad():
            model.norm.weight.copy_(torch.rand(DIM) + 0.5)
            model.up.weight.copy_((torch.randn(DIM, HIDDEN) / DIM ** 0.5).to(torch.bfloat16))
            model.down.weight.copy_((torch.randn(HIDDEN, DIM) / HIDDEN ** 0.5).to(torch.bfloat16))
        x = torch.randn(2, 128, DIM).to(torch.bfloat16)
    else:
        model = AttentionBlock()
        x = torch.randn(1, 256, 256).to(torch.bfloat16)
    return model, x


def kernels_in(graph: torch.fx.Graph) -> set[str]:
    return {n.target.name() for n in graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target.namespace == "tpu_kernel_examples"}


def assert_close(ours, ref, what, rel=0.02):
    ours, ref = ours.detach().float(), ref.detach().float()
    assert ours.shape == ref.shape, what
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * scale + 1e-6, f"{what}: max error {err} vs scale {scale}"


def run(model, x):
    """Output and the gradients of x and of every parameter, for a fixed loss."""
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out.float() ** 2).mean().backward()
    return out, [x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_torch_compile_fullgraph_no_graph_breaks_eager_numbers(kind):
    model, x = make(kind)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    want = {"mlp": {"rmsnorm", "matmul"}, "attention": {"rmsnorm", "matmul", "flash_attention"}}[kind]
    assert {n.split("::")[1].split(".")[0] for g in explain.graphs for n in kernels_in(g.graph)} == want

    eager_out, eager_grads = run(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    out, grads = run(compiled, x)
    assert_close(out, eager_out, f"{kind}: compiled output")
    assert len(grads) == len(eager_grads) and all(g is not None for g in grads)
    for i, (g, e) in enumerate(zip(grads, eager_grads)):
        assert_close(g, e, f"{kind}: compiled gradient {i}")


def test_the_compiled_backward_runs_the_rust_backward_kernels():
    """AOTAutograd's backward graph holds the backward ops (matmul_dx / matmul_dw / rmsnorm_bwd)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from functorch.compile import make_boxed_func

    graphs = []

    def backend(gm, example_inputs):
        def keep(g, _):
            graphs.append(g.graph)
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    model, x = make("mlp")
    torch._dynamo.reset()
    run(torch.compile(model, backend=backend, fullgraph=True), x)
    assert len(graphs) == 2
    fw, bw = (kernels_in(g) for g in graphs)
    assert fw == {"tpu_kernel_examples::rmsnorm", "tpu_kernel_examples::matmul"}
    assert bw == {"tpu_kernel_examples::rmsnorm_bwd", "tpu_kernel_examples::matmul_dx",
                  "tpu_kernel_examples::matmul_dw"}


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_torch_export_captures_our_ops_and_runs(kind):
    model, x = make(kind)
    with torch.no_grad():
        eager = model(x)
        exported = torch.export.export(model, (x,))
    want = {"mlp": {"rmsnorm", "matmul"}, "attention": {"rmsnorm", "matmul", "flash_attention"}}[kind]
    assert {n.split("::")[1] for n in kernels_in(exported.graph)} == {f"{k}" for k in want}
    with torch.no_grad():
        out = exported.module()(x)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)  # the same ops on the same inputs: same bits
    # saved and loaded (a .pt2 archive): our ops are named in it and found again by name
    import io
    buf = io.BytesIO()
    torch.export.save(exported, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    assert kernels_in(loaded.graph) == kernels_in(exported.graph)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module()(x), eager, rtol=0, atol=0)

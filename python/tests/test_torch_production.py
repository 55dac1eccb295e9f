"""The production kernels as torch ops (issue 12): the README's one-line torch calls of the quantized and
grouped matmuls and of paged attention run on plain CPU tensors and on torchax tensors under `jax_jit`,
and agree with the same math written in plain torch (flash attention's torch checks, autograd included,
are in test_flash_attention.py)."""
import numpy as np
import torch
import torchax

import tpu_kernel.torch.examples as tex

ENV = torchax.default_env()


def rand(*shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def int8(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def close(what, ours, ref, rel=1e-2):
    ours, ref = ours.detach().float(), ref.detach().float()
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err} vs scale {scale}"


def test_quantized_matmul():
    x, w = rand(256, 512, seed=0), int8(512, 256, seed=1)
    scale = torch.rand(1, 256, generator=torch.Generator().manual_seed(2)) / 64
    y = tex.quantized_matmul(x, w, scale)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (256, 256)
    close("quantized_matmul", y, (x.float() @ w.float()) * scale)


def test_quantized_matmul_w8a8():
    x, w = int8(256, 512, seed=3), int8(512, 256, seed=4)
    xs = torch.rand(256, 1, generator=torch.Generator().manual_seed(5)) / 64
    ws = torch.rand(1, 256, generator=torch.Generator().manual_seed(6)) / 64
    y = tex.quantized_matmul_w8a8(x, xs, w, ws)
    want = (x.int() @ w.int()).float() * xs * ws  # exact i32 accumulation, then the scales
    close("quantized_matmul_w8a8", y, want)


def test_grouped_matmul_with_group_metadata():
    sizes = torch.tensor([100, 0, 290, 122], dtype=torch.int32)  # tokens per expert, sorted; one empty
    lhs, rhs = rand(512, 512, seed=7), rand(4, 512, 512, seed=8)
    y = tex.grouped_matmul(*tex.group_metadata(sizes, lhs.shape[0]), lhs, rhs)
    want = torch.cat([lhs[s:e].float() @ rhs[g].float()
                      for g, (s, e) in enumerate(zip([0, *sizes.cumsum(0)[:-1].tolist()], sizes.cumsum(0).tolist()))])
    close("grouped_matmul", y, want)
    # the same on torchax tensors, inside jax_jit
    with ENV:
        args = [ENV.to_xla(t) for t in (*tex.group_metadata(sizes, 512), lhs, rhs)]
        jitted = torchax.interop.jax_jit(lambda *a: tex.grouped_matmul(*a))(*args)
        assert isinstance(jitted, torchax.tensor.Tensor)
        got = np.asarray(jitted.jax().astype(np.float32))
    np.testing.assert_array_equal(got, y.float().numpy())


def paged_inputs():
    """4 sequences of 1 token, every page (4 of 16 tokens), none and 17 tokens; 8 query heads over 1 kv
    head; a shuffled pool of 16 pages."""
    lengths = torch.tensor([1, 64, 0, 17], dtype=torch.int32)
    page_indices = torch.randperm(16, generator=torch.Generator().manual_seed(20)).to(torch.int32).reshape(4, 4)
    q = rand(4, 8, 128, seed=21) / 8
    return lengths, page_indices, q, rand(1, 16, 16, 128, seed=22), rand(1, 16, 16, 128, seed=23)


def rpa_inputs():
    """Ragged paged attention's arguments by name, as torch tensors (bf16 arrays, i32 tables): a decode,
    a prefill chunk and a mixed sequence, NaN wherever the kernel must not read."""
    import jax.numpy as jnp
    import tpu_inference_rpa as tir
    inp = tir.make_inputs(seqs=3, q_lens=[1, 5, 20], kv_lens=[10, 30, 60], heads=8, kv_heads=2)
    return {n: torch.from_numpy(np.asarray(inp[n].astype(jnp.float32))).to(torch.bfloat16)
            if inp[n].dtype == jnp.bfloat16 else torch.from_numpy(np.asarray(inp[n]))
            for n in tir.ARRAY_ORDER}


def test_paged_attention_matches_attention_over_gathered_pages():
    lengths, page_indices, q, k_pages, v_pages = paged_inputs()
    o = tex.paged_attention(lengths, page_indices, q, k_pages, v_pages, pages_per_compute_block=2)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape
    kv_heads, batch, d = k_pages.shape[0], q.shape[0], q.shape[-1]
    k = k_pages[:, page_indices.long()].reshape(kv_heads, batch, -1, d).float()  # the gather
    v = v_pages[:, page_indices.long()].reshape(kv_heads, batch, -1, d).float()
    s = torch.einsum("bhgd,hbtd->bhgt", q.reshape(batch, kv_heads, -1, d).float(), k)
    valid = torch.arange(s.shape[-1]) < lengths.long()[:, None, None, None]
    p = torch.softmax(s.masked_fill(~valid, -torch.inf), dim=-1).nan_to_num(0.0)  # an empty sequence: zeros
    close("paged_attention", o, torch.einsum("bhgt,hbtd->bhgd", p, v).reshape(q.shape))
    assert not o[2].float().any()
    with ENV:  # (inputs made outside: under the env, torch.randperm is torchax's, another permutation)
        args = [ENV.to_xla(t) for t in (lengths, page_indices, q, k_pages, v_pages)]
        jitted = torchax.interop.jax_jit(lambda *a: tex.paged_attention(*a, pages_per_compute_block=2))(*args)
        got = np.asarray(jitted.jax().astype(np.float32))
    np.testing.assert_array_equal(got, o.float().numpy())


# -- the README's table of production kernels: every one-line call runs as written

def readme_calls():
    """(kernel, JAX line, torch line) of each row of the README's "Production kernels" table."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = text.split("## Production kernels", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and not cells[0].startswith("---"):
            code = [re.fullmatch(r"`(.*)`", c).group(1) for c in cells[1:]]
            rows.append((re.match(r"`(\w+)`", cells[0]).group(1), *code))
    return rows


def test_the_readme_lists_every_production_kernel_and_its_calls_run():
    import jax.numpy as jnp
    import tpu_kernel.examples as ex
    rows = readme_calls()
    assert {r[0] for r in rows} >= {"flash_attention", "quantized_matmul", "quantized_matmul_w8a8",
                                    "grouped_matmul", "paged_attention"}, rows
    q, k, v = (rand(2, 512, 128, seed=s) for s in (10, 11, 12))
    torch_env = {
        "tex": tex, "q": q.requires_grad_(), "k": k.requires_grad_(), "v": v.requires_grad_(),
        "x": rand(256, 512, seed=13), "w": int8(512, 256, seed=14), "scale": torch.full((1, 256), 0.01),
        "x_scale": torch.full((256, 1), 0.01), "w_scale": torch.full((1, 256), 0.01),
        "sizes": torch.tensor([100, 0, 290, 122], dtype=torch.int32), "m": 512,
        "lhs": rand(512, 512, seed=15), "rhs": rand(4, 512, 512, seed=16)}
    for name, jax_line, torch_line in rows:
        env = dict(torch_env)
        if name == "quantized_matmul_w8a8":
            env["x"] = int8(256, 512, seed=17)
        if name == "paged_attention":
            env.update(zip(("lengths", "page_indices", "q", "k_pages", "v_pages"), paged_inputs()))
        if name == "ragged_paged_attention":
            env.update(rpa_inputs(), s=0.125)
        if name == "all_gather_matmul":  # x by rows, y by columns over the "model" axis of 4 CPU devices
            import jax
            from jax.sharding import Mesh
            env.update(x=rand(128, 256, seed=18), y=rand(256, 512, seed=19),
                       mesh=Mesh(np.array(jax.devices("cpu")[:4]), ("model",)))
        exec(torch_line, env)  # noqa: S102 - the README's own line
        jenv = {"ex": ex, **{n: jnp.asarray(t.detach().float().numpy()).astype(
            {torch.bfloat16: jnp.bfloat16, torch.int8: jnp.int8, torch.int32: jnp.int32}.get(t.dtype, jnp.float32))
            if isinstance(t, torch.Tensor) else t for n, t in env.items() if n not in ("tex", "__builtins__")}}
        exec(jax_line, jenv)  # noqa: S102
        out = [n for n in ("o", "y", "out") if n in env][0]
        np.testing.assert_array_equal(np.asarray(jenv[out].astype(jnp.float32)), env[out].detach().float().numpy(),
                                      err_msg=f"{name}: the README's JAX and torch lines disagree")
    assert q.grad is not None  # flash attention's torch line runs backward

"""`tpu_kernel.examples.ragged_paged_attention` (examples/ragged_paged_attention.rs, issue 23) under
`jax.jit` on CPU (our interpreter through XLA FFI) against tpu-inference 0.32.0's own reference,
`ref_ragged_paged_attention`, with tpu-inference's tolerances (`atol = rtol = 0.15` for a 32-bit
cache, 0.2 for bf16) and the updated cache bit for bit. Every input the kernel must not read is NaN
(tokens past the last sequence, pages no sequence owns, cache rows past a sequence's old tokens, the
table's unused slots point at a NaN page): a read of one shows up as NaN in the output or the cache.

Cases: decode only, prefill only, mixed, ragged lengths from 1 token to full, sliding window, soft
cap, GQA 1/4/8 (and 7, padded), pages of 16/64/128 tokens, head_dim 128 and 64 (padded as
tpu-inference pads it), f32, bf16 and fp8 (float8_e4m3fn, float8_e5m2, with q/k/v scales) caches, block
sizes that are not the defaults, non-causal, the kv mask skipped. Small shapes: the
CI's cost. Also: the options we do not support are errors naming the argument, and the torch face.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpu_inference_rpa as tir
import tpu_kernel.examples as ex
from tpu_kernel import KernelError

MOD = tir.kernel_module()
REF_OPTIONS = ("use_causal_mask", "skip_kv_mask", "sm_scale", "sliding_window", "soft_cap", "mask_value",
               "q_scale", "k_scale", "v_scale")


def run_both(cfg, **options):
    inp = tir.make_inputs(**cfg)
    args = tir.positional(inp)
    ref_o, ref_cache = MOD.ref_ragged_paged_attention(*args, **{k: v for k, v in options.items()
                                                                 if k in REF_OPTIONS})
    out, cache = jax.jit(lambda *a: ex.ragged_paged_attention(*a, **options))(*args)
    return inp, (out, cache), (ref_o, ref_cache)


def check(cfg, **options):
    inp, (out, cache), (ref_o, ref_cache) = run_both(cfg, **options)
    n = int(inp["cu_q_lens"][-1])
    assert out.shape == inp["queries"].shape and out.dtype == inp["queries"].dtype
    assert cache.shape == inp["kv_cache"].shape and cache.dtype == inp["kv_cache"].dtype
    ours = np.asarray(out[:n], np.float32)
    ref = np.asarray(ref_o, np.float32)
    assert not np.isnan(ours).any(), "a NaN input was read"
    tol = 0.15 if inp["kv_cache"].dtype == jnp.float32 else 0.2
    np.testing.assert_allclose(ours, ref, atol=tol, rtol=tol)
    bits = {4: np.uint32, 2: np.uint16, 1: np.uint8}[cache.dtype.itemsize]
    got, want = np.asarray(cache).view(bits), np.asarray(ref_cache).view(bits)
    # Bit for bit, but for NaN payloads: XLA:CPU rewrites float8_e5m2 NaNs the reference copies
    # (0x7E -> 0x7F); ours leaves every byte it does not write as it was.
    both_nan = np.isnan(np.asarray(cache, np.float32)) & np.isnan(np.asarray(ref_cache, np.float32))
    assert np.array_equal(got[~both_nan], want[~both_nan]), f"{(got != want).sum()} cache elements differ"
    return ours, ref


BASE = dict(heads=8, kv_heads=2, page_size=16, pages_per_seq=8)


@pytest.mark.parametrize("name, cfg, options", [
    ("decode only", dict(seqs=4, q_lens=[1, 1, 1, 1], kv_lens=[1, 17, 64, 128], **BASE), {}),
    ("prefill only", dict(seqs=3, q_lens=[16, 40, 5], kv_lens=[16, 90, 128], distribution=(0, 3, 3), **BASE),
     dict(chunk_prefill_size=16)),
    ("mixed", dict(seqs=4, q_lens=[1, 1, 5, 20], kv_lens=[1, 40, 30, 70], **BASE), {}),
    ("ragged 1 token to full", dict(seqs=5, q_lens=[1, 2, 1, 33, 128], kv_lens=[1, 2, 100, 33, 128],
                                    distribution=(0, 0, 5), **BASE), {}),
    ("sliding window", dict(seqs=3, q_lens=[1, 37, 9], kv_lens=[120, 100, 50], **BASE),
     dict(sliding_window=24)),
    ("soft cap and sm_scale", dict(seqs=3, q_lens=[1, 12, 30], kv_lens=[77, 12, 31], **BASE),
     dict(soft_cap=5.0, sm_scale=0.25)),
    ("MHA (GQA 1)", dict(seqs=3, q_lens=[1, 7, 20], kv_lens=[9, 7, 60], heads=4, kv_heads=4, page_size=16,
                         pages_per_seq=4), {}),
    ("GQA 8", dict(seqs=3, q_lens=[1, 7, 20], kv_lens=[9, 70, 60], heads=8, kv_heads=1, page_size=16,
                   pages_per_seq=8), {}),
    ("GQA 7 (padded to 8)", dict(seqs=2, q_lens=[1, 10], kv_lens=[30, 50], heads=7, kv_heads=1, page_size=16,
                                 pages_per_seq=4), {}),
    ("pages of 64, odd blocks", dict(seqs=3, q_lens=[1, 64, 9], kv_lens=[300, 200, 128], heads=8, kv_heads=2,
                                     page_size=64, pages_per_seq=6),
     dict(m_block_sizes=(24, 192, 8, 64), d_block_sizes=(1, 192, 1, 64))),
    ("pages of 128", dict(seqs=3, q_lens=[1, 100, 9], kv_lens=[256, 256, 128], heads=4, kv_heads=2,
                          page_size=128, pages_per_seq=2), dict(sliding_window=50)),
    ("head_dim 64", dict(seqs=3, q_lens=[1, 3, 20], kv_lens=[40, 3, 33], head_dim=64, **BASE), {}),
    ("f32 cache", dict(seqs=3, q_lens=[1, 37, 70], kv_lens=[5, 100, 128], heads=4, kv_heads=2, page_size=16,
                       pages_per_seq=8, dtype="float32"), dict(sliding_window=40, soft_cap=30.0)),
    ("q, k, v scales and a mask value", dict(seqs=3, q_lens=[1, 9, 20], kv_lens=[33, 9, 70], **BASE),
     dict(q_scale=0.5, k_scale=1.5, v_scale=0.75, mask_value=-1e30)),
    ("fp8 e4m3fn cache, k and v scales", dict(seqs=3, q_lens=[1, 9, 20], kv_lens=[33, 9, 70], dtype="float8_e4m3fn",
                                              q_dtype="bfloat16", **BASE), dict(k_scale=0.5, v_scale=2.0)),
    ("fp8 e5m2 cache, q scale, GQA 1", dict(seqs=3, q_lens=[1, 7, 20], kv_lens=[9, 7, 60], heads=4, kv_heads=4,
                                            page_size=16, pages_per_seq=4, dtype="float8_e5m2", q_dtype="bfloat16"),
     dict(q_scale=0.25)),
    ("not causal", dict(seqs=3, q_lens=[1, 9, 20], kv_lens=[33, 9, 70], **BASE), dict(use_causal_mask=False)),
    ("not causal, kv mask skipped", dict(seqs=3, q_lens=[1, 16, 20], kv_lens=[32, 16, 64], **BASE),
     dict(use_causal_mask=False, skip_kv_mask=True, m_block_sizes=(16, 32, 16, 16), d_block_sizes=(1, 32, 1, 16))),
])
def test_matches_tpu_inference_reference(name, cfg, options):
    check(cfg, **options)


def test_update_kv_cache_false_reads_the_cache_and_writes_nothing():
    """KV sharing (`update_kv_cache=False`): the new tokens are already in the cache; the kernel reads
    everything from it and leaves it as it was."""
    cfg = dict(seqs=3, q_lens=[1, 5, 20], kv_lens=[10, 30, 60], **BASE)
    inp = tir.make_inputs(**cfg)
    args = tir.positional(inp)
    _, filled = MOD.ref_ragged_paged_attention(*args)
    args[3] = filled
    want, _ = MOD.ref_ragged_paged_attention(*args)
    out, cache = jax.jit(lambda *a: ex.ragged_paged_attention(*a, update_kv_cache=False))(*args)
    n = int(inp["cu_q_lens"][-1])
    np.testing.assert_allclose(np.asarray(out[:n], np.float32), np.asarray(want, np.float32), atol=0.2, rtol=0.2)
    assert np.array_equal(np.asarray(cache).view(np.uint16), np.asarray(filled).view(np.uint16))


def test_a_nan_in_an_owned_cache_row_reaches_the_output():
    """The NaN checks above can fail: a NaN in a row the sequence owns shows in its output."""
    cfg = dict(seqs=2, q_lens=[1, 4], kv_lens=[20, 30], **BASE)
    inp = tir.make_inputs(**cfg)
    page = int(inp["page_indices"][0])
    inp["kv_cache"] = inp["kv_cache"].at[page, 3].set(jnp.nan)
    out, _ = jax.jit(ex.ragged_paged_attention)(*tir.positional(inp))
    assert np.isnan(np.asarray(out[0], np.float32)).all()
    assert not np.isnan(np.asarray(out[1:5], np.float32)).any()


@pytest.mark.parametrize("options, argument, needle", [
    (dict(out_dtype=jnp.bfloat16), "out_dtype", "accumulates in float32"),
    (dict(use_causal_mask=True, skip_kv_mask=True), "skip_kv_mask", "causal"),
    (dict(sliding_window=0), "sliding_window", "positive"),
    (dict(soft_cap=0.0), "soft_cap", "0.0"),
    (dict(m_block_sizes=(32, 40, 8, 16)), "m_block_sizes", "page_size"),
    (dict(m_block_sizes=(32, 64, 24, 16)), "m_block_sizes", "bq_csz 24 must divide bq_sz 32"),
    (dict(d_block_sizes=(1, 64, 1, 48)), "d_block_sizes", "bkv_csz"),
])
def test_unsupported_and_invalid_options_name_their_argument(options, argument, needle):
    cfg = dict(seqs=2, q_lens=[1, 4], kv_lens=[20, 30], **BASE)
    args = tir.positional(tir.make_inputs(**cfg))
    with pytest.raises(KernelError) as e:
        ex.ragged_paged_attention(*args, **options)
    assert e.value.argument == argument, e.value
    assert needle in str(e.value), e.value


def test_a_float16_cache_is_refused_naming_kv_cache():
    cfg = dict(seqs=2, q_lens=[1, 4], kv_lens=[20, 30], **BASE)
    inp = tir.make_inputs(**cfg)
    f16 = jnp.float16
    shape = MOD.get_kv_cache_shape(inp["kv_cache"].shape[0], 16, 2, 128, f16)
    args = [inp["queries"], inp["keys"].astype(f16), inp["values"].astype(f16), jnp.zeros(shape, f16),
            *tir.positional(inp)[4:]]
    with pytest.raises(KernelError) as e:
        ex.ragged_paged_attention(*args)
    assert e.value.argument == "kv_cache" and "not supported" in str(e.value), e.value


def test_default_block_sizes_follow_tpu_inference_per_generation():
    """Our defaults (Rust `default_blocks`, chosen by the launch's Target; a host function of the
    examples library) are tpu-inference's `get_default_block_sizes` for that generation."""
    T, Hq, Hkv, ps, pps, seqs = 64, 8, 2, 16, 8, 4
    for target, version in (("v5e", 5), ("v6e", 6), ("tpu7x", 7)):
        with tir.tpu_generation(MOD, version):
            for case in (MOD.RpaCase.DECODE, MOD.RpaCase.MIXED):
                theirs = MOD.get_default_block_sizes(jnp.bfloat16, jnp.bfloat16, Hq, Hkv, 128, ps, T, seqs, pps,
                                                     case=case)
                got = ex.library.host("rpa_default_block_sizes", target, case.name.lower(), "bf16",
                                      [Hq, Hkv, 128], [ps, pps, T])
                assert got == [theirs["bq_sz"], theirs["bkv_sz"], theirs["bq_csz"], theirs["bkv_csz"]], \
                    (target, case, got, theirs)


def test_the_cpu_default_query_blocks_give_the_bits_of_tpu_inferences():
    """Under the CPU lowering the default query blocks are tpu-inference's capped at 32 tokens (the
    FFI handler builds its launch for the CPU); tpu-inference's own defaults, passed explicitly, give
    the same bits: the attention of every written token and the updated cache."""
    cfg = dict(seqs=5, q_lens=[1, 2, 1, 33, 128], kv_lens=[1, 2, 100, 33, 128], distribution=(0, 0, 5), **BASE)
    inp = tir.make_inputs(**cfg)
    args = tir.positional(inp)
    tokens, heads, head_dim = inp["queries"].shape
    blocks = ex.library.host("rpa_default_block_sizes", "v5e", "mixed", "bf16", [heads, BASE["kv_heads"], head_dim],
                             [BASE["page_size"], BASE["pages_per_seq"], tokens])
    assert blocks[0] > 32, blocks  # the cap applies to this batch
    out, cache = jax.jit(ex.ragged_paged_attention)(*args)
    out_tpu, cache_tpu = jax.jit(lambda *a: ex.ragged_paged_attention(*a, m_block_sizes=blocks))(*args)
    n = int(inp["cu_q_lens"][-1])
    assert np.array_equal(np.asarray(out[:n]).view(np.uint16), np.asarray(out_tpu[:n]).view(np.uint16))
    assert np.array_equal(np.asarray(cache).view(np.uint16), np.asarray(cache_tpu).view(np.uint16))


def test_torch_cpu_tensors_match_the_jax_function():
    import torch
    import tpu_kernel.torch.examples as tex
    cfg = dict(seqs=3, q_lens=[1, 5, 20], kv_lens=[10, 30, 60], **BASE)
    inp = tir.make_inputs(**cfg)
    want_o, want_c = jax.jit(ex.ragged_paged_attention)(*tir.positional(inp))
    tensors = [torch.from_numpy(np.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a))
               for a in tir.positional(inp)]
    tensors = [t.to(torch.bfloat16) if i < 4 else t for i, t in enumerate(tensors)]
    out, cache = tex.ragged_paged_attention(*tensors)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and isinstance(cache, torch.Tensor)
    n = int(inp["cu_q_lens"][-1])
    assert np.array_equal(out[:n].float().numpy(), np.asarray(want_o[:n], np.float32))
    # (the NaN padding went through f32 on its way into torch: equal as values, not as payloads)
    assert np.array_equal(cache.float().numpy(), np.asarray(want_c, np.float32), equal_nan=True)


def test_torchax_tensors_match_the_jax_function():
    """On torchax tensors the torch face runs the JAX function inside torchax's environment."""
    import torch
    import torchax
    import tpu_kernel.torch.examples as tex
    env = torchax.default_env()
    cfg = dict(seqs=2, q_lens=[1, 6], kv_lens=[9, 30], **BASE)
    inp = tir.make_inputs(**cfg)
    args = tir.positional(inp)
    want_o, want_c = jax.jit(ex.ragged_paged_attention)(*args)
    tensors = [torch.from_numpy(np.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a))
               for a in args]
    tensors = [env.to_xla(t.to(torch.bfloat16) if i < 4 else t) for i, t in enumerate(tensors)]
    out, cache = tex.ragged_paged_attention(*tensors)
    n = int(inp["cu_q_lens"][-1])
    got_o = np.asarray(out.jax()[:n], np.float32)
    assert np.array_equal(got_o, np.asarray(want_o[:n], np.float32))
    assert np.array_equal(np.asarray(cache.jax(), np.float32), np.asarray(want_c, np.float32), equal_nan=True)

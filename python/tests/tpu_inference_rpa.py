"""tpu-inference's ragged paged attention v3 (`tpu_inference.kernels.ragged_paged_attention.v3.kernel`),
imported with jax alone, and the inputs the ragged-paged-attention tests share.

`import tpu_inference` needs vllm (its `__init__` imports `tpu_info` and a vllm logger); the kernel
modules do not. So the package is registered bare — a module whose `__path__` is the installed
package's folder — with a stub `tpu_inference.logger`, and its kernel module imported from it
(../../shared/TOOLCHAIN.md, "Measured 2026-12-01"). `scripts/setup.sh --python` installs the pinned
wheel (`pip install --no-deps tpu-inference==0.32.0`); without it the import fails loudly.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
import types

import numpy as np

VERSION = "0.32.0"


def _register_bare_package():
    if "tpu_inference" in sys.modules:
        return
    spec = importlib.util.find_spec("tpu_inference")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"tpu-inference is not installed: run `scripts/setup.sh --python` "
                          f"(pip install --no-deps tpu-inference=={VERSION})")
    pkg = types.ModuleType("tpu_inference")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["tpu_inference"] = pkg
    logger = types.ModuleType("tpu_inference.logger")
    logger.init_logger = logging.getLogger
    sys.modules["tpu_inference.logger"] = logger


def kernel_module():
    """tpu-inference's `v3/kernel.py` module (its `ragged_paged_attention`, `ref_ragged_paged_attention`,
    `get_kv_cache_shape`, `get_default_block_sizes`)."""
    _register_bare_package()
    from importlib.metadata import version
    assert version("tpu-inference") == VERSION, version("tpu-inference")
    return importlib.import_module("tpu_inference.kernels.ragged_paged_attention.v3.kernel")


@contextlib.contextmanager
def tpu_generation(module, generation: int):
    """tpu-inference's kernel traced as for TPU generation `generation` (it asks the device kind)."""
    old = module.get_tpu_version
    module.get_tpu_version = lambda: generation
    try:
        yield
    finally:
        module.get_tpu_version = old


def make_inputs(*, seqs, q_lens, kv_lens, heads, kv_heads, head_dim=128, page_size=16, pages_per_seq=8,
                total_pages=None, tokens=None, dtype="bfloat16", q_dtype=None, distribution=None, seed=0):
    """A call's inputs in tpu-inference's layout, with NaN wherever the kernel must not read: the new
    tokens past the last sequence, every cache page no sequence owns, every cache row past a
    sequence's `kv_len - q_len` old tokens (the new ones are written by the call), and the table's
    unused slots point at a NaN page. Sequences get shuffled pages from the pool."""
    import jax.numpy as jnp
    mod = kernel_module()
    rng = np.random.default_rng(seed)
    q_lens = np.asarray(q_lens, np.int32)
    kv_lens_a = np.asarray(kv_lens, np.int32)
    assert len(q_lens) == len(kv_lens_a) == seqs and (q_lens <= kv_lens_a).all() and (q_lens > 0).all()
    used = int(q_lens.sum())
    tokens = tokens or used + 3
    need = sum(-(-int(k) // page_size) for k in kv_lens_a)
    total_pages = total_pages or need + 5
    jdt = jnp.dtype(dtype)
    qdt = jnp.dtype(q_dtype or dtype)
    q = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    for a in (q, k, v):
        a[used:] = np.nan
    shape = mod.get_kv_cache_shape(total_pages, page_size, kv_heads, head_dim, jdt)
    cache = np.full(shape, np.nan, np.float32)
    pool = rng.permutation(total_pages)
    table = np.full(seqs * pages_per_seq, pool[-1], np.int32)  # unused slots: a page no one owns (NaN)
    nxt = 0
    for s in range(seqs):
        n = -(-int(kv_lens_a[s]) // page_size)
        assert n <= pages_per_seq
        table[s * pages_per_seq:s * pages_per_seq + n] = pool[nxt:nxt + n]
        nxt += n
        old = int(kv_lens_a[s] - q_lens[s])
        flat = cache[table[s * pages_per_seq:s * pages_per_seq + n]].reshape(n * page_size, *shape[2:])
        flat[:old] = rng.standard_normal(flat[:old].shape)
        # padding heads of an odd head count stay NaN in tpu-inference's layout too: only real ones
        cache[table[s * pages_per_seq:s * pages_per_seq + n]] = flat.reshape(n, page_size, *shape[2:])
    assert nxt < total_pages, "the NaN page must be one no sequence owns"
    cu = np.zeros(seqs + 1, np.int32)
    cu[1:] = np.cumsum(q_lens)
    if distribution is None:
        d = int((q_lens == 1).sum())
        assert (q_lens[:d] == 1).all(), "decode sequences come first"
        distribution = (d, d, seqs)
    return dict(
        queries=jnp.asarray(q).astype(qdt), keys=jnp.asarray(k).astype(jdt), values=jnp.asarray(v).astype(jdt),
        kv_cache=jnp.asarray(cache).astype(jdt), kv_lens=jnp.asarray(kv_lens_a), page_indices=jnp.asarray(table),
        cu_q_lens=jnp.asarray(cu), distribution=jnp.asarray(np.asarray(distribution, np.int32)))


ARRAY_ORDER = ("queries", "keys", "values", "kv_cache", "kv_lens", "page_indices", "cu_q_lens", "distribution")


def positional(inputs):
    return [inputs[n] for n in ARRAY_ORDER]

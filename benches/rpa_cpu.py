"""Ragged paged attention on the CPU (issue 23 item 4): the batches `cargo bench --bench interpret`
and `benches/jax_cpu.py` time, and the two XLA:CPU programs ours is held against.

The batches (what a vLLM step on a small model would hand the attention; bf16, 8 query heads over 2 kv
heads, head_dim 128, `sm_scale` 1/sqrt(128)):

- `ragged_paged_attention_decode`: 32 sequences decoding one token each, pages of 16 tokens, up to
  32 pages (512 tokens) a sequence, kv lengths spread over 1..512;
- `ragged_paged_attention_mixed`: 16 sequences, 8 decoding and 8 prefill chunks of 8..64 tokens
  (252 query tokens of at most 256), pages of 32 tokens, up to 16 pages (512 tokens) a sequence;
- `ragged_paged_attention_mixed_tpu_blocks`: the mixed batch, ours with `m_block_sizes=(128, 512, 128,
  256)`, tpu-inference's default for v5e and v6e, which the CPU lowering's default replaces with query
  blocks of 32 tokens (each block pads its chunk to `bq` rows): what that default saves.

Their metadata is a formula (`batch_tables`), written the same way in `benches/interpret/rpa.rs`, so the
Rust benchmark and this file time the same batches; the float arrays are random. Each sequence owns
exactly the pages its kv length needs, handed out in a shuffled order from a pool of just those
pages (+3): the cache is what the batch reads, so the copy of it every non-donating caller pays stays
in proportion.

The XLA programs, both under `jax.jit`:

- `reference`: tpu-inference 0.32.0's own `ref_ragged_paged_attention` (imported as
  python/tests/tpu_inference_rpa.py does). It loops over the sequences in Python and slices by their
  lengths, so it cannot trace over metadata arrays: it is jitted over the float arrays with the batch's
  metadata closed over as constants (a program specialised to the batch — every length static, no
  padding; a serving step could not reuse it for the next batch).
- `best_jnp`: the best jnp formulation found here, jit-able over the metadata as arrays (one program
  for every batch of these shapes): the new tokens scattered into their pages, the query tokens cut
  into blocks of `bq` tokens of one sequence each (at most `(T + S (bq - 1)) / bq` blocks), each
  block's sequence's pages gathered, one batched masked softmax attention in f32 with bf16 matmuls
  (the probabilities rounded to bf16 for `p @ v`, as the kernels do), scattered back to the tokens.
  `bq` is 1 for the decode batch (exact) and 16 for the mixed one (the fastest of 8, 16, 32, 64
  measured here).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import tpu_inference_rpa as tir  # noqa: E402  (tpu-inference's kernel module, imported with jax alone)

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 128
SM_SCALE = HEAD_DIM ** -0.5
STRIDE = 97  # the page shuffle: pool slot k holds page (97 k + 13) mod pool


@dataclasses.dataclass(frozen=True)
class Batch:
    tokens: int
    page_size: int
    pages_per_seq: int
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    decode: int  # the first `decode` sequences decode (q_len 1)
    bq: int  # best_jnp's query block
    m_block_sizes: tuple[int, int, int, int] | None = None  # ours: the mixed case's blocks, if not the default


def _decode_batch() -> Batch:
    seqs, max_kv = 32, 512
    return Batch(tokens=32, page_size=16, pages_per_seq=32, q_lens=(1,) * seqs,
                 kv_lens=tuple(1 + (157 * s + 31) % max_kv for s in range(seqs)), decode=seqs, bq=1)


def _mixed_batch() -> Batch:
    max_kv, decode = 512, 8
    prefill = (16, 48, 8, 64, 24, 32, 40, 12)
    q_lens = (1,) * decode + prefill
    kv_lens = tuple(1 + (157 * s + 31) % max_kv if s < decode else q + (89 * s + 7) % (max_kv - q + 1)
                    for s, q in enumerate(q_lens))
    return Batch(tokens=256, page_size=32, pages_per_seq=16, q_lens=q_lens, kv_lens=kv_lens, decode=decode,
                 bq=16)


BATCHES = {"ragged_paged_attention_decode": _decode_batch(), "ragged_paged_attention_mixed": _mixed_batch(),
           # The mixed batch again, ours with tpu-inference's default blocks for v5e and v6e (query blocks
           # of 128 tokens; the CPU's default is 32). The XLA programs are the mixed batch's.
           "ragged_paged_attention_mixed_tpu_blocks": dataclasses.replace(_mixed_batch(),
                                                                          m_block_sizes=(128, 512, 128, 256))}


def batch_tables(b: Batch):
    """(kv_lens, page_indices, cu_q_lens, distribution, pool pages) as numpy i32 arrays: sequence `s`
    owns pages `perm(k)` for its running page numbers `k`; unused table slots hold page 0."""
    seqs = len(b.q_lens)
    need = [-(-kv // b.page_size) for kv in b.kv_lens]
    pool = sum(need) + 3
    if pool % STRIDE == 0:
        pool += 1
    table = np.zeros(seqs * b.pages_per_seq, np.int32)
    k = 0
    for s, n in enumerate(need):
        assert n <= b.pages_per_seq and b.q_lens[s] <= b.kv_lens[s]
        for j in range(n):
            table[s * b.pages_per_seq + j] = (STRIDE * k + 13) % pool
            k += 1
    cu = np.concatenate([[0], np.cumsum(b.q_lens)]).astype(np.int32)
    assert cu[-1] <= b.tokens
    dist = np.array([b.decode, b.decode, seqs], np.int32)
    return np.asarray(b.kv_lens, np.int32), table, cu, dist, pool


def inputs(name: str, seed: int = 0) -> list:
    """tpu-inference's arguments: queries, keys, values (uniform in [-1, 1), bf16), the bf16 cache
    (`get_kv_cache_shape`), then the tables."""
    b = BATCHES[name]
    kv_lens, table, cu, dist, pool = batch_tables(b)
    rng = np.random.default_rng(seed)

    def uni(*shape):
        return jnp.asarray(rng.uniform(-1, 1, size=shape).astype(np.float32)).astype(jnp.bfloat16)

    shape = tir.kernel_module().get_kv_cache_shape(pool, b.page_size, KV_HEADS, HEAD_DIM, jnp.bfloat16)
    return [uni(b.tokens, HEADS, HEAD_DIM), uni(b.tokens, KV_HEADS, HEAD_DIM), uni(b.tokens, KV_HEADS, HEAD_DIM),
            uni(*shape), jnp.asarray(kv_lens), jnp.asarray(table), jnp.asarray(cu), jnp.asarray(dist)]


def reference(name: str):
    """tpu-inference's `ref_ragged_paged_attention` over the float arrays, the batch's metadata closed
    over as constants (it cannot trace over them); the metadata arguments are ignored."""
    mod = tir.kernel_module()
    kv_lens, table, cu, dist, _ = batch_tables(BATCHES[name])

    def ref(queries, keys, values, kv_cache, *_metadata):
        return mod.ref_ragged_paged_attention(queries, keys, values, kv_cache, kv_lens, table, cu, dist,
                                              sm_scale=SM_SCALE)
    return ref


def best_jnp(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, *, bq: int,
             sm_scale: float = SM_SCALE):
    """Ragged paged attention as one batched jnp program over blocks of `bq` query tokens (see the
    module docs); returns `(output [T, H, D], updated kv_cache)` (tokens no sequence owns: zeros)."""
    f32 = jnp.float32
    t, heads, d = queries.shape
    kvh = keys.shape[1]
    g = heads // kvh
    pages, ps, rows, pk, _ = kv_cache.shape
    seqs = kv_lens.shape[0]
    pps = page_indices.shape[0] // seqs
    span = pps * ps
    live_seq = jnp.arange(seqs) < distribution[2]
    q_lens = jnp.where(live_seq, cu_q_lens[1:] - cu_q_lens[:-1], 0)
    # The new tokens into their pages (a token no sequence owns goes to page `pages`: dropped).
    tok = jnp.arange(t)
    seq = jnp.minimum(jnp.searchsorted(cu_q_lens[1:], tok, side="right"), seqs - 1)
    pos = kv_lens[seq] - q_lens[seq] + tok - cu_q_lens[seq]
    live = tok < cu_q_lens[distribution[2]]
    page = jnp.where(live, page_indices[seq * pps + jnp.clip(pos // ps, 0, pps - 1)], pages)
    merged = jnp.stack([keys, values], axis=2).reshape(t, rows, pk, d)
    cache = kv_cache.at[page, pos % ps].set(merged, mode="drop")
    # Query blocks of `bq` tokens, each of one sequence.
    nb = (t + seqs * (bq - 1)) // bq
    per_seq = (q_lens + bq - 1) // bq
    ends = jnp.cumsum(per_seq)
    blk = jnp.arange(nb)
    bseq = jnp.minimum(jnp.searchsorted(ends, blk, side="right"), seqs - 1)
    qi = ((blk - (ends[bseq] - per_seq[bseq])) * bq)[:, None] + jnp.arange(bq)[None, :]  # [nb, bq]
    valid = (blk < ends[-1])[:, None] & (qi < q_lens[bseq][:, None])
    tok_idx = jnp.where(valid, cu_q_lens[bseq][:, None] + qi, t)
    q = queries[jnp.minimum(tok_idx, t - 1)].reshape(nb, bq, kvh, g, d)
    kv = cache[page_indices.reshape(seqs, pps)[bseq]].reshape(nb, span, 2 * kvh, d)
    k, v = kv[:, :, 0::2], kv[:, :, 1::2]
    s = jnp.einsum("bqhgd,bphd->bhgqp", q, k, preferred_element_type=f32) * sm_scale
    q_pos = (kv_lens[bseq] - q_lens[bseq])[:, None] + qi
    k_pos = jnp.arange(span)
    keep = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < kv_lens[bseq][:, None, None])
    s = jnp.where(keep[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    l = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("bhgqp,bphd->bhgqd", p.astype(v.dtype), v, preferred_element_type=f32)
    o = (o / jnp.maximum(l, 1e-30)).transpose(0, 3, 1, 2, 4).reshape(nb * bq, heads, d)
    out = jnp.zeros_like(queries).at[tok_idx.reshape(-1)].set(o.astype(queries.dtype), mode="drop")
    return out, cache


def best(name: str):
    """`best_jnp` with the batch's query block."""
    bq = BATCHES[name].bq
    return lambda *args: best_jnp(*args, bq=bq)


def written(name: str) -> int:
    """The query tokens the batch gives work to (the rows every version writes)."""
    return int(sum(BATCHES[name].q_lens))

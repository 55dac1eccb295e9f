"""The Pallas twin of examples/ragged_paged_attention.rs (the same algorithm, block sizes and operands:
what python/tests/test_examples.py holds ours to, LLO ops and bundles), its plain-jnp reference (jit-able:
dense masked attention over every sequence's pages, the cache update as a scatter) and valid inputs.
They take the launch's operands (`ragged_paged_attention_launch`: `kv_lens, page_indices, cu_q_lens,
distribution, q [Hkv, T, G / 2, 2, D], kv [T, Hkv, 2, D], kv_cache`), what the example's `build()` and
`tpu_kernel.examples.library.kernels["ragged_paged_attention_launch"]` take; the Python function
`tpu_kernel.examples.ragged_paged_attention` (tpu-inference's signature) lays its arrays out so.
tpu-inference's own kernel is the other comparison (test_ragged_paged_attention_tpu.py)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

S = jax.ShapeDtypeStruct
f32, bf16, i32, u32 = jnp.float32, jnp.bfloat16, jnp.int32, jnp.uint32

# The example's shapes (examples/ragged_paged_attention.rs `build_example`) and the block sizes its
# launch takes for v5e (tpu-inference's defaults there): (case, (bq, bkv, bq_c, bkv_c)).
TOKENS, HEADS, KV_HEADS, HEAD_DIM, PAGES, PAGE_SIZE, SEQS, PPS = 64, 8, 2, 128, 64, 16, 4, 8
# (Prefill and mixed share their block sizes, so the prefill sequences run in the mixed loop, as ours.)
CASES = (("decode", (1, 128, 1, 128)), ("mixed", (32, 128, 32, 64)))
MASK_VALUE = float(jnp.finfo(bf16).min)

ARGS = [S((SEQS,), i32), S((SEQS * PPS,), i32), S((SEQS + 1,), i32), S((3,), i32),
        S((KV_HEADS, TOKENS, HEADS // KV_HEADS // 2, 2, HEAD_DIM), bf16), S((TOKENS, KV_HEADS, 2, HEAD_DIM), bf16),
        S((PAGES, PAGE_SIZE, KV_HEADS, 2, HEAD_DIM), bf16)]


def _kernel(kv_lens, page_indices, cu_q_lens, dist, q_hbm, kv_hbm, _cache_in, o_hbm, cache_hbm,
            bkv_buf, q_buf, o_buf, sems, stats, acc):
    kvh, _, gq, qpk, d = q_hbm.shape
    gp = gq * qpk
    pages, ps, rows, pk, _ = cache_hbm.shape
    pps = page_indices.shape[0] // kv_lens.shape[0]
    cache_rows = cache_hbm.reshape(pages * ps, rows, pk, d)
    bkv_max = bkv_buf.shape[1]
    for case, (bq, bkv, bq_c, bkv_c) in CASES:
        decode = case == "decode"
        causal = not decode
        lo, hi = {"decode": (0, dist[0]), "mixed": (dist[0], dist[2])}[case]

        @pl.loop(lo, hi)
        def _(seq):
            q0 = cu_q_lens[seq]
            q_len = cu_q_lens[seq + 1] - q0
            kv_len = kv_lens[seq]
            p0 = kv_len - q_len

            def update(i, done):
                at = p0 + done
                sz = jnp.minimum((i + 1) * ps - at, q_len - done)
                page = page_indices[seq * pps + i]
                pltpu.make_async_copy(kv_hbm.at[pl.ds(q0 + done, sz)],
                                      cache_rows.at[pl.ds(page * ps + (at - i * ps), sz)], sems.at[3, 0]).start()
                return done + sz

            lax.fori_loop(p0 // ps, (kv_len - 1) // ps + 1, update, jnp.int32(0))
            pltpu.make_async_copy(cache_rows.at[pl.ds(0, q_len)], cache_rows.at[pl.ds(0, q_len)],
                                  sems.at[3, 0]).wait()

            @pl.loop(0, 1 if decode else (q_len + bq - 1) // bq)
            def _(bi):
                qs = bi * bq
                sz = jnp.minimum(q_len - qs, bq)
                cp = pltpu.make_async_copy(q_hbm.at[:, pl.ds(q0 + qs, sz)], q_buf.at[:, pl.ds(0, sz)], sems.at[1, 0])
                cp.start()
                cp.wait()
                stats[0] = jnp.full(stats.shape[1:], -jnp.inf, f32)
                stats[1] = jnp.zeros(stats.shape[1:], f32)
                acc[...] = jnp.zeros(acc.shape, f32)
                q_first = p0 + qs
                visible = jnp.minimum(kv_len, q_first + bq) if causal else kv_len
                end_block = (visible + bkv - 1) // bkv

                def fetch(b, slot, wait):
                    n = jnp.minimum(kv_len - b * bkv, bkv)
                    sem = sems.at[0, slot]
                    if wait:
                        dst = bkv_buf.at[slot, pl.ds(0, n)]
                        pltpu.make_async_copy(dst, dst, sem).wait()
                        return
                    first = seq * pps + b * (bkv // ps)

                    @pl.loop(0, (n + ps - 1) // ps)
                    def _(i):
                        rsz = jnp.minimum(n - i * ps, ps)
                        page = page_indices[first + i]
                        pltpu.make_async_copy(cache_rows.at[pl.ds(page * ps, rsz)],
                                              bkv_buf.at[slot, pl.ds(i * ps, rsz)], sem).start()

                @pl.when(0 < end_block)
                def _():
                    fetch(0, 0, False)

                @pl.loop(0, end_block)
                def _(b):
                    slot = b % 2

                    @pl.when(b + 1 < end_block)
                    def _():
                        fetch(b + 1, 1 - slot, False)

                    fetch(b, slot, True)
                    words = bkv_buf.bitcast(u32).at[slot].reshape(bkv_max * rows, d)
                    in_block = jnp.minimum(jnp.maximum(visible - b * bkv, 0), bkv)

                    @pl.loop(0, (in_block + bkv_c - 1) // bkv_c)
                    def _(ci):
                        kv0 = ci * bkv_c
                        k_first = b * bkv + kv0
                        for c in range(bq // bq_c):
                            r = gp * bq_c
                            q_pos = lax.broadcasted_iota(i32, (r, bkv_c), 0) // gp + (q_first + c * bq_c)
                            @pl.loop(0, kvh)
                            def _(h):
                                w = words[pl.ds(kv0 * rows + h, bkv_c, stride=rows)]
                                k = pltpu.bitcast(w << 16, f32).astype(bf16)
                                v = pltpu.bitcast(w & jnp.uint32(0xFFFF0000), f32).astype(bf16)
                                qw = q_buf.bitcast(u32).at[h].reshape(q_buf.shape[1] * gq, d)
                                qh = pltpu.bitcast(qw[c * bq_c * gq:(c + 1) * bq_c * gq], bf16)
                                s = lax.dot_general(qh, k, (((1,), (1,)), ((), ())), preferred_element_type=f32)
                                k_pos = lax.broadcasted_iota(i32, (r, bkv_c), 1) + k_first
                                v_pos = lax.broadcasted_iota(i32, (bkv_c, d), 0) + k_first
                                v = jnp.where(v_pos < kv_len, v, jnp.zeros_like(v))
                                keep = k_pos < kv_len
                                if causal:
                                    keep = keep & (k_pos <= q_pos)
                                s = jnp.where(keep, s, MASK_VALUE)
                                sl = pl.ds(c * r, r)
                                m_prev = stats[0, h, sl][:, :1]
                                m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
                                p = jnp.exp(s - m_new)
                                alpha = jnp.exp(m_prev - m_new)
                                l_new = alpha * stats[1, h, sl][:, :1] + p.sum(axis=1, keepdims=True)
                                pv = jnp.dot(p.astype(bf16), v, preferred_element_type=f32)
                                acc[h, sl] = acc[h, sl] * alpha + pv
                                stats[0, h, sl] = jnp.broadcast_to(m_new, (r, 128))
                                stats[1, h, sl] = jnp.broadcast_to(l_new, (r, 128))

                for c in range(bq // bq_c):
                    r = gp * bq_c
                    @pl.loop(0, kvh)
                    def _(h, c=c, r=r):
                        out = (acc[h, pl.ds(c * r, r)] / stats[1, h, pl.ds(c * r, r)][:, :1]).astype(bf16)
                        ow = o_buf.bitcast(u32).at[h].reshape(o_buf.shape[1] * gq, d)
                        ow[c * bq_c * gq:(c + 1) * bq_c * gq] = pltpu.bitcast(out, u32)
                cp = pltpu.make_async_copy(o_buf.at[:, pl.ds(0, sz)], o_hbm.at[:, pl.ds(q0 + qs, sz)], sems.at[2, 0])
                cp.start()
                cp.wait()


def _vmem_capacity():
    """The TensorCore's VMEM when lowering for a TPU (ours and tpu-inference's default limit); None on
    CPU, where jax has no TPU facts."""
    try:
        return pltpu.get_tpu_info().vmem_capacity_bytes
    except Exception:
        return None


def ragged_paged_attention(kv_lens, page_indices, cu_q_lens, distribution, qp, kv, kv_cache):
    kvh, t, gq, qpk, d = qp.shape
    bkv_max = max(b[1] for _, b in CASES)
    bq_max = max(b[0] for _, b in CASES)
    any_ = pl.BlockSpec(memory_space=pl.ANY)
    o, cache = pl.pallas_call(
        _kernel,
        out_shape=[S(qp.shape, qp.dtype), S(kv_cache.shape, kv_cache.dtype)],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=[any_] * 3, out_specs=[any_] * 2,
            scratch_shapes=[pltpu.VMEM((2, bkv_max, *kv_cache.shape[2:]), kv_cache.dtype),
                            pltpu.VMEM((kvh, bq_max, gq, qpk, d), qp.dtype),
                            pltpu.VMEM((kvh, bq_max, gq, qpk, d), qp.dtype),
                            pltpu.SemaphoreType.DMA((4, 2)),
                            pltpu.VMEM((2, kvh, gq * qpk * bq_max, 128), f32),
                            pltpu.VMEM((kvh, gq * qpk * bq_max, d), f32)]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=_vmem_capacity()),
        input_output_aliases={4: 0, 6: 1},
        name="ragged_paged_attention_kernel",
    )(kv_lens, page_indices, cu_q_lens, distribution, qp, kv, kv_cache)
    return o, cache


def reference(kv_lens, page_indices, cu_q_lens, distribution, qp, kv, kv_cache, sm_scale=1.0):
    """Plain jnp, jit-able: the new tokens scattered into their pages, then every written token's
    causal attention over its sequence's pages (tokens past `cu_q_lens[-1]` keep their queries)."""
    kvh, t, gq, qpk, d = qp.shape
    h = kvh * gq * qpk
    queries = qp.swapaxes(0, 1).reshape(t, h, d)
    pages, ps = kv_cache.shape[:2]
    seqs = kv_lens.shape[0]
    pps = page_indices.shape[0] // seqs
    n = cu_q_lens[distribution[2]]
    tok = jnp.arange(t)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], tok, side="right"), 0, seqs - 1)
    live = tok < n
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    pos = kv_lens[seq] - q_len + (tok - cu_q_lens[seq])
    page = page_indices[seq * pps + jnp.clip(pos, 0, pps * ps - 1) // ps]
    page = jnp.where(live, page, pages)  # out of range: dropped
    cache = kv_cache.at[page, pos % ps].set(kv, mode="drop")
    p = jnp.arange(pps * ps)
    gathered = cache[page_indices.reshape(seqs, pps)].reshape(seqs, pps * ps, kvh, 2, d)[seq]  # [t, P, kvh, 2, d]
    k = jnp.repeat(gathered[:, :, :, 0].astype(f32), h // kvh, axis=2)
    v = jnp.repeat(gathered[:, :, :, 1].astype(f32), h // kvh, axis=2)
    s = jnp.einsum("thd,tphd->thp", queries.astype(f32), k) * sm_scale
    keep = (p[None, :] <= pos[:, None]) & (p[None, :] < kv_lens[seq][:, None])
    s = jnp.where(keep[:, None, :], s, -jnp.inf)
    w = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("thp,tphd->thd", w, v).astype(queries.dtype)
    o = jnp.where(live[:, None, None], o, queries)
    return o.reshape(t, kvh, gq, qpk, d).swapaxes(0, 1), cache


def valid_inputs(xs):
    """Random arrays made a valid call: half the sequences decode, the rest take random query lengths
    that fit the tokens, each kv_len random in q_len..pages_per_seq * page_size, distinct pages."""
    kv_lens, table, cu, dist, q, kv, cache = xs
    rng = np.random.default_rng(int(np.asarray(jnp.sum(jnp.abs(kv_lens)))) % 1000)
    seqs = kv_lens.shape[0]
    pps = table.shape[0] // seqs
    pages, ps = cache.shape[:2]
    tokens = kv.shape[0]
    decode = seqs // 2
    budget = tokens - seqs
    q_lens = []
    for s in range(seqs):
        extra = 0 if s < decode else int(rng.integers(0, min(budget, pps * ps - 1) + 1))
        budget -= extra
        q_lens.append(1 + extra)
    lens = [ql + int(rng.integers(0, pps * ps - ql + 1)) for ql in q_lens]
    pool = rng.permutation(pages)
    tab = pool[np.arange(seqs * pps) % pages].astype(np.int32)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return [jnp.asarray(lens, i32), jnp.asarray(tab), jnp.asarray(cu_q), jnp.asarray([decode, decode, seqs], i32),
            q, kv, cache]


KERNEL = (ragged_paged_attention, ARGS)

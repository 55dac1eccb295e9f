"""Pallas versions of the example kernels: the quality bar (LLO op count after libtpu) for ours.

KERNELS: example name -> (pallas_fn, [ShapeDtypeStruct inputs]), with the same kernel, shapes, blocks
and grid as `examples/<name>.rs`. Every example must have an entry here (the parity test fails loudly
otherwise): a new example comes with its Pallas twin.

Written for this suite after the public reference kernels (../shared/pallas-reference/public.py), whose
measured figures are in ../shared/pallas-reference/SUMMARY.md.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernel.examples import group_metadata

import pallas_rpa  # the ragged_paged_attention twin (its own module: the algorithm is long)

S = jax.ShapeDtypeStruct
f32, bf16, i32, i8 = jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8


def _params(*semantics):
    return pltpu.CompilerParams(dimension_semantics=semantics)


# -- add: o = x + y, (256, 256) blocks
def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add(x, y, bm=256, bn=256):
    m, n = x.shape
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(_add_kernel, out_shape=S(x.shape, x.dtype), grid=(m // bm, n // bn),
                          in_specs=[spec, spec], out_specs=spec,
                          compiler_params=_params("parallel", "parallel"), name="add_kernel")(x, y)


# -- matmul: bf16 in, f32 VMEM accumulator over the arbitrary k axis, bf16 out
def _matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=f32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y, bm=128, bn=128, bk=128):
    (m, kk), (_, n) = x.shape, y.shape
    return pl.pallas_call(
        _matmul_kernel, out_shape=S((m, n), x.dtype), grid=(m // bm, n // bn, kk // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), f32)],
        compiler_params=_params("parallel", "parallel", "arbitrary"), name="matmul_kernel")(x, y)


# -- softmax over rows, (8, N) blocks
def _softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax(x, br=8):
    m, n = x.shape
    spec = pl.BlockSpec((br, n), lambda i: (i, 0))
    return pl.pallas_call(_softmax_kernel, out_shape=S(x.shape, x.dtype), grid=(m // br,), in_specs=[spec],
                          out_specs=spec, compiler_params=_params("parallel"), name="softmax_kernel")(x)


# -- rmsnorm: bf16 rows, f32 weight row
def _rmsnorm_kernel(x_ref, w_ref, o_ref, *, eps):
    x = x_ref[...].astype(f32)
    y = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w_ref[...]
    o_ref[...] = y.astype(o_ref.dtype)


def rmsnorm(x, w, br=16, eps=1e-6):
    m, n = x.shape
    return pl.pallas_call(
        functools.partial(_rmsnorm_kernel, eps=eps), out_shape=S(x.shape, x.dtype), grid=(m // br,),
        in_specs=[pl.BlockSpec((br, n), lambda i: (i, 0)), pl.BlockSpec((1, n), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((br, n), lambda i: (i, 0)),
        compiler_params=_params("parallel"), name="rmsnorm_kernel")(x, w)


# -- causal_mask: scale the lower triangle, -inf above
def _causal_mask_kernel(x_ref, o_ref, *, scale):
    bm, bn = x_ref.shape
    row = lax.broadcasted_iota(i32, (bm, bn), 0) + pl.program_id(0) * bm
    col = lax.broadcasted_iota(i32, (bm, bn), 1) + pl.program_id(1) * bn
    o_ref[...] = jnp.where(row >= col, x_ref[...] * scale, -jnp.inf)


def causal_mask(x, bm=128, bn=128, scale=0.125):
    m, n = x.shape
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(functools.partial(_causal_mask_kernel, scale=scale), out_shape=S(x.shape, x.dtype),
                          grid=(m // bm, n // bn), in_specs=[spec], out_specs=spec,
                          compiler_params=_params("parallel", "parallel"), name="causal_mask_kernel")(x)


# -- fori_rowsum: a fori_loop over 8-row chunks of a (M, 128) column strip
def _fori_rowsum_kernel(x_ref, o_ref):
    def body(i, acc):
        return acc + x_ref[pl.ds(pl.multiple_of(i * 8, 8), 8), :]

    o_ref[...] = lax.fori_loop(0, x_ref.shape[0] // 8, body, jnp.zeros(o_ref.shape, f32))


def fori_rowsum(x, bn=128):
    m, n = x.shape
    return pl.pallas_call(_fori_rowsum_kernel, out_shape=S((8, n), x.dtype), grid=(n // bn,),
                          in_specs=[pl.BlockSpec((m, bn), lambda j: (0, j))],
                          out_specs=pl.BlockSpec((8, bn), lambda j: (0, j)),
                          compiler_params=_params("parallel"), name="fori_rowsum_kernel")(x)


# -- transpose by (128, 128) blocks
def _transpose_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


def transpose(x, bm=128, bn=128):
    m, n = x.shape
    return pl.pallas_call(_transpose_kernel, out_shape=S((n, m), x.dtype), grid=(m // bm, n // bn),
                          in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
                          out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
                          compiler_params=_params("parallel", "parallel"), name="transpose_kernel")(x)


# -- colsum: the (8, bn) output block accumulates over the arbitrary row-block axis
def _colsum_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

    o_ref[...] += jnp.broadcast_to(jnp.sum(x_ref[...], axis=0, keepdims=True), o_ref.shape)


def colsum(x, bm=128, bn=128):
    m, n = x.shape
    return pl.pallas_call(_colsum_kernel, out_shape=S((8, n), x.dtype), grid=(n // bn, m // bm),
                          in_specs=[pl.BlockSpec((bm, bn), lambda j, k: (k, j))],
                          out_specs=pl.BlockSpec((8, bn), lambda j, k: (0, j)),
                          compiler_params=_params("parallel", "arbitrary"), name="colsum_kernel")(x)


# -- ops_tour: gelu(tanh) + dot_nt, a valued if, a while loop, masked store, int reduction, fori over rows
def _ops_tour_kernel(x_ref, w_ref, o_ref, counts_ref):
    i = pl.program_id(0)
    bm, bn = x_ref.shape
    x = x_ref[...]
    g = 0.5 * x * (1.0 + jnp.tanh(0.7978846 * (x + 0.044715 * x * x * x)))
    s = lax.dot_general(g, w_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=f32)
    v = lax.cond(lax.rem(i, 2) == 0, lambda: s * 2.0, lambda: s)  # Rust's `%`: truncated
    _, v = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.maximum(c[1] * 0.5, -1.0)), (0, v))
    row = lax.broadcasted_iota(i32, (bm, bn), 0) + i * bm
    col = lax.broadcasted_iota(i32, (bm, bn), 1)
    keep = (row >= col) & (lax.rem(col, 2) == 0)
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
    pltpu.store(o_ref, v, mask=keep)
    kept = jnp.sum(keep.astype(i32), axis=0, keepdims=True)
    bias = jnp.broadcast_to(kept.astype(f32), (8, bn)) * 0.001

    def rows(j, carry):
        sl = pl.ds(pl.multiple_of(j * 8, 8), 8)
        o_ref[sl, :] = o_ref[sl, :] + bias
        return carry

    lax.fori_loop(0, bm // 8, rows, 0)
    counts_ref[...] = jnp.broadcast_to(kept, (8, bn))


def ops_tour(x, w, bm=64):
    m, n = x.shape
    return pl.pallas_call(
        _ops_tour_kernel, out_shape=(S((m, n), f32), S((8 * (m // bm), n), i32)), grid=(m // bm,),
        in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0)), pl.BlockSpec((n, n), lambda i: (0, 0))],
        out_specs=(pl.BlockSpec((bm, n), lambda i: (i, 0)), pl.BlockSpec((8, n), lambda i: (i, 0))),
        compiler_params=_params("parallel"), name="ops_tour_kernel")(x, w)


# -- activations: erf GELU, SwiGLU, tanh soft-cap, rounding/clamp/sign, NaN scrub, integer shifts
def _expm1(x):
    """Kahan's expm1 on exp and log (Pallas has no TPU lowering for expm1), as examples/activations.rs."""
    u = jnp.exp(x)
    um1 = u - 1.0
    general = um1 * (x / jnp.log(u))
    return jnp.where(u == 1.0, x, jnp.where(um1 == -1.0, -1.0, jnp.where(u == jnp.inf, u, general)))


def _activations_math(x, g, c):
    gelu = 0.5 * x * (1.0 + lax.erf(x * 0.70710677))
    swiglu = g * jax.nn.sigmoid(g) * x
    capped = jnp.tanh(swiglu * 0.1) * 10.0
    sign = jnp.where(x > 0, 1.0, jnp.where(x < 0, -1.0, x))
    shaped = (jnp.log1p(jnp.abs(x)) + _expm1(x * 0.25) + jnp.round(x * 2.5) - jnp.floor(x) + jnp.ceil(x)) * sign
    y = gelu + capped + jnp.minimum(jnp.maximum(shaped, -4.0), 4.0)
    out = jnp.where(jnp.logical_not(y == y), 0.0, y)  # isnan as ours lowers it: !(y oeq y)
    packed = (lax.shift_right_arithmetic(lax.shift_left(c, 3), 5) ^ (c & 255)) | lax.shift_right_arithmetic(c, 31)
    return out, packed


def _activations_kernel(x_ref, g_ref, c_ref, o_ref, p_ref):
    o_ref[...], p_ref[...] = _activations_math(x_ref[...], g_ref[...], c_ref[...])


def activations(x, g, c, bm=8):
    m, n = x.shape
    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return pl.pallas_call(_activations_kernel, out_shape=(S((m, n), f32), S((m, n), i32)), grid=(m // bm,),
                          in_specs=[spec, spec, spec], out_specs=(spec, spec),
                          compiler_params=_params("parallel"), name="activations_kernel")(x, g, c)


# -- gather_prefetch: a scalar-prefetch table of block numbers picks each step's input block
def _gather_kernel(idx_ref, x_ref, o_ref):
    del idx_ref  # read by the index map only
    o_ref[...] = x_ref[...] * 2.0


def gather_prefetch(idx, x, bm=8):
    nb, n = idx.shape[0], x.shape[1]
    return pl.pallas_call(
        _gather_kernel, out_shape=S((nb * bm, n), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(nb,),
            in_specs=[pl.BlockSpec((bm, n), lambda i, idx_ref: (idx_ref[i], 0))],
            out_specs=pl.BlockSpec((bm, n), lambda i, idx_ref: (i, 0))),
        compiler_params=_params("arbitrary"), name="gather_kernel")(idx, x)


# -- dma_double: the input stays in HBM; each step copies its rows into VMEM by DMA and doubles them
def _dma_double_kernel(x_hbm, o_ref, buf, sem):
    bm = buf.shape[0]
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(pl.program_id(0) * bm, bm)], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] * 2.0


def dma_double(x, bm=128):
    m, n = x.shape
    return pl.pallas_call(
        _dma_double_kernel, out_shape=S((m, n), x.dtype), grid=(m // bm,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bm, n), x.dtype), pltpu.SemaphoreType.DMA],
        compiler_params=_params("parallel"), name="dma_double_kernel")(x)


# -- strided: a butterfly over row pairs through stride-2 windows (pl.ds(start, size, stride))
def _strided_kernel(x_ref, o_ref):
    half = x_ref.shape[0] // 2
    even = x_ref[pl.ds(0, half, stride=2), :]
    odd = x_ref[pl.ds(1, half, stride=2), :]
    o_ref[pl.ds(0, half, stride=2), :] = even + odd
    o_ref[pl.ds(1, half, stride=2), :] = even - odd


def strided(x, bm=64):
    m, n = x.shape
    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return pl.pallas_call(_strided_kernel, out_shape=S(x.shape, x.dtype), grid=(m // bm,),
                          in_specs=[spec], out_specs=spec,
                          compiler_params=_params("parallel"), name="strided_kernel")(x)


# -- inplace_scale: the output aliases the input
def _inplace_scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0


def inplace_scale(x, bm=128):
    m, n = x.shape
    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return pl.pallas_call(_inplace_scale_kernel, out_shape=S(x.shape, x.dtype), grid=(m // bm,),
                          in_specs=[spec], out_specs=spec, input_output_aliases={0: 0},
                          compiler_params=_params("parallel"), name="inplace_scale_kernel")(x)


# -- paged_gather: a block table in SMEM picks the HBM pages of each sequence; each page is DMA'd into
#    one of two VMEM slots (page p + 1 in flight while page p is added) and the pages are summed
def _paged_gather_kernel(table_ref, pages_hbm, o_ref, buf, sems):
    s = pl.program_id(0)
    pages_per_seq = table_ref.shape[1]

    def copy(p, slot):
        return pltpu.make_async_copy(pages_hbm.at[table_ref[s, p]], buf.at[slot], sems.at[slot])

    copy(0, 0).start()

    def body(p, acc):
        slot = lax.rem(p, 2)

        @pl.when(p + 1 < pages_per_seq)
        def _():
            copy(p + 1, 1 - slot).start()

        copy(p, slot).wait()
        return acc + buf[slot]

    o_ref[...] = lax.fori_loop(0, pages_per_seq, body, jnp.zeros(o_ref.shape, f32))


def paged_gather(table, pages):
    num_seqs = table.shape[0]
    _, ps, n = pages.shape
    return pl.pallas_call(
        _paged_gather_kernel, out_shape=S((num_seqs * ps, n), pages.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(num_seqs,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((ps, n), lambda s, table_ref: (s, 0)),
            scratch_shapes=[pltpu.VMEM((2, ps, n), pages.dtype), pltpu.SemaphoreType.DMA((2,))]),
        compiler_params=_params("parallel"), name="paged_gather_kernel")(table, pages)


# -- quantized_matmul (w8a16): bf16 x, int8 w dequantized to bf16 before the MXU, f32 accumulator over
# the arbitrary k axis, the per-output-channel f32 scale applied to the accumulator at the last k step
def _quantized_matmul_kernel(x_ref, w_ref, s_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...].astype(bf16), preferred_element_type=f32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] * s_ref[...]).astype(o_ref.dtype)


def quantized_matmul(x, w, scale, bm=128, bn=128, bk=128):
    (m, kk), (_, n) = x.shape, w.shape
    return pl.pallas_call(
        _quantized_matmul_kernel, out_shape=S((m, n), bf16), grid=(m // bm, n // bn, kk // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)),
                  pl.BlockSpec((1, bn), lambda i, j, k: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), f32)],
        compiler_params=_params("parallel", "parallel", "arbitrary"), name="quantized_matmul_kernel")(x, w, scale)


# -- quantized_matmul_w8a8: int8 x (per-row f32 scale) @ int8 w (per-column f32 scale), i32 accumulator,
# converted to f32 and scaled by both at the last k step
def _quantized_matmul_w8a8_kernel(x_ref, xs_ref, w_ref, ws_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=i32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...].astype(f32) * xs_ref[...] * ws_ref[...]).astype(o_ref.dtype)


def quantized_matmul_w8a8(x, x_scale, w, w_scale, bm=128, bn=128, bk=128):
    (m, kk), (_, n) = x.shape, w.shape
    return pl.pallas_call(
        _quantized_matmul_w8a8_kernel, out_shape=S((m, n), bf16), grid=(m // bm, n // bn, kk // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bm, 1), lambda i, j, k: (i, 0)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)), pl.BlockSpec((1, bn), lambda i, j, k: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), i32)],
        compiler_params=_params("parallel", "parallel", "arbitrary"),
        name="quantized_matmul_w8a8_kernel")(x, x_scale, w, w_scale)


# -- grouped_matmul (megablox's gmm): tokens sorted by group, rhs[g] per group; scalar-prefetched
#    metadata (group offsets, and per visit its group and m tile) picks the blocks; a tile straddling a
#    group boundary is visited once per group and each visit stores only its group's rows
def _grouped_matmul_kernel(offsets_ref, group_ids_ref, m_tiles_ref, lhs_ref, rhs_ref, o_ref, acc_ref):
    t, k = pl.program_id(1), pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    acc_ref[...] += jnp.dot(lhs_ref[...], rhs_ref[...].reshape(rhs_ref.shape[1:]), preferred_element_type=f32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        g = group_ids_ref[t]
        start, end = offsets_ref[g], offsets_ref[g + 1]
        row = lax.broadcasted_iota(i32, o_ref.shape, 0) + m_tiles_ref[t] * o_ref.shape[0]
        mine = (row >= start) & (row < end)
        o_ref[...] = jnp.where(mine, acc_ref[...], o_ref[...].astype(f32)).astype(o_ref.dtype)


def grouped_matmul(offsets, group_ids, m_tiles, lhs, rhs, tm=128, tk=128, tn=128):
    (m, kk), n = lhs.shape, rhs.shape[2]
    return pl.pallas_call(
        _grouped_matmul_kernel, out_shape=S((m, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=(n // tn, group_ids.shape[0], kk // tk),
            in_specs=[pl.BlockSpec((tm, tk), lambda j, t, k, offs, gids, tiles: (tiles[t], k)),
                      pl.BlockSpec((1, tk, tn), lambda j, t, k, offs, gids, tiles: (gids[t], k, j))],
            out_specs=pl.BlockSpec((tm, tn), lambda j, t, k, offs, gids, tiles: (tiles[t], j)),
            scratch_shapes=[pltpu.VMEM((tm, tn), f32)]),
        compiler_params=_params("parallel", "arbitrary", "arbitrary"), name="grouped_matmul_kernel")(
            offsets, group_ids, m_tiles, lhs, rhs)


# (group_metadata is the package's: tpu_kernel.examples.group_metadata, what users call)


def _grouped_matmul_ref(offsets, group_ids, m_tiles, lhs, rhs):
    """One expert at a time over its rows (the visit tables are not read)."""
    rows = jnp.arange(lhs.shape[0])[:, None]
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), f32)
    for g in range(rhs.shape[0]):
        mine = (rows >= offsets[g]) & (rows < offsets[g + 1])
        out = jnp.where(mine, jnp.dot(lhs, rhs[g], preferred_element_type=f32), out)
    return out.astype(lhs.dtype)


# -- paged_attention (decode; jax's Pallas TPU paged_attention, in one grid step per (sequence, kv head)):
#    lengths and the block table scalar-prefetched into SMEM, K/V pages left in HBM; the pages a sequence
#    owns are DMA'd in groups into two VMEM slots (the next group in flight while this one is computed),
#    GQA (the G query heads of a kv head as one [G, D] block), online softmax over groups, masked to the
#    length; a group's unowned value pages are zeroed (its unowned key pages are masked by the select)
_MASK_VALUE = -0.7 * float(jnp.finfo(f32).max)


def _paged_attention_kernel(lengths_ref, page_indices_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems):
    b, h = pl.program_id(0), pl.program_id(1)
    _, per_group, page_size, _ = k_buf.shape
    heads, head_dim = q_ref.shape
    tokens = per_group * page_size
    length = lengths_ref[b]
    n_pages = lax.div(length + (page_size - 1), page_size)
    n_groups = lax.div(length + (tokens - 1), tokens)

    def start_group(g, slot):
        first = g * per_group
        owned = jnp.minimum(n_pages - first, per_group)

        def copy(j, carry):
            page = page_indices_ref[b, first + j]
            pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[slot, j], sems.at[0, slot]).start()
            pltpu.make_async_copy(v_hbm.at[h, page], v_buf.at[slot, j], sems.at[1, slot]).start()
            return carry

        lax.fori_loop(0, owned, copy, None)

        def zero(j, carry):
            v_buf[slot, j] = jnp.zeros((page_size, head_dim), v_buf.dtype)
            return carry

        lax.fori_loop(owned, per_group, zero, None)

    def wait_group(owned, slot):
        def wait(j, carry):  # the destination stands in for the source: a wait reads no page number
            pltpu.make_async_copy(k_buf.at[slot, j], k_buf.at[slot, j], sems.at[0, slot]).wait()
            pltpu.make_async_copy(v_buf.at[slot, j], v_buf.at[slot, j], sems.at[1, slot]).wait()
            return carry

        lax.fori_loop(0, owned, wait, None)

    @pl.when(n_groups > 0)
    def _():
        start_group(0, 0)

    q = q_ref[...]

    def body(g, carry):
        m, l, acc = carry
        slot = lax.rem(g, 2)

        @pl.when(g + 1 < n_groups)
        def _():
            start_group(g + 1, 1 - slot)

        wait_group(jnp.minimum(n_pages - g * per_group, per_group), slot)
        k = k_buf[slot].reshape(tokens, head_dim)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=f32)
        position = lax.broadcasted_iota(i32, (heads, tokens), 1) + g * tokens
        s = jnp.where(position < length, s, _MASK_VALUE)
        m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m - m_next)
        p = jnp.exp(s - m_next)
        l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
        v = v_buf[slot].reshape(tokens, head_dim)
        acc = acc * alpha + jnp.dot(p.astype(bf16), v, preferred_element_type=f32)
        return m_next, l, acc

    init = (jnp.full((heads, 1), -jnp.inf, f32), jnp.zeros((heads, 1), f32), jnp.zeros((heads, head_dim), f32))
    _, l, acc = lax.fori_loop(0, n_groups, body, init)
    o_ref[...] = (acc / jnp.maximum(l, 1.0)).astype(o_ref.dtype)


def paged_attention(lengths, page_indices, q, k_pages, v_pages, pages_per_compute_block=8):
    batch, heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = heads // kv_heads
    q_spec = pl.BlockSpec((pl.Squeezed(), group, head_dim), lambda b, h, *_: (b, h, 0))
    buf = pltpu.VMEM((2, pages_per_compute_block, page_size, head_dim), k_pages.dtype)
    return pl.pallas_call(
        _paged_attention_kernel, out_shape=S(q.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(batch, kv_heads),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec, scratch_shapes=[buf, buf, pltpu.SemaphoreType.DMA((2, 2))]),
        compiler_params=_params("parallel", "parallel"), name="paged_attention_kernel")(
            lengths, page_indices, q, k_pages, v_pages)


def _paged_attention_ref(lengths, page_indices, q, k_pages, v_pages):
    """The pages of each sequence gathered (`k_pages[:, page_indices]`), then plain masked softmax
    attention in f32 per query head over its kv head; zeros for an empty sequence."""
    batch, heads, head_dim = q.shape
    kv_heads = k_pages.shape[0]
    k = k_pages[:, page_indices].reshape(kv_heads, batch, -1, head_dim).astype(f32)
    v = v_pages[:, page_indices].reshape(kv_heads, batch, -1, head_dim).astype(f32)
    qg = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).astype(f32)
    s = jnp.einsum("bhgd,hbtd->bhgt", qg, k, precision=lax.Precision.HIGHEST)
    valid = jnp.arange(s.shape[-1]) < lengths[:, None, None, None]
    s = jnp.where(valid, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(valid, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    o = jnp.einsum("bhgt,hbtd->bhgd", p, v, precision=lax.Precision.HIGHEST)
    o = o / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
    return o.reshape(batch, heads, head_dim).astype(q.dtype)


def paged_attention_inputs(lengths, page_indices, total_pages, page_size):
    """Valid `paged_attention` tables from any i32 arrays: lengths folded into `0..=pages_per_seq *
    page_size` with the edges first (1 token, every page, empty, one token into a second page), the
    block table a permutation of the pool's pages shifted by the given entries."""
    batch, pages_per_seq = page_indices.shape
    max_len = pages_per_seq * page_size
    lengths = jnp.mod(lengths, max_len + 1).astype(i32)
    edges = jnp.array([1, max_len, 0, page_size + 1], i32)[:batch]
    lengths = lengths.at[:edges.shape[0]].set(edges)
    perm = jax.random.permutation(jax.random.key(0), total_pages).astype(i32)
    entries = perm[jnp.arange(batch * pages_per_seq) % total_pages].reshape(batch, pages_per_seq)
    return lengths, jnp.mod(entries + page_indices, total_pages).astype(i32)


# -- flash_attention (forward): online softmax over key blocks, m/l lane-replicated to 128 in VMEM
#    scratch, acc in f32; causal: key blocks above the diagonal skipped (their index map clamped to the
#    last needed block) and the computed blocks masked with a finite -0.7 * f32 max
_MASK = -0.7 * float(jnp.finfo(f32).max)


def _flash_scores(q, k, i, j, causal, scale):
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=f32) * scale
    if causal:
        bq, bk = q.shape[0], k.shape[0]
        row = lax.broadcasted_iota(i32, (bq, bk), 0) + i * bq
        col = lax.broadcasted_iota(i32, (bq, bk), 1) + j * bk
        s = jnp.where(col <= row, s, _MASK)
    return s


def _flash_attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, causal, scale):
    bq, bk = q_ref.shape[0], k_ref.shape[0]
    i, j = pl.program_id(1), pl.program_id(2)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, _MASK, f32)
        l_ref[...] = jnp.zeros(l_ref.shape, f32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, f32)

    @pl.when((j * bk < (i + 1) * bq) | (not causal))
    def _():
        s = _flash_scores(q_ref[...], k_ref[...], i, j, causal, scale)
        m_prev = m_ref[...][:, 0:1]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_new = alpha * l_ref[...][:, 0:1] + jnp.sum(p, axis=1, keepdims=True)
        acc_ref[...] = acc_ref[...] * alpha + jnp.dot(p.astype(bf16), v_ref[...], preferred_element_type=f32)
        m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(l_new, l_ref.shape)

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...][:, 0:1]).astype(o_ref.dtype)


def flash_attention(q, k, v, causal=False, bq=128, bk=128):
    bh, seq, d = q.shape
    kv_block = (lambda b, i, j: (b, jnp.minimum(j, lax.div((i + 1) * bq - 1, bk)), 0)) if causal else (
        lambda b, i, j: (b, j, 0))
    kv = pl.BlockSpec((None, bk, d), kv_block)
    return pl.pallas_call(
        functools.partial(_flash_attention_kernel, causal=causal, scale=1.0 / d ** 0.5),
        out_shape=S(q.shape, q.dtype), grid=(bh, seq // bq, seq // bk),
        in_specs=[pl.BlockSpec((None, bq, d), lambda b, i, j: (b, i, 0)), kv, kv],
        out_specs=pl.BlockSpec((None, bq, d), lambda b, i, j: (b, i, 0)),
        scratch_shapes=[pltpu.VMEM((bq, 128), f32), pltpu.VMEM((bq, 128), f32), pltpu.VMEM((bq, d), f32)],
        compiler_params=_params("parallel", "parallel", "arbitrary"), name="flash_attention_kernel")(q, k, v)


def attention_ref(q, k, v, causal=False):
    """softmax(q kᵀ / sqrt(d)) v per head in f32, rounded to q's dtype (the flash attention reference)."""
    s = jnp.einsum("hqd,hkd->hqk", q.astype(f32), k.astype(f32)) / q.shape[-1] ** 0.5
    if causal:
        seq = q.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v.astype(f32)).astype(q.dtype)


# -- flash_attention backward (not examples of their own: the JAX op's backward kernels), with the
#    forward's log-sum-exp residual lse [bh, seq, 128] f32 (lane-replicated): dK/dV over query blocks,
#    dQ over key blocks, p = exp(s - lse), dS = p * (dO vᵀ - rowsum(dO * O))
def _flash_dkv_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, g_ref, dk_ref, dv_ref, dk_acc, dv_acc, *, causal, scale):
    bq, bk = q_ref.shape[0], k_ref.shape[0]
    j, i = pl.program_id(1), pl.program_id(2)

    @pl.when(i == 0)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, f32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, f32)

    @pl.when(((i + 1) * bq > j * bk) | (not causal))
    def _():
        q, g = q_ref[...], g_ref[...]
        s = _flash_scores(q, k_ref[...], i, j, causal, scale)
        p = jnp.exp(s - lse_ref[...][:, 0:1])
        dv_acc[...] += lax.dot_general(p.astype(bf16), g, (((0,), (0,)), ((), ())), preferred_element_type=f32)
        dp = lax.dot_general(g, v_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=f32)
        di = jnp.sum(g.astype(f32) * o_ref[...].astype(f32), axis=1, keepdims=True)
        ds = p * (dp - di)
        dk_acc[...] += lax.dot_general(ds.astype(bf16), q, (((0,), (0,)), ((), ())), preferred_element_type=f32)

    @pl.when(i == pl.num_programs(2) - 1)
    def _():
        dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def flash_attention_dkv(q, k, v, o, lse, g, causal=False, bq=128, bk=128):
    bh, seq, d = q.shape
    q_block = (lambda b, j, i: (b, jnp.maximum(i, lax.div(j * bk, bq)), 0)) if causal else (lambda b, j, i: (b, i, 0))
    rows = lambda w: pl.BlockSpec((None, bq, w), q_block)
    keys = pl.BlockSpec((None, bk, d), lambda b, j, i: (b, j, 0))
    return pl.pallas_call(
        functools.partial(_flash_dkv_kernel, causal=causal, scale=1.0 / d ** 0.5),
        out_shape=[S(q.shape, q.dtype), S(q.shape, q.dtype)], grid=(bh, seq // bk, seq // bq),
        in_specs=[rows(d), keys, keys, rows(d), rows(128), rows(d)], out_specs=[keys, keys],
        scratch_shapes=[pltpu.VMEM((bk, d), f32), pltpu.VMEM((bk, d), f32)],
        compiler_params=_params("parallel", "parallel", "arbitrary"), name="flash_attention_dkv_kernel")(
            q, k, v, o, lse, g)


def _flash_dq_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, g_ref, dq_ref, dq_acc, di_ref, *, causal, scale):
    bq, bk = q_ref.shape[0], k_ref.shape[0]
    i, j = pl.program_id(1), pl.program_id(2)

    @pl.when(j == 0)
    def _():
        dq_acc[...] = jnp.zeros(dq_acc.shape, f32)
        di = jnp.sum(g_ref[...].astype(f32) * o_ref[...].astype(f32), axis=1, keepdims=True)
        di_ref[...] = jnp.broadcast_to(di, di_ref.shape)

    @pl.when((j * bk < (i + 1) * bq) | (not causal))
    def _():
        k = k_ref[...]
        s = _flash_scores(q_ref[...], k, i, j, causal, scale)
        p = jnp.exp(s - lse_ref[...][:, 0:1])
        dp = lax.dot_general(g_ref[...], v_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=f32)
        ds = p * (dp - di_ref[...][:, 0:1])
        dq_acc[...] += jnp.dot(ds.astype(bf16), k, preferred_element_type=f32)

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        dq_ref[...] = (dq_acc[...] * scale).astype(dq_ref.dtype)


def flash_attention_dq(q, k, v, o, lse, g, causal=False, bq=128, bk=128):
    bh, seq, d = q.shape
    kv_block = (lambda b, i, j: (b, jnp.minimum(j, lax.div((i + 1) * bq - 1, bk)), 0)) if causal else (
        lambda b, i, j: (b, j, 0))
    rows = lambda w: pl.BlockSpec((None, bq, w), lambda b, i, j: (b, i, 0))
    kv = pl.BlockSpec((None, bk, d), kv_block)
    return pl.pallas_call(
        functools.partial(_flash_dq_kernel, causal=causal, scale=1.0 / d ** 0.5),
        out_shape=S(q.shape, q.dtype), grid=(bh, seq // bq, seq // bk),
        in_specs=[rows(d), kv, kv, rows(d), rows(128), rows(d)], out_specs=rows(d),
        scratch_shapes=[pltpu.VMEM((bq, d), f32), pltpu.VMEM((bq, 128), f32)],
        compiler_params=_params("parallel", "parallel", "arbitrary"), name="flash_attention_dq_kernel")(
            q, k, v, o, lse, g)


#: The flash attention backward kernels' twins, at the example's shapes, for LLO/bundle parity.
FLASH_BACKWARD = {
    "flash_attention_dkv": (flash_attention_dkv, [S((2, 1024, 128), bf16)] * 4 + [S((2, 1024, 128), f32),
                                                                                 S((2, 1024, 128), bf16)]),
    "flash_attention_dq": (flash_attention_dq, [S((2, 1024, 128), bf16)] * 4 + [S((2, 1024, 128), f32),
                                                                               S((2, 1024, 128), bf16)]),
}


# -- values: the values real kernels build (examples/values.rs): where on a scalar, full of a traced
# scalar, concatenate on lanes and sublanes, roll, argmax/argmin
def _values_kernel(x_ref, o_ref, idx_ref):
    a = x_ref[...]
    i = pl.program_id(0)
    b = jnp.where(i == 0, a * 2.0, a + 1.0)
    c = b + jnp.full(a.shape, i * 3).astype(f32)
    lanes = jnp.concatenate([c[:, 128:], c[:, :128]], axis=1)
    rows = jnp.concatenate([c[8:], c[:8]], axis=0)
    o_ref[...] = pltpu.roll(lanes, 1, 1) + pltpu.roll(rows, i + 1, 0)
    idx_ref[...] = jnp.argmax(a, axis=1)[:, None] * 1000 + jnp.argmin(a, axis=0)[None, :]


def values(x, bm=16):
    m, n = x.shape
    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return pl.pallas_call(_values_kernel, out_shape=(S(x.shape, f32), S(x.shape, i32)), grid=(m // bm,),
                          in_specs=[spec], out_specs=(spec, spec), compiler_params=_params("parallel"),
                          name="values_kernel")(x)


def _values_ref(x, bm=16):
    m, n = x.shape
    blocks = x.reshape(m // bm, bm, n)
    i = jnp.arange(m // bm)[:, None, None]
    c = jnp.where(i == 0, blocks * 2.0, blocks + 1.0) + (i * 3).astype(f32)
    o = jnp.roll(jnp.roll(c, n // 2, axis=2), 1, axis=2)
    rows = jnp.roll(c, bm // 2, axis=1)
    rows = jnp.stack([jnp.roll(rows[k], k + 1, axis=0) for k in range(m // bm)])
    idx = jnp.argmax(blocks, axis=2)[:, :, None] * 1000 + jnp.argmin(blocks, axis=1)[:, None, :]
    return (o + rows).reshape(m, n), idx.reshape(m, n)

# -- ring_all_gather (SPMD): each device's [m, k] shard gathered along mesh axis `axis` in a ring of
# remote copies between the devices' HBM outputs, after a barrier handshake with both neighbours; each
# slot lands on a receive semaphore of its own
def _ring_all_gather_kernel(x_hbm, o_hbm, local, send, recv, *, axis):
    n = lax.axis_size(axis)
    me = lax.axis_index(axis)
    right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
    m = x_hbm.shape[0]
    own = pltpu.make_async_copy(x_hbm, o_hbm.at[pl.ds(me * m, m)], local)
    own.start()
    own.wait()
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis: left})
    pl.semaphore_signal(barrier, 1, device_id={axis: right})
    pl.semaphore_wait(barrier, 2)

    def step(i, carry):
        out = lax.rem(me - i + n, n)
        sent = pltpu.make_async_remote_copy(o_hbm.at[pl.ds(out * m, m)], o_hbm.at[pl.ds(out * m, m)], send,
                                            recv.at[out], device_id={axis: right})
        sent.start()
        sent.wait_send()
        inn = lax.rem(me - i - 1 + n, n)
        got = pltpu.make_async_remote_copy(o_hbm.at[pl.ds(inn * m, m)], o_hbm.at[pl.ds(inn * m, m)], send,
                                           recv.at[inn], device_id={axis: left})
        got.wait_recv()
        return carry

    lax.fori_loop(0, n - 1, step, 0)


def ring_all_gather(x, axis="x"):
    """Per device, inside jax.shard_map over a mesh with axis `axis`."""
    m, k = x.shape
    n = lax.axis_size(axis)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(functools.partial(_ring_all_gather_kernel, axis=axis),
                          out_shape=S((n * m, k), x.dtype), in_specs=[any_spec], out_specs=any_spec,
                          scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                                          pltpu.SemaphoreType.DMA((n,))],
                          compiler_params=pltpu.CompilerParams(collective_id=0),
                          name="ring_all_gather_kernel")(x)


# -- ring_reduce_scatter (SPMD): device i ends with block i of the sum of every device's [n * m, k]
# array; each step sends a partial to the right and adds this device's rows to the one from the left,
# every step with send and receive buffers (VMEM scratch) and a receive semaphore of its own
def _ring_reduce_scatter_kernel(x_ref, o_ref, send_buf, recv_buf, send, recv, *, axis):
    n = lax.axis_size(axis)
    me = lax.axis_index(axis)
    m = o_ref.shape[0]
    right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis: left})
    pl.semaphore_signal(barrier, 1, device_id={axis: right})
    pl.semaphore_wait(barrier, 2)
    send_buf[0] = x_ref[pl.ds(lax.rem(me + n - 1, n) * m, m)]

    def step(s, carry):
        sent = pltpu.make_async_remote_copy(send_buf.at[s], recv_buf.at[s], send, recv.at[s],
                                            device_id={axis: right})
        sent.start()
        sent.wait_send()
        got = pltpu.make_async_remote_copy(send_buf.at[s], recv_buf.at[s], send, recv.at[s],
                                           device_id={axis: left})
        got.wait_recv()
        block = lax.rem(me - s + 2 * n - 2, n)
        partial = recv_buf[s] + x_ref[pl.ds(block * m, m)]

        @pl.when(s + 1 < n - 1)
        def _():
            send_buf[s + 1] = partial

        @pl.when(s + 1 == n - 1)
        def _():
            o_ref[...] = partial

        return carry

    lax.fori_loop(0, n - 1, step, 0)


def ring_reduce_scatter(x, axis="x"):
    rows, k = x.shape
    n = lax.axis_size(axis)
    m = rows // n
    whole = lambda shape: pl.BlockSpec(shape, lambda: (0, 0))  # noqa: E731
    return pl.pallas_call(functools.partial(_ring_reduce_scatter_kernel, axis=axis),
                          out_shape=S((m, k), x.dtype), in_specs=[whole((rows, k))], out_specs=whole((m, k)),
                          scratch_shapes=[pltpu.VMEM((n - 1, m, k), x.dtype), pltpu.VMEM((n - 1, m, k), x.dtype),
                                          pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA((n - 1,))],
                          compiler_params=pltpu.CompilerParams(collective_id=0),
                          name="ring_reduce_scatter_kernel")(x)


# The SPMD examples' twins: name -> (pallas_fn, the per-device ShapeDtypeStruct inputs on n devices,
# mesh axis name, the inputs' PartitionSpecs along it, the output's). Each runs inside jax.shard_map
# over a 1-axis mesh of every device of a topology.
SPMD = {
    "ring_all_gather": (ring_all_gather, lambda n: [S((8, 128), f32)], "x", ["x"], None),
    "ring_reduce_scatter": (ring_reduce_scatter, lambda n: [S((8 * n, 128), f32)], "x", ["x"], "x"),
}


KERNELS = {
    "add": (add, [S((1024, 1024), f32), S((1024, 1024), f32)]),
    "matmul": (matmul, [S((512, 512), bf16), S((512, 512), bf16)]),
    "softmax": (softmax, [S((1024, 1024), f32)]),
    "rmsnorm": (rmsnorm, [S((1024, 1024), bf16), S((1, 1024), f32)]),
    "causal_mask": (causal_mask, [S((512, 512), f32)]),
    "fori_rowsum": (fori_rowsum, [S((256, 1024), f32)]),
    "transpose": (transpose, [S((512, 512), f32)]),
    "colsum": (colsum, [S((1024, 256), f32)]),
    "ops_tour": (ops_tour, [S((256, 128), f32), S((128, 128), f32)]),
    "activations": (activations, [S((256, 512), f32), S((256, 512), f32), S((256, 512), i32)]),
    "gather_prefetch": (gather_prefetch, [S((4,), i32), S((64, 256), f32)]),
    "dma_double": (dma_double, [S((512, 128), f32)]),
    "inplace_scale": (inplace_scale, [S((256, 256), f32)]),
    "strided": (strided, [S((512, 128), f32)]),
    "paged_gather": (paged_gather, [S((8, 8), i32), S((64, 16, 128), f32)]),
    "grouped_matmul": (grouped_matmul, [S((5,), i32), S((7,), i32), S((7,), i32), S((512, 512), bf16),
                                        S((4, 512, 512), bf16)]),
    "paged_attention": (paged_attention, [S((8,), i32), S((8, 32), i32), S((8, 16, 128), bf16),
                                          S((2, 256, 16, 128), bf16), S((2, 256, 16, 128), bf16)]),
    "quantized_matmul": (quantized_matmul, [S((256, 512), bf16), S((512, 512), i8), S((1, 512), f32)]),
    "quantized_matmul_w8a8": (quantized_matmul_w8a8, [S((256, 512), i8), S((256, 1), f32), S((512, 512), i8),
                                                      S((1, 512), f32)]),
    "flash_attention": (flash_attention, [S((2, 1024, 128), bf16)] * 3),
    "values": (values, [S((64, 256), f32)]),
    "ragged_paged_attention": pallas_rpa.KERNEL,
}


# Operands whose values must be in range (block tables): operand index -> exclusive upper bound.
INDEX_OPERANDS = {"gather_prefetch": {0: 8}, "paged_gather": {0: 64}}


# Kernels whose first operands are group metadata (offsets, group ids, m tiles) for the rows of the
# operand `lhs` in `tm`-row tiles: name -> (lhs operand index, tm). Random group sizes summing to m.
GROUP_OPERANDS = {"grouped_matmul": (3, 128)}


# Kernels whose first operands are sequence lengths and a block table over the pages of the operand
# `k_pages` ([kv heads, total pages, page size, head dim]): name -> k_pages operand index.
PAGED_OPERANDS = {"paged_attention": 3}


def valid_inputs(name, xs):
    """Random inputs made valid for kernel `name`: table operands folded into their range; group
    metadata rebuilt from group sizes cut at random rows (taken from the random offsets, so groups may be
    empty and boundaries fall inside tiles); sequence lengths and block tables made ragged and in range
    (`paged_attention_inputs`)."""
    xs = list(xs)
    if name == "ragged_paged_attention":
        return pallas_rpa.valid_inputs(xs)
    for i, hi in INDEX_OPERANDS.get(name, {}).items():
        xs[i] = jnp.mod(xs[i], hi).astype(xs[i].dtype)
    if name in GROUP_OPERANDS:
        lhs, tm = GROUP_OPERANDS[name]
        m = xs[lhs].shape[0]
        cuts = jnp.sort(jnp.mod(xs[0][1:-1], m + 1))
        sizes = jnp.diff(jnp.concatenate([jnp.zeros((1,), i32), cuts, jnp.full((1,), m, i32)]))
        xs[:3] = group_metadata(sizes.astype(i32), m, tm)
    if name in PAGED_OPERANDS:
        _, total_pages, page_size, _ = xs[PAGED_OPERANDS[name]].shape
        xs[:2] = paged_attention_inputs(xs[0], xs[1], total_pages, page_size)
    return xs


# -- the same math in plain jnp, compiled by XLA: the fused baseline of the parity benchmark
def _ops_tour_ref(x, w, bm=64):
    m, n = x.shape
    g = 0.5 * x * (1.0 + jnp.tanh(0.7978846 * (x + 0.044715 * x * x * x)))
    s = (g @ w.T).reshape(m // bm, bm, n)
    even = (jnp.arange(m // bm) % 2 == 0)[:, None, None]
    v = jnp.where(even, s * 2.0, s)
    for _ in range(3):
        v = jnp.maximum(v * 0.5, -1.0)
    row = lax.broadcasted_iota(i32, (m // bm, bm, n), 1) + bm * lax.broadcasted_iota(i32, (m // bm, bm, n), 0)
    col = lax.broadcasted_iota(i32, (m // bm, bm, n), 2)
    keep = (row >= col) & (col % 2 == 0)
    kept = jnp.sum(keep.astype(i32), axis=1, keepdims=True)
    o = jnp.where(keep, v, 0.0) + kept.astype(f32) * 0.001
    return o.reshape(m, n), jnp.broadcast_to(kept, (m // bm, 8, n)).reshape(-1, n)


REFERENCES = {
    "add": lambda x, y: x + y,
    "matmul": lambda x, y: jnp.dot(x, y, preferred_element_type=f32).astype(x.dtype),
    "softmax": lambda x: jax.nn.softmax(x, axis=-1),
    "rmsnorm": lambda x, w: (x.astype(f32) * lax.rsqrt(jnp.mean(jnp.square(x.astype(f32)), -1, keepdims=True) + 1e-6)
                             * w).astype(x.dtype),
    "causal_mask": lambda x: jnp.where(lax.broadcasted_iota(i32, x.shape, 0) >= lax.broadcasted_iota(i32, x.shape, 1),
                                       x * 0.125, -jnp.inf),
    "fori_rowsum": lambda x: x.reshape(x.shape[0] // 8, 8, x.shape[1]).sum(axis=0),
    "transpose": lambda x: x.T,
    "colsum": lambda x: jnp.broadcast_to(jnp.sum(x, axis=0, keepdims=True), (8, x.shape[1])),
    "ops_tour": _ops_tour_ref,
    "activations": _activations_math,
    "gather_prefetch": lambda idx, x: (x.reshape(-1, 8, x.shape[1])[idx] * 2.0).reshape(-1, x.shape[1]),
    "dma_double": lambda x: x * 2.0,
    "inplace_scale": lambda x: x * 3.0,
    "strided": lambda x: jnp.stack([x[0::2] + x[1::2], x[0::2] - x[1::2]], axis=1).reshape(x.shape),
    "paged_gather": lambda table, pages: pages[table].sum(axis=1).reshape(-1, pages.shape[2]),
    "grouped_matmul": _grouped_matmul_ref,
    "paged_attention": _paged_attention_ref,
    "quantized_matmul": lambda x, w, s: (jnp.dot(x, w.astype(bf16), preferred_element_type=f32) * s).astype(bf16),
    "quantized_matmul_w8a8": lambda x, xs, w, ws: (jnp.dot(x, w, preferred_element_type=i32).astype(f32) * xs * ws
                                                   ).astype(bf16),
    "flash_attention": attention_ref,
    "values": _values_ref,
    "ragged_paged_attention": pallas_rpa.reference,
}

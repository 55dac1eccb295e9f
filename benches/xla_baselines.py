"""Baselines for `cargo bench --bench interpret`: XLA:CPU (`jax.jit` of the jnp computation) and Pallas
`interpret=True` (the same kernels as examples/, written in Pallas), on the same shapes.

Batch mode prints one line per case: `<case> <xla median ms> <pallas interpret median ms> <xla min ms>`.
With `--serve` it reads requests from stdin, one per line, and answers each with one line:
`xla <case>` -> `<median ms> <min ms>`, `pallas <case>` -> `<median ms> <min ms>` (so the benchmark can
interleave XLA and its own runs in time); the ragged paged attention cases (benches/rpa_cpu.py) also
answer `best <case>` (the best jnp formulation; their `xla` is tpu-inference's reference) and have no
Pallas run. Inputs are numpy-generated;
numpy does no timed work here, so OPENBLAS_CORETYPE does not matter.

The production kernels (`EXAMPLE_CASES`) run their Pallas twins from python/tests/pallas_kernels.py, on
that file's example shapes and valid inputs; their XLA baseline is the natural jnp program for the same
math, written here. pallas_kernels.py imports `tpu_kernel.examples`: install the package or build the
examples library (`cargo build --release -p tpu-kernel-examples`; see repo_python.py).

usage: python xla_baselines.py [--quick] [--ops]
"""
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
import repo_python  # noqa: E402

repo_python.setup()
import pallas_kernels  # noqa: E402  (the Pallas twins of the examples)

QUICK = "--quick" in sys.argv


# ---------------------------------------------------------------- kernels (as in examples/)
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add_pallas(x, y, bm=256, bn=256):
    m, n = x.shape
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(
        add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(m // bm, n // bn),
        in_specs=[spec, spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=True)(x, y)


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _fin():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_pallas(x, y, b=128):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // b, n // b, k // b),
        in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)), pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=True)(x, y)


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax_pallas(x, br=8):
    m, n = x.shape
    spec = pl.BlockSpec((br, n), lambda i: (i, 0))
    return pl.pallas_call(
        softmax_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(m // br,),
        in_specs=[spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(x)


def rmsnorm_kernel(x_ref, w_ref, o_ref, eps=1e-6):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    o_ref[...] = (x * lax.rsqrt(ms + eps) * w_ref[...]).astype(o_ref.dtype)


def rmsnorm_pallas(x, w, br=16):
    m, n = x.shape
    return pl.pallas_call(
        rmsnorm_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(m // br,),
        in_specs=[pl.BlockSpec((br, n), lambda i: (i, 0)), pl.BlockSpec((1, n), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((br, n), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(x, w)


def gelu_erf_kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = 0.5 * x * (1.0 + lax.erf(x * 0.70710677))


def swiglu_kernel(x_ref, g_ref, o_ref):
    g = g_ref[...]
    o_ref[...] = g * jax.nn.sigmoid(g) * x_ref[...]


def softcap_kernel(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...] * (1.0 / 30.0)) * 30.0


def rotary_kernel(x1_ref, x2_ref, pos_ref, freq_ref, o1_ref, o2_ref):
    theta = pos_ref[...] * freq_ref[...]
    c, s = jnp.cos(theta), jnp.sin(theta)
    a, b = x1_ref[...], x2_ref[...]
    o1_ref[...] = a * c - b * s
    o2_ref[...] = b * c + a * s


def rows_pallas(kernel, n_in, n_out, br):
    """An elementwise Pallas kernel over `br`-row blocks of f32 [m, n] operands."""
    def call(*args):
        m, n = args[0].shape
        spec = pl.BlockSpec((br, n), lambda i: (i, 0))
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(m // br,),
            in_specs=[spec] * n_in, out_specs=spec,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(*args)
    return call


def rotary_pallas(x1, x2, pos, freq, br=256):
    m, h = x1.shape
    spec = pl.BlockSpec((br, h), lambda i: (i, 0))
    shape = jax.ShapeDtypeStruct((m, h), jnp.float32)
    return pl.pallas_call(
        rotary_kernel, out_shape=(shape, shape), grid=(m // br,),
        in_specs=[spec, spec, pl.BlockSpec((br, 1), lambda i: (i, 0)), pl.BlockSpec((1, h), lambda i: (0, 0))],
        out_specs=(spec, spec),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(x1, x2, pos, freq)


def activations_kernel(x_ref, g_ref, c_ref, o_ref, p_ref):
    o_ref[...], p_ref[...] = activations_jnp(x_ref[...], g_ref[...], c_ref[...])


def activations_pallas(x, g, codes, br=8):
    m, n = x.shape
    spec = pl.BlockSpec((br, n), lambda i: (i, 0))
    return pl.pallas_call(
        activations_kernel,
        out_shape=(jax.ShapeDtypeStruct((m, n), jnp.float32), jax.ShapeDtypeStruct((m, n), jnp.int32)),
        grid=(m // br,), in_specs=[spec] * 3, out_specs=(spec, spec),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)), interpret=True)(x, g, codes)


# ---------------------------------------------------------------- jnp references (what XLA:CPU runs)
def matmul_jnp(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def softmax_jnp(x):
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def rmsnorm_jnp(x, w, eps=1e-6):
    xf = x.astype(jnp.float32)
    return (xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * w).astype(x.dtype)


def add_jnp(x, y):
    return x + y


def gelu_erf_jnp(x):
    return 0.5 * x * (1.0 + lax.erf(x * 0.70710677))


def swiglu_jnp(x, g):
    return g * jax.nn.sigmoid(g) * x


def softcap_jnp(x):
    return jnp.tanh(x * (1.0 / 30.0)) * 30.0


def rotary_jnp(x1, x2, pos, freq):
    theta = pos * freq
    c, s = jnp.cos(theta), jnp.sin(theta)
    return x1 * c - x2 * s, x2 * c + x1 * s


def activations_jnp(x, g, codes):
    """examples/activations.rs in jnp."""
    gelu = 0.5 * x * (1.0 + lax.erf(x * 0.70710677))
    swiglu = g * jax.nn.sigmoid(g) * x
    capped = jnp.tanh(swiglu * 0.1) * 10.0
    shaped = (jnp.log1p(jnp.abs(x)) + jnp.expm1(x * 0.25) + jnp.round(x * 2.5) - jnp.floor(x) + jnp.ceil(x)) \
        * jnp.sign(x)
    y = gelu + capped + jnp.clip(shaped, -4.0, 4.0)
    packed = ((codes << 3) >> 5) ^ (codes & 255) | (codes >> 31)
    return jnp.where(jnp.isnan(y), 0.0, y), packed


rng = np.random.default_rng(0)


def uni(shape, dtype):
    return jnp.asarray(rng.uniform(-1, 1, size=shape).astype(np.float32)).astype(dtype)


CASES = {
    "matmul_bf16_256": (matmul_jnp, matmul_pallas, lambda: [uni((256, 256), jnp.bfloat16), uni((256, 256), jnp.bfloat16)]),
    "matmul_bf16_512": (matmul_jnp, matmul_pallas, lambda: [uni((512, 512), jnp.bfloat16), uni((512, 512), jnp.bfloat16)]),
    "matmul_bf16_1024": (matmul_jnp, matmul_pallas, lambda: [uni((1024, 1024), jnp.bfloat16), uni((1024, 1024), jnp.bfloat16)]),
    "softmax_f32_1024": (softmax_jnp, softmax_pallas, lambda: [uni((1024, 1024), jnp.float32)]),
    "rmsnorm_bf16_1024": (rmsnorm_jnp, rmsnorm_pallas, lambda: [uni((1024, 1024), jnp.bfloat16), uni((1, 1024), jnp.float32)]),
    "add_f32_1024": (add_jnp, add_pallas, lambda: [uni((1024, 1024), jnp.float32), uni((1024, 1024), jnp.float32)]),
    # Input scales as in benches/interpret.rs (`case_inputs`).
    "gelu_erf_f32_1024": (gelu_erf_jnp, rows_pallas(gelu_erf_kernel, 1, 1, 32),
                          lambda: [uni((1024, 1024), jnp.float32) * 3.0]),
    "swiglu_f32_1024": (swiglu_jnp, rows_pallas(swiglu_kernel, 2, 1, 32),
                        lambda: [uni((1024, 1024), jnp.float32), uni((1024, 1024), jnp.float32) * 4.0]),
    "softcap_f32_1024": (softcap_jnp, rows_pallas(softcap_kernel, 1, 1, 32),
                         lambda: [uni((1024, 1024), jnp.float32) * 40.0]),
    "rotary_f32_4096": (rotary_jnp, rotary_pallas,
                        lambda: [uni((4096, 128), jnp.float32), uni((4096, 128), jnp.float32),
                                 jnp.arange(4096, dtype=jnp.float32).reshape(4096, 1),
                                 (10000.0 ** (-jnp.arange(128, dtype=jnp.float32) / 128)).reshape(1, 128)]),
    "activations_f32_256": (activations_jnp, activations_pallas,
                            lambda: [uni((256, 512), jnp.float32), uni((256, 512), jnp.float32),
                                     jnp.asarray(rng.integers(-8, 8, size=(256, 512)).astype(np.int32))]),
}


# ---------------------------------------------------------------- production kernels at their example shapes
# One entry per kernel (benches/interpret.rs `EXAMPLE_CASES` holds the same names): example name -> the
# jnp program XLA:CPU runs, taking the kernel's inputs. The Pallas side is the example's twin in
# python/tests/pallas_kernels.py (`KERNELS`: function and input shapes; `valid_inputs` for tables),
# traced with interpret=True.
def quantized_matmul_jnp(x, w, scale):
    return (jnp.dot(x, w.astype(jnp.bfloat16), preferred_element_type=jnp.float32) * scale).astype(jnp.bfloat16)


def quantized_matmul_w8a8_jnp(x, x_scale, w, w_scale):
    acc = jnp.dot(x, w, preferred_element_type=jnp.int32)
    return (acc.astype(jnp.float32) * x_scale * w_scale).astype(jnp.bfloat16)


def grouped_matmul_jnp(offsets, group_ids, m_tiles, lhs, rhs):
    """`jax.lax.ragged_dot` on the group sizes (the visit tables are the kernel's business). XLA:CPU
    expands it to one dense dot of the lhs masked per group, `[m, G·k] @ [G·k, n]`: G times the flops."""
    sizes = offsets[1:] - offsets[:-1]
    return lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32).astype(lhs.dtype)


def flash_attention_jnp(q, k, v):
    """softmax(q kᵀ / sqrt(d)) v per head: bf16 matmuls accumulating in f32, the softmax in f32, its
    probabilities rounded to bf16 for the second matmul (as the kernel does)."""
    s = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("hqk,hkd->hqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(q.dtype)


def paged_attention_jnp(lengths, page_indices, q, k_pages, v_pages):
    """Decode attention over a paged KV cache (q pre-scaled, as the kernel takes it): each sequence's
    pages gathered by its block table, scores past its length masked, softmax, p·v (bf16 matmuls
    accumulating in f32; GQA by grouping the query heads of a kv head)."""
    batch, heads, d = q.shape
    kv_heads = k_pages.shape[0]
    k = k_pages[:, page_indices].reshape(kv_heads, batch, -1, d)
    v = v_pages[:, page_indices].reshape(kv_heads, batch, -1, d)
    qg = q.reshape(batch, kv_heads, heads // kv_heads, d)
    s = jnp.einsum("bhgd,hbtd->bhgt", qg, k, preferred_element_type=jnp.float32)
    valid = jnp.arange(s.shape[-1]) < lengths[:, None, None, None]
    s = jnp.where(valid, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(valid, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    o = jnp.einsum("bhgt,hbtd->bhgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    o = o / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
    return o.reshape(batch, heads, d).astype(q.dtype)


EXAMPLE_CASES = {
    "quantized_matmul": quantized_matmul_jnp,
    "quantized_matmul_w8a8": quantized_matmul_w8a8_jnp,
    "grouped_matmul": grouped_matmul_jnp,
    "flash_attention": flash_attention_jnp,
    "paged_attention": paged_attention_jnp,
}


@contextlib.contextmanager
def _pallas_interpret():
    """Every `pallas_call` traced inside runs as with `interpret=True` (the twins do not take the flag;
    this is the switch behind `pltpu.force_tpu_interpret_mode`, set to the plain interpreter)."""
    from jax._src import config
    flag = config.pallas_tpu_interpret_mode_context_manager
    prev = flag.swap_local(True)
    try:
        yield
    finally:
        flag.set_local(prev)


def _twin_interpreted(name):
    twin, _ = pallas_kernels.KERNELS[name]

    def call(*args):
        with _pallas_interpret():
            return twin(*args)
    return call


def _random(s):
    if jnp.issubdtype(s.dtype, jnp.floating):
        return uni(s.shape, s.dtype)
    info = jnp.iinfo(s.dtype)
    return jnp.asarray(rng.integers(info.min, info.max, size=s.shape, endpoint=True).astype(s.dtype))


def _example_inputs(name):
    _, shapes = pallas_kernels.KERNELS[name]
    return lambda: pallas_kernels.valid_inputs(name, [_random(s) for s in shapes])


for _name, _jnp in EXAMPLE_CASES.items():
    CASES[_name] = (_jnp, _twin_interpreted(_name), _example_inputs(_name))


def _interpreted(twin):
    def call(*args):
        with _pallas_interpret():
            return twin(*args)
    return call


# Where users are (issue 22; the same names in benches/interpret.rs): a small matmul, flash attention
# at [4, 512, 128], an int8-weight dequant matmul at 256x512x256, rows 8 lanes wide.
CASES["matmul_bf16_128"] = (matmul_jnp, matmul_pallas,
                            lambda: [uni((128, 128), jnp.bfloat16), uni((128, 128), jnp.bfloat16)])
CASES["flash_attention_4x512"] = (
    flash_attention_jnp, _interpreted(pallas_kernels.flash_attention),
    lambda: [uni((4, 512, 128), jnp.bfloat16) for _ in range(3)])
CASES["quantized_matmul_256x512x256"] = (
    quantized_matmul_jnp, _interpreted(pallas_kernels.quantized_matmul),
    lambda: [uni((256, 512), jnp.bfloat16), _random(jax.ShapeDtypeStruct((512, 256), jnp.int8)),
             uni((1, 256), jnp.float32)])
CASES["softmax_lanes8"] = (softmax_jnp, lambda x: softmax_pallas(x, br=256),
                           lambda: [uni((8192, 8), jnp.float32)])

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _paged_wait_once_kernel(lengths_ref, page_indices_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems):
    """benches/interpret/paged_once.rs in Pallas: every group copies all its pages (past the last one,
    the last one again, masked by position) and waits once per slot for the whole slot."""
    f32 = jnp.float32
    b, h = pl.program_id(0), pl.program_id(1)
    _, per_group, page_size, _ = k_buf.shape
    heads, head_dim = q_ref.shape
    tokens = per_group * page_size
    length = lengths_ref[b]
    n_pages = lax.div(length + (page_size - 1), page_size)
    n_groups = lax.div(length + (tokens - 1), tokens)

    def start_slot(g, slot):
        def copy(j, carry):
            page = page_indices_ref[b, jnp.minimum(g * per_group + j, n_pages - 1)]
            pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[slot, j], sems.at[0, slot]).start()
            pltpu.make_async_copy(v_hbm.at[h, page], v_buf.at[slot, j], sems.at[1, slot]).start()
            return carry

        lax.fori_loop(0, per_group, copy, None)

    @pl.when(n_groups > 0)
    def _():
        start_slot(0, 0)

    q = q_ref[...]

    def body(g, carry):
        m, l, acc = carry
        slot = lax.rem(g, 2)

        @pl.when(g + 1 < n_groups)
        def _():
            start_slot(g + 1, 1 - slot)

        pltpu.make_async_copy(k_buf.at[slot], k_buf.at[slot], sems.at[0, slot]).wait()
        pltpu.make_async_copy(v_buf.at[slot], v_buf.at[slot], sems.at[1, slot]).wait()
        k = k_buf[slot].reshape(tokens, head_dim)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=f32)
        position = lax.broadcasted_iota(jnp.int32, (heads, tokens), 1) + g * tokens
        s = jnp.where(position < length, s, _MASK_VALUE)
        m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m - m_next)
        p = jnp.exp(s - m_next)
        l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
        v = v_buf[slot].reshape(tokens, head_dim)
        acc = acc * alpha + jnp.dot(p.astype(jnp.bfloat16), v, preferred_element_type=f32)
        return m_next, l, acc

    init = (jnp.full((heads, 1), -jnp.inf, f32), jnp.zeros((heads, 1), f32), jnp.zeros((heads, head_dim), f32))
    _, l, acc = lax.fori_loop(0, n_groups, body, init)
    o_ref[...] = (acc / jnp.maximum(l, 1.0)).astype(o_ref.dtype)


def paged_wait_once_pallas(lengths, page_indices, q, k_pages, v_pages, per_group=8):
    batch, heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = heads // kv_heads
    q_spec = pl.BlockSpec((pl.Squeezed(), group, head_dim), lambda b, h, *_: (b, h, 0))
    buf = pltpu.VMEM((2, per_group, page_size, head_dim), k_pages.dtype)
    return pl.pallas_call(
        _paged_wait_once_kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(batch, kv_heads),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec, scratch_shapes=[buf, buf, pltpu.SemaphoreType.DMA((2, 2))]),
        name="paged_attention_kernel")(lengths, page_indices, q, k_pages, v_pages)


# A paged decode that waits once per slot (benches/interpret/paged_once.rs): the example's inputs.
CASES["paged_decode_wait_once"] = (paged_attention_jnp, _interpreted(paged_wait_once_pallas),
                                   _example_inputs("paged_attention"))


def _step_copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * (pl.program_id(0) + 1).astype(jnp.float32)


def step_copy_jnp(x):
    m, n = x.shape
    k = (jnp.arange(m // 8, dtype=jnp.float32) + 1.0)[:, None, None]
    return (x.reshape(m // 8, 8, n) * k).reshape(m, n)


# The per-step cost: a copy over 1024 blocks of [8, 128] that reads its grid index (benches/interpret.rs).
CASES["step_copy_1024x8x128"] = (step_copy_jnp, rows_pallas(_step_copy_kernel, 1, 1, 8),
                                 lambda: [uni((1024 * 8, 128), jnp.float32)])


# Ragged paged attention on a decode step and a mixed batch (issue 23 item 4; benches/rpa_cpu.py): "xla" is
# tpu-inference's own jnp reference under jax.jit, "best" the best jnp formulation found (both XLA:CPU).
# No Pallas: neither of jax's CPU interpreters runs the kernel (interpret=True refuses its DMA sizes
# known only at run time, the TPU simulator its ref reshape views).
import rpa_cpu  # noqa: E402


def _no_pallas(*_args):
    raise NotImplementedError("Pallas interpret=True cannot run ragged paged attention "
                              "(DMA sizes known only at run time)")


BEST = {}
for _name in rpa_cpu.BATCHES:
    CASES[_name] = (rpa_cpu.reference(_name), _no_pallas, lambda _name=_name: rpa_cpu.inputs(_name))
    BEST[_name] = rpa_cpu.best(_name)


# `--ops` of benches/interpret.rs: each float op of the op table alone, inputs in (0.5, 4.5).
def _op_inputs(n):
    return lambda: [uni((1024, 1024), jnp.float32) * 2.0 + 2.5 for _ in range(n)]


OPS = {
    "neg": lambda x: -x, "abs": jnp.abs, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "exp": jnp.exp, "log": jnp.log,
    "tanh": jnp.tanh, "sin": jnp.sin, "cos": jnp.cos, "erf": lax.erf, "log1p": jnp.log1p,
    "logistic": jax.nn.sigmoid, "floor": jnp.floor, "ceil": jnp.ceil, "round": jnp.round,
}
BINARY_OPS = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide, "rem": lax.rem,
    "max": jnp.maximum, "min": jnp.minimum, "pow": jnp.power,
}


def _op_pallas(f, n):
    def kernel(*refs):
        refs[-1][...] = f(*(r[...] for r in refs[:-1]))
    return rows_pallas(kernel, n, 1, 64)


for _name, _f in OPS.items():
    CASES["op_" + _name] = (_f, _op_pallas(_f, 1), _op_inputs(1))
for _name, _f in BINARY_OPS.items():
    CASES["op_" + _name] = (_f, _op_pallas(_f, 2), _op_inputs(2))


def times_ms(f, args, budget_s):
    jax.block_until_ready(f(*args))  # compile + warm up
    jax.block_until_ready(f(*args))
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def serve(budget):
    jitted, inputs = {}, {}
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 2 or parts[1] not in CASES or (parts[0] == "best" and parts[1] not in BEST):
            print("error", flush=True)
            continue
        engine, name = parts
        ref, kernel, make = CASES[name]
        try:
            if name not in inputs:
                inputs[name] = make()
            key = (engine, name)
            if key not in jitted:
                jitted[key] = jax.jit({"xla": ref, "best": BEST.get(name)}.get(engine, kernel))
            med, mn = times_ms(jitted[key], inputs[name], budget)
        except Exception as e:  # the bench prints the failure instead of a figure
            print(f"error {type(e).__name__}: {e}".replace("\n", " "), flush=True)
            continue
        print(f"{med:.6f} {mn:.6f}", flush=True)


def main():
    budget = 0.3 if QUICK else 1.0
    if "--serve" in sys.argv:
        serve(budget)
        return
    for name, (ref, kernel, make) in CASES.items():
        if name.startswith("op_") != ("--ops" in sys.argv):
            continue
        args = make()
        xla, xla_min = times_ms(jax.jit(ref), args, budget)
        pallas = times_ms(jax.jit(kernel), args, budget)[0] if kernel is not _no_pallas else float("nan")
        print(f"{name} {xla:.6f} {pallas:.6f} {xla_min:.6f}", flush=True)


if __name__ == "__main__":
    main()

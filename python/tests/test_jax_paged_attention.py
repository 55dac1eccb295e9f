"""`tpu_kernel.examples.paged_attention` as a JAX op on CPU (our interpreter through XLA FFI) under
`jax.jit`, against plain attention over the pages gathered with jnp (`k_pages[:, page_indices]`): ragged
lengths (1 token, every page, empty, one token into a new page, random), a shuffled page pool, GQA, at
the example's shapes and at others (more kv heads, another group size, shorter pages)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
import tpu_kernel.examples as ex

f32, bf16, i32 = jnp.float32, jnp.bfloat16, jnp.int32


def inputs(batch, heads, kv_heads, head_dim, total_pages, page_size, pages_per_seq, seed):
    rng = np.random.default_rng(seed)
    max_len = pages_per_seq * page_size
    lengths = rng.integers(0, max_len + 1, batch).astype(np.int32)
    lengths[:4] = [1, max_len, 0, page_size + 1][:min(batch, 4)]
    table = rng.permutation(total_pages)[np.arange(batch * pages_per_seq) % total_pages]
    table = table.reshape(batch, pages_per_seq).astype(np.int32)
    q = rng.standard_normal((batch, heads, head_dim)) / np.sqrt(head_dim)
    k = rng.standard_normal((kv_heads, total_pages, page_size, head_dim))
    v = rng.standard_normal((kv_heads, total_pages, page_size, head_dim))
    return [jnp.asarray(lengths), jnp.asarray(table)] + [jnp.asarray(a, f32).astype(bf16) for a in (q, k, v)]


def check(ours, args):
    ref = pk.REFERENCES["paged_attention"](*args)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype == bf16
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    # p is rounded to bf16 before p @ v (as in the kernel and its Pallas twin): a few bf16 ulps of |v|.
    np.testing.assert_allclose(ours, ref, rtol=2e-2, atol=2e-2)
    lengths = np.asarray(args[0])
    assert not ours[lengths == 0].any(), "an empty sequence gives zeros"


@pytest.mark.parametrize("seed", [0, 1])
def test_jit_matches_attention_over_gathered_pages(seed):
    """The example's shapes: 8 sequences of up to 32 pages of 16 tokens, 16 query heads over 2 kv heads."""
    args = inputs(8, 16, 2, 128, 256, 16, 32, seed)
    check(jax.jit(ex.paged_attention)(*args), args)


@pytest.mark.parametrize("shape, per_group", [
    ((4, 32, 4, 128, 96, 32, 12), 4),   # 4 kv heads, pages of 32 tokens, 3 groups of 4 pages
    ((6, 8, 1, 128, 40, 16, 10), 3),    # one kv head (G = 8), a pool smaller than the tables: pages shared
])
def test_other_shapes_and_group_sizes(shape, per_group):
    args = inputs(*shape, seed=2)
    f = jax.jit(lambda *a: ex.paged_attention(*a, pages_per_compute_block=per_group))
    check(f(*args), args)


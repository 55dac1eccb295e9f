"""The repository's example kernels (`examples/*.rs`) as JAX operations.

    import tpu_kernel.examples as ex
    ex.matmul(x, y, block=(128, 128, 128))      # bf16 [m, k] @ [k, n]; differentiable in x and y
    ex.softmax(x, block_rows=8)                 # f32 rows
    ex.rmsnorm(x, w, eps=1e-6, block_rows=16)   # x bf16 [m, n], w f32 [1, n]; differentiable in x and w
    ex.add(x, y, block=(256, 256))

Arrays are positional, static parameters keyword-only with the examples' values as defaults; array
shapes are whatever the launch accepts. `__all__` lists every kernel the library exports (backward
kernels such as `matmul_dx` included); `help(ex.matmul)` shows the signature.

The library is `libtpu_kernel_examples`, built by cargo from `examples-lib/` when this package is
installed (`pip install .`) and shipped inside it. The environment variable `TPU_KERNEL_EXAMPLES_LIB`
names another build to load instead (e.g. `target/release/libtpu_kernel_examples.so` while working on
the Rust side, without reinstalling).
"""
from __future__ import annotations

import glob
import importlib.machinery
import os
from typing import Any

import numpy as np

from ._errors import KernelError, LibraryError
from ._library import Kernel, load

#: Environment variable naming the examples library file to load instead of the bundled one.
ENV_VAR = "TPU_KERNEL_EXAMPLES_LIB"
_STEM = "libtpu_kernel_examples"


def library_path() -> str:
    """The examples library file: `$TPU_KERNEL_EXAMPLES_LIB`, else the one installed in this package.

    setuptools-rust installs a NoBinding cdylib under the module name it is given plus the
    interpreter's extension suffix (`libtpu_kernel_examples.cpython-312-x86_64-linux-gnu.so`), so
    the suffixes of this interpreter are tried first, then a plain `.so`.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in [*importlib.machinery.EXTENSION_SUFFIXES, ".so"]:
        candidate = os.path.join(here, _STEM + suffix)
        if os.path.isfile(candidate):
            return candidate
    found = sorted(glob.glob(os.path.join(here, _STEM + "*.so")))
    if found:
        return found[0]
    raise LibraryError(
        f"the examples library ({_STEM}*.so) is not in {here}: install the package with `pip install .` "
        f"from the repository root (it builds examples-lib with cargo), or set {ENV_VAR} to a built "
        f"library (cargo build --release -p tpu-kernel-examples -> target/release/{_STEM}.so)", path=here)


def group_metadata(sizes: Any, m: int, tm: int = 128) -> tuple[Any, Any, Any]:
    """The scalar-prefetched metadata `grouped_matmul` takes first, for tokens sorted by group with i32
    group sizes `sizes` (summing to `m`, zeros allowed) in `tm`-row tiles: `(offsets [G + 1], group_ids,
    m_tiles)`, the last two `[m // tm + G - 1]` — each non-empty group visits the tiles its rows touch, in
    order (a tile straddling a boundary once per group); unused trailing visits repeat the last one.
    jit-able (`sizes` may be traced; `m`, `tm` are static):

        y = tpu_kernel.examples.grouped_matmul(*group_metadata(sizes, lhs.shape[0]), lhs, rhs)

    Computed by the Rust function beside the kernel (`group_metadata` in examples/grouped_matmul.rs, a
    host function of the examples library); a traced `sizes` reaches it through `jax.pure_callback`.
    Sizes that do not fit the kernel (negative, not summing to `m`, `m` not a multiple of `tm`) are
    Rust's `KernelError`.
    """
    import jax
    import jax.numpy as jnp
    if isinstance(sizes, jax.core.Tracer):
        if sizes.ndim != 1:
            raise KernelError(f"group_metadata: sizes must be one size per group, got shape {sizes.shape}",
                              argument="sizes")
        groups = sizes.shape[0]
        # The shapes depend on (G, m, tm) alone: ask Rust with every row in group 0 (which also checks
        # m and tm now, at trace time).
        shapes = tuple(jax.ShapeDtypeStruct(a.shape, jnp.int32)
                       for a in _group_metadata([m] + [0] * (groups - 1) if groups else [], m, tm))
        return jax.pure_callback(lambda s: _group_metadata(s, m, tm), shapes, sizes, vmap_method="sequential")
    return tuple(jnp.asarray(a) for a in _group_metadata(sizes, m, tm))


def _group_metadata(sizes: Any, m: int, tm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`group_metadata` as numpy i32 arrays, from the library's host function."""
    result = library.host("group_metadata", np.asarray(sizes), m, tm)
    return tuple(np.asarray(a, np.int32) for a in result)


#: The loaded examples `Library`.
library = load(library_path())

_clashes = sorted(set(library.kernels) & set(globals()))
if _clashes:  # a kernel named like this module's own attributes would silently replace one of them
    raise LibraryError(f"{library.path}: kernel name(s) {', '.join(_clashes)} clash with attributes of "
                       f"tpu_kernel.examples; use tpu_kernel.examples.library.kernels[name]", path=library.path)
globals().update(library.kernels)
__all__ = sorted(library.kernels)


def __getattr__(name: str) -> Kernel:
    """Only reached for names that are not kernels (the kernels are module globals): an AttributeError
    listing them. Its annotation tells type checkers that `examples.<kernel>` is a `Kernel`."""
    raise AttributeError(f"tpu_kernel.examples has no kernel {name!r}; its kernels: {', '.join(__all__)}")


#: tpu-inference's order of `ragged_paged_attention`'s arrays (the launch takes the tables first).
_RPA_ARRAYS = ("queries", "keys", "values", "kv_cache", "kv_lens", "page_indices", "cu_q_lens", "distribution")


def _packing(dtype: Any) -> int:
    return max(1, 32 // (np.dtype(dtype).itemsize * 8))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def ragged_paged_attention(queries: Any, keys: Any, values: Any, kv_cache: Any, kv_lens: Any,
                           page_indices: Any, cu_q_lens: Any, distribution: Any, **options: Any) -> Any:
    """tpu-inference's ragged paged attention v3 (vLLM TPU's attention), with its signature:
    `(output, updated_kv_cache)` for `queries [T, Hq, D]`, the new tokens' `keys`/`values [T, Hkv, D]`,
    `kv_cache [pages, page_size, 2 Hkv / packing, packing, D']` (tpu-inference's `get_kv_cache_shape`,
    `D'` = D rounded up to 128), i32 `kv_lens [S]`, `page_indices [S * pages_per_seq]`, `cu_q_lens
    [S + 1]`, `distribution [3]`, and its keyword arguments (`use_causal_mask`, `update_kv_cache`,
    `skip_kv_mask`, `sm_scale`, `sliding_window`, `soft_cap`, `out_dtype`, `mask_value`, `q_scale`,
    `k_scale`, `v_scale`, `chunk_prefill_size`, `d_block_sizes`, `p_block_sizes`, `m_block_sizes`,
    `vmem_limit_bytes`; and `target=`).

    As tpu-inference does, the queries are laid out per kv head (`[Hkv, T, Gp / pk, pk, D']`, the
    group of query heads padded to the packing `pk`, head_dim to 128) and the keys and values merged
    into the cache's row layout with jnp; then one Rust launch (`ragged_paged_attention_launch`,
    examples/ragged_paged_attention.rs, whose module docs list where it differs from tpu-inference)
    updates the cache (aliased: donate it under `jax.jit` to update it in place) and computes the
    attention.

    On the CPU (the interpreter, under the CPU lowering), the default query blocks are tpu-inference's
    capped at 32 tokens (`CPU_QUERY_BLOCK`): its 128 on v5e/v6e pad a prefill chunk of 8–64 tokens to
    128 rows, which a TPU absorbs and the CPU pays for row by row (`benches/rpa_cpu.py`'s
    `ragged_paged_attention_mixed_tpu_blocks` measures the difference). The query block does not
    change the numbers (tests/ragged_paged_attention.rs::query_block_sizes_do_not_change_the_bits);
    the KV blocks would (the online softmax's chunks), so they stay tpu-inference's. Block sizes passed
    explicitly are used as given."""
    import jax.numpy as jnp
    q, k, v = queries, keys, values
    for name, a, rank in (("queries", q, 3), ("keys", k, 3), ("values", v, 3)):
        if getattr(a, "ndim", None) != rank:
            raise KernelError(f"ragged_paged_attention(): {name} must be [tokens, heads, head_dim], got shape "
                              f"{getattr(a, 'shape', None)}", argument=name, kernel="ragged_paged_attention")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise KernelError(f"ragged_paged_attention(): keys {k.shape} {k.dtype} and values {v.shape} {v.dtype} "
                          f"must agree", argument="values", kernel="ragged_paged_attention")
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if k.shape[0] != tokens or k.shape[2] != head_dim or kv_heads == 0 or heads % kv_heads:
        raise KernelError(f"ragged_paged_attention(): queries {q.shape} and keys {k.shape} do not fit "
                          f"(same tokens and head_dim; query heads a multiple of kv heads)", argument="keys",
                          kernel="ragged_paged_attention")
    group = heads // kv_heads
    q_pk, kv_pk = _packing(q.dtype), _packing(k.dtype)
    gp, dp = _round_up(group, q_pk), _round_up(head_dim, 128)
    qp = jnp.pad(q.reshape(tokens, kv_heads, group, head_dim),
                 ((0, 0), (0, 0), (0, gp - group), (0, dp - head_dim)))
    qp = qp.reshape(tokens, kv_heads, gp // q_pk, q_pk, dp).swapaxes(0, 1)
    rows = _round_up(2 * kv_heads, kv_pk)
    kv = jnp.concatenate([k, v], axis=-1).reshape(tokens, 2 * kv_heads, head_dim)
    kv = jnp.pad(kv, ((0, 0), (0, rows - 2 * kv_heads), (0, dp - head_dim)))
    kv = kv.reshape(tokens, rows // kv_pk, kv_pk, dp)
    if options.get("out_dtype") is not None:
        options["out_dtype"] = np.dtype(options["out_dtype"]).name
    for name in ("d_block_sizes", "p_block_sizes", "m_block_sizes"):
        if options.get(name) is not None:
            options[name] = [int(b) for b in options[name]]
    o, cache = library.kernels["ragged_paged_attention_launch"](
        kv_lens, page_indices, cu_q_lens, distribution, qp, kv, kv_cache, actual_num_q_heads=heads,
        **options)
    out = o.swapaxes(0, 1).reshape(tokens, kv_heads, gp, dp)[:, :, :group, :head_dim]
    return out.reshape(tokens, heads, head_dim), cache


def all_gather_matmul(x: Any, y: Any, mesh: Any, axis_name: str, collective_id: int | None = 0,
                      bn: int | None = None, bk: int | None = None, rhs_transpose: bool = False) -> Any:
    """tpu-inference's all-gather matmul, with its signature: `all_gather(x, axis=0) @ y` for `x [m,
    k]` sharded by rows and `y [k, n]` (`[n, k]` with `rhs_transpose`) by columns over mesh axis
    `axis_name` of `mesh` (a `Mesh` or `AbstractMesh`), returned `[m, n]` sharded by columns
    (`P(None, axis_name)`). The `shard_map` is applied here; each device runs one launch of
    `all_gather_matmul_launch` (examples/all_gather_matmul.rs: tpu-inference's bidirectional ring,
    grid `(tp + 2, n / tp / bn, k / bk)`), whose remote copies meet the other devices' — on TPU, and
    on a CPU mesh through the interpreter. `bn`/`bk` default to tpu-inference's tuned table for the
    target, else `n / tp` and `k`; `collective_id` names the barrier semaphore."""
    import jax
    from jax.sharding import PartitionSpec as P
    kernel = library.kernels["all_gather_matmul_launch"]
    y_spec = P(axis_name, None) if rhs_transpose else P(None, axis_name)

    def per_device(xs: Any, ys: Any) -> Any:
        out, _ = kernel(xs, ys, axis=axis_name, collective_id=0 if collective_id is None else collective_id,
                        bn=bn, bk=bk, rhs_transpose=rhs_transpose)
        return out
    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(axis_name, None), y_spec),
                                 out_specs=P(None, axis_name), check_vma=False))(x, y)


#: Examples whose Python face is a function over a kernel of the library (its name: the example's):
#: example name -> the kernel it calls, whose operands the example's Rust `build()` has.
WRAPPERS = {"ragged_paged_attention": "ragged_paged_attention_launch",
            "all_gather_matmul": "all_gather_matmul_launch"}

__all__ = sorted([*__all__, *WRAPPERS])

"""The repository's example kernels as torch ops: `tpu_kernel.torch.examples.<name>` mirrors
`tpu_kernel.examples.<name>` (same positional tensors, same keyword static parameters and defaults)
on torch tensors — torchax tensors or plain CPU tensors — and returns torch tensors.

    import tpu_kernel.torch.examples as tex
    y = tex.matmul(x, w, block=(128, 128, 128))
"""
from __future__ import annotations

from typing import Any

from .. import examples as _jax_examples
from .._errors import KernelError
from . import TorchOp as _TorchOp, op as _op

library = _jax_examples.library


def group_metadata(sizes: Any, m: int, tm: int = 128) -> tuple[Any, ...]:
    """`tpu_kernel.examples.group_metadata` for torch: i32 group sizes (a tensor or a list) to the
    `(offsets, group_ids, m_tiles)` int32 tensors `grouped_matmul` takes first.

        y = tpu_kernel.torch.examples.grouped_matmul(*group_metadata(sizes, lhs.shape[0]), lhs, rhs)
    """
    import torch
    if isinstance(sizes, torch.Tensor):
        sizes = sizes.detach().cpu().numpy()
    return tuple(torch.from_numpy(a) for a in _jax_examples._group_metadata(sizes, m, tm))


globals().update({name: _op(k) for name, k in library.kernels.items()})


def ragged_paged_attention(queries: Any, keys: Any, values: Any, kv_cache: Any, kv_lens: Any,
                           page_indices: Any, cu_q_lens: Any, distribution: Any,
                           **options: Any) -> tuple[Any, Any]:
    """`tpu_kernel.examples.ragged_paged_attention` (tpu-inference's signature) on torch tensors — all
    torchax tensors or all CPU tensors —: `(output, updated_kv_cache)` as torch tensors. The JAX
    function runs on the tensors' jax arrays (torchax: inside its environment, so it traces into a
    `torchax.interop.jax_jit`); the cache comes back as a new tensor, as tpu-inference returns it."""
    from . import _cpu_to_jax, _is_torchax, _jax_to_cpu
    from torchax import interop
    import jax
    tensors = [queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution]
    names = _jax_examples._RPA_ARRAYS
    import torch
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"ragged_paged_attention(): {name} is a {type(t).__name__}, expected a torch "
                              f"tensor", argument=name, kernel="ragged_paged_attention")
    kinds = {_is_torchax(t) for t in tensors}
    if len(kinds) > 1:
        raise KernelError("ragged_paged_attention(): mixes torchax tensors and plain CPU tensors",
                          kernel="ragged_paged_attention")

    def run(*arrays: Any) -> Any:
        return _jax_examples.ragged_paged_attention(*arrays, **options)
    if kinds == {True}:
        return interop.call_jax(run, *tensors)
    out = jax.jit(run)(*(_cpu_to_jax(t) for t in tensors))
    return tuple(_jax_to_cpu(a) for a in out)


def all_gather_matmul(x: Any, y: Any, mesh: Any, axis_name: str, collective_id: int | None = 0,
                      bn: int | None = None, bk: int | None = None, rhs_transpose: bool = False) -> Any:
    """`tpu_kernel.examples.all_gather_matmul` (tpu-inference's signature) on torch tensors — both
    torchax tensors or both CPU tensors —: `all_gather(x, axis=0) @ y` as a torch tensor."""
    from . import _cpu_to_jax, _is_torchax, _jax_to_cpu
    from torchax import interop
    import torch
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"all_gather_matmul(): {name} is a {type(t).__name__}, expected a torch tensor",
                              argument=name, kernel="all_gather_matmul")
    kinds = {_is_torchax(x), _is_torchax(y)}
    if len(kinds) > 1:
        raise KernelError("all_gather_matmul(): mixes torchax tensors and plain CPU tensors",
                          kernel="all_gather_matmul")

    def run(a: Any, b: Any) -> Any:
        return _jax_examples.all_gather_matmul(a, b, mesh, axis_name, collective_id=collective_id, bn=bn, bk=bk,
                                               rhs_transpose=rhs_transpose)
    if kinds == {True}:
        return interop.call_jax(run, x, y)
    return _jax_to_cpu(run(_cpu_to_jax(x), _cpu_to_jax(y)))


__all__ = sorted([*library.kernels, "ragged_paged_attention", "all_gather_matmul"])


def __getattr__(name: str) -> _TorchOp:
    """Only reached for names that are not kernels (the ops are module globals): an AttributeError
    listing them. Its annotation tells type checkers that `examples.<kernel>` is a `TorchOp`."""
    raise AttributeError(f"tpu_kernel.torch.examples has no kernel {name!r}; its kernels: {', '.join(__all__)}")

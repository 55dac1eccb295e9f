"""The repository's example kernels as torch ops: `tpu_kernel.torch.examples.<name>` mirrors
`tpu_kernel.examples.<name>` (same positional tensors, same keyword static parameters and defaults)
on torch tensors — torchax tensors or plain CPU tensors — and returns torch tensors.

    import tpu_kernel.torch.examples as tex
    y = tex.matmul(x, w, block=(128, 128, 128))
"""
from __future__ import annotations

from typing import Any

from .. import examples as _jax_examples
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
__all__ = sorted(library.kernels)


def __getattr__(name: str) -> _TorchOp:
    """Only reached for names that are not kernels (the ops are module globals): an AttributeError
    listing them. Its annotation tells type checkers that `examples.<kernel>` is a `TorchOp`."""
    raise AttributeError(f"tpu_kernel.torch.examples has no kernel {name!r}; its kernels: {', '.join(__all__)}")

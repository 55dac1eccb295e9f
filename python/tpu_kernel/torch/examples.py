"""The repository's example kernels as torch ops: `tpu_kernel.torch.examples.<name>` mirrors
`tpu_kernel.examples.<name>` (same positional tensors, same keyword static parameters and defaults)
on torch tensors — torchax tensors or plain CPU tensors — and returns torch tensors.

    import tpu_kernel.torch.examples as tex
    y = tex.matmul(x, w, block=(128, 128, 128))
"""
from __future__ import annotations

from .. import examples as _jax_examples
from . import op as _op

library = _jax_examples.library
globals().update({name: _op(k) for name, k in library.kernels.items()})
__all__ = sorted(library.kernels)

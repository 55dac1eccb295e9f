"""One workaround between torchax and torch, applied when `tpu_kernel.torch` is imported.

torchax (0.0.13) renames torch's privateuse1 backend to `jax` and registers a device module whose
`is_available()` says True, so `torch.accelerator.is_available()` is True in every process that imported
torchax — but the `jax` device has no streams: `torch.accelerator.current_stream()` raises "PyTorch is
not linked with support for jax devices". torch 2.12's dynamo asks for that stream when it starts
tracing any frame, so `torch.compile` of anything (CPU code included) fails once torchax is imported.

When (and only when) the current accelerator is torchax's `jax` and asking its stream fails, its device
module answers `is_available() == False`. torchax itself never asks (its tensors are not privateuse1
tensors: they are wrapper subclasses on the meta device), and `torch.compile` then traces CPU code as
it would without torchax (`python/tests/test_torch_compile.py`)."""
from __future__ import annotations

import torch


def fix_torchax_accelerator() -> bool:
    """Apply the workaround if this process needs it; True when it was applied."""
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type != "jax" or not torch.accelerator.is_available():
        return False
    try:
        torch.accelerator.current_stream()
        return False
    except RuntimeError:
        pass
    module = torch.get_device_module("jax")
    module.is_available = lambda: False
    return True

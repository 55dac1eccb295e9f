"""Every private jax name the package uses, in one place, checked against the jax versions it supports.

The TPU lowering must emit the `tpu_custom_call` exactly as jax's own Pallas lowering does, and find
the devices a program is lowered for; jax offers no public API for either, so these come from
`jax._src` — the same functions jax's Pallas TPU lowering calls. They may move in any jax release, so:
- the package declares `jax>=0.12.0.1,<0.13` (pyproject.toml), the range `SUPPORTED` states here;
- importing `tpu_kernel` with a jax outside that range raises an `ImportError` naming both versions
  (set `TPU_KERNEL_ALLOW_ANY_JAX=1` to try anyway), and a name missing from a supported jax is an
  `ImportError` naming the name, not an `AttributeError` deep inside a lowering;
- `python/tests/test_jax_package.py` checks every name here resolves, that no other module of the
  package imports `jax._src`, and that the range agrees with the package metadata.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

import jax

#: The jax versions this package is tested with: `(lowest, first unsupported)`, as in pyproject.toml.
SUPPORTED = ((0, 12, 0), (0, 13, 0))

#: What the package uses: (module, attribute).
NAMES = [
    ("jax._src.dispatch", "apply_primitive"),  # a primitive's eager impl, as jax's own primitives
    ("jax._src.sharding_impls", "SPMDAxisContext"),  # the lowering's axis context: shard_map's mesh
    ("jax._src.sharding_impls", "ShardingContext"),  # ... or a jit's device assignment
    ("jax._src.interpreters.pxla", "get_default_device"),  # Pallas's fallback for the TPU generation
    ("jax._src.interpreters.mlir", "source_info_to_location"),  # op locations named after the kernel
    ("jax._src.interpreters.mlir", "custom_call"),  # the tpu_custom_call, as Pallas emits it
]


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_version(version: str) -> None:
    """Raise an ImportError unless `version` is in `SUPPORTED` (or the override is set)."""
    low, high = SUPPORTED
    if low <= version_tuple(version) < high or os.environ.get("TPU_KERNEL_ALLOW_ANY_JAX") == "1":
        return
    fmt = lambda v: ".".join(map(str, v))  # noqa: E731
    raise ImportError(f"tpu_kernel supports jax >= {fmt(low)}, < {fmt(high)} (it uses private jax APIs that "
                      f"move between releases); this is jax {version}. Install a supported jax, or set "
                      f"TPU_KERNEL_ALLOW_ANY_JAX=1 to try anyway")


def resolve(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"tpu_kernel needs {module}.{name}, which jax {jax.__version__} does not have ({e}); "
                          f"supported: jax >= {'.'.join(map(str, SUPPORTED[0]))}, "
                          f"< {'.'.join(map(str, SUPPORTED[1]))}") from None


check_version(jax.__version__)

apply_primitive = resolve("jax._src.dispatch", "apply_primitive")
SPMDAxisContext = resolve("jax._src.sharding_impls", "SPMDAxisContext")
ShardingContext = resolve("jax._src.sharding_impls", "ShardingContext")
get_default_device = resolve("jax._src.interpreters.pxla", "get_default_device")
source_info_to_location = resolve("jax._src.interpreters.mlir", "source_info_to_location")
custom_call = resolve("jax._src.interpreters.mlir", "custom_call")

"""tpu_kernel: Rust TPU kernels (Pallas-style, written with the `tpu-kernel` crate) as JAX operations.

A Rust crate exports kernels from a cdylib (see the crate's `export` module); this package loads it:

    import jax, jax.numpy as jnp
    import tpu_kernel

    lib = tpu_kernel.load("target/release/libmy_kernels.so")
    y = jax.jit(lambda x, w: lib.matmul(x, w, block=(128, 128, 128)))(x, w)

Each kernel is one `jax.extend.core.Primitive` (`tpu_kernel`) whose
- output shapes come from Rust (`build`): Rust's checks run at trace time, and a failure is a
  `KernelError` whose text is the Rust message with the Rust source line;
- CPU lowering is an XLA FFI call into the library (the interpreter runs on XLA's buffers);
- TPU lowering is the `tpu_custom_call` that Pallas would emit for the same kernel;
- vmap rule prepends a grid axis per level, as Pallas's does;
- gradient is a `jax.custom_vjp` built from the backward kernels the Rust export declares.

`jax.export` needs the CPU FFI target allowed: `disabled_checks=lib.export_safety_checks()`; an
exported program runs in any process that has loaded the same library (`tpu_kernel.load`) first.

The kernels of the repository's examples are in `tpu_kernel.examples` (a library built and installed
with this package; `TPU_KERNEL_EXAMPLES_LIB` points it elsewhere).
"""
from ._errors import AbiVersionError, KernelError, LibraryError
from ._library import ABI_VERSION, Kernel, Library, load
from ._tune import Tuned, tune

__version__ = "0.1.0"

__all__ = ["ABI_VERSION", "AbiVersionError", "Kernel", "KernelError", "Library", "LibraryError", "Tuned", "load",
           "tune"]

# The primitive's rules are registered with jax on import, so an exported program that only needs
# the FFI target (and not a Python call) can still be lowered/run after `import tpu_kernel`.
from . import _primitive  # noqa: E402,F401

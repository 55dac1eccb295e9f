"""`python -m tpu_kernel`: the installed package's smoke test.

Loads the bundled examples library and runs a few kernels on the CPU (XLA FFI into the library) —
eagerly, under `jax.jit` and through `jax.grad` — against numpy; with torch and torchax installed, the
same through the torch ops (`torch.ops.tpu_kernel_examples`). Prints where the package and library
came from, then `ok`; any failure is an exception (non-zero exit)."""
from __future__ import annotations

import importlib.util
import sys


def main() -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tpu_kernel
    import tpu_kernel.examples as ex

    print(f"tpu_kernel {tpu_kernel.__version__} from {tpu_kernel.__file__}")
    print(f"examples library {ex.library.path} ({len(ex.library.kernels)} kernels), jax {jax.__version__}")
    x = jnp.arange(256 * 256, dtype=jnp.float32).reshape(256, 256) / 1000
    np.testing.assert_array_equal(np.asarray(ex.add(x, x)), np.asarray(x) * 2)
    a = (jnp.arange(256 * 128, dtype=jnp.float32).reshape(256, 128) % 7 - 3).astype(jnp.bfloat16)
    b = (jnp.arange(128 * 256, dtype=jnp.float32).reshape(128, 256) % 5 - 2).astype(jnp.bfloat16)
    y = jax.jit(lambda a, b: ex.matmul(a, b))(a, b)
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray(a, np.float32) @ np.asarray(b, np.float32))  # small integers: exact
    g = jax.grad(lambda a: ex.matmul(a, b).astype(jnp.float32).sum())(a)
    np.testing.assert_array_equal(np.asarray(g, np.float32),
                                  np.broadcast_to(np.asarray(b, np.float32).sum(1), (256, 128)))
    print("jax: add, matmul (jit), grad of matmul: ok")
    if importlib.util.find_spec("torch") and importlib.util.find_spec("torchax"):
        import torch

        import tpu_kernel.torch.examples as tex
        ta, tb = (torch.from_numpy(np.asarray(v, np.float32)).to(torch.bfloat16) for v in (a, b))
        (out,) = torch.ops.tpu_kernel_examples.matmul(ta, tb)
        assert torch.equal(out, tex.matmul(ta, tb)) and torch.equal(out.float(), ta.float() @ tb.float())
        print(f"torch {torch.__version__}: torch.ops.tpu_kernel_examples.matmul: ok")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

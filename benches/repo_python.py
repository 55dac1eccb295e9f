"""The repository's Python side for the benchmarks' scripts, installed or not: `python/tests` on the path
(the Pallas twins, `pallas_kernels.py`), and — when the `tpu_kernel` package is not installed — the
package from `python/` with the examples library cargo built (`$TPU_KERNEL_EXAMPLES_LIB`, else
`libtpu_kernel_examples.so` under `$CARGO_TARGET_DIR/release` or `target/release`), which
`pallas_kernels.py` imports (`tpu_kernel.examples`). Build it with
`cargo build --release -p tpu-kernel-examples`, or install the package (`pip install .`).
"""
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup():
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    if importlib.util.find_spec("tpu_kernel") is not None:
        return
    sys.path.insert(0, str(ROOT / "python"))
    if "TPU_KERNEL_EXAMPLES_LIB" not in os.environ:
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        lib = target / "release" / "libtpu_kernel_examples.so"
        if lib.exists():
            os.environ["TPU_KERNEL_EXAMPLES_LIB"] = str(lib)

"""`mosaic_mlir()` — the readable Mosaic text (`--emit mlir`) — parses and verifies under jaxlib's own
tpu dialect, strictly, for every example and every op-coverage kernel (`tests/mosaic_text.rs` writes
the texts). The custom syntax of a few ops differs between LLVM 22 and jaxlib's MLIR
(`vector.extract_strided_slice`); those are printed in the generic form."""

import os
import subprocess
from pathlib import Path

import tpu_toolchain as tc

REPO = Path(__file__).resolve().parents[2]


def test_the_readable_mosaic_text_of_every_kernel_verifies_under_jaxlib(tmp_path):
    env = {**os.environ, "TPU_KERNEL_MOSAIC_TEXT_DUMP": str(tmp_path)}
    p = subprocess.run(["cargo", "test", "--quiet", "--test", "mosaic_text"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(tmp_path.glob("*.mlir"))
    assert len(files) >= 25, [f.name for f in files]
    failed = []
    for f in files:
        try:
            tc.verify_mosaic(f.read_text())
        except Exception as e:  # noqa: BLE001
            failed.append(f"{f.name}: {str(e)[:300]}")
    assert not failed, "\n".join(failed)
    assert any("vector.extract_strided_slice" in f.read_text() for f in files)

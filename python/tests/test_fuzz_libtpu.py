"""Random launches through libtpu (issue 13, item 2d): what our checks accept, libtpu accepts.

`tests/fuzz_launches.rs` (seeded random launches with hostile mutations) dumps the StableHLO program of
every launch `build()` accepts whose array fits a chip's HBM (past it libtpu refuses the program for want
of memory on that chip — the caller's array, not a kernel rule); a sample of at least 200 is compiled by
libtpu for v5e, and every one must compile — 0 false accepts. Found so far (each now a regression test in
tests/hostile_input.rs): a rank-1 bf16 block of 128 (libtpu tiles 1-D bf16 by 256, i8 by 512) and a VMEM
limit past i64::MAX.
"""
import os
import pathlib
import subprocess

import pytest

import tpu_toolchain as tc
from conftest import REPO

SAMPLE = int(os.environ.get("TPU_KERNEL_FUZZ_LIBTPU", "200"))


@pytest.fixture(scope="module")
def accepted(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz")
    env = {**os.environ, "TPU_KERNEL_FUZZ_DUMP": str(out), "TPU_KERNEL_FUZZ_LAUNCHES": str(SAMPLE * 3)}
    p = subprocess.run(["cargo", "test", "--quiet", "--test", "fuzz_launches"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(out.glob("accept_*.mlir"))
    assert len(files) >= SAMPLE, f"only {len(files)} accepted launches from {SAMPLE * 3} cases"
    return files[:SAMPLE]


def test_every_accepted_random_launch_compiles_with_libtpu(accepted):
    rejected = []
    for path in accepted:
        text = path.read_text()
        r = tc.compile_stablehlo(text.split("\n", 1)[1], "v5e")
        if not r.ok:
            rejected.append(f"{text.splitlines()[0]}\n{r.error[:800]}")
    assert not rejected, f"{len(rejected)} of {len(accepted)} accepted launches rejected by libtpu:\n" + \
        "\n\n".join(rejected[:5])

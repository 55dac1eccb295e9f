"""Random launches through libtpu (issue 13, item 2d): what our checks accept, libtpu accepts; what they
reject, the real toolchain rejects too — or we know why we are stricter.

`tests/fuzz_launches.rs` (seeded random launches with hostile mutations) dumps, with
`TPU_KERNEL_FUZZ_DUMP`, the StableHLO program of every launch `build()` accepts and, as JSON, every launch
it rejects — each only when libtpu can be asked at all (the arrays fit a chip's HBM, every dimension is
below 2^31: past that libtpu aborts the process instead of answering).

- Accepts: a sample of at least 200 is compiled by libtpu for v5e, and every one must compile — 0 false
  accepts. Found so far (each now a regression test in tests/hostile_input.rs): a rank-1 bf16 block of
  128 (libtpu tiles 1-D bf16 by 256, i8 by 512) and a VMEM limit past i64::MAX.
- Rejects: a sample of at least 200 is written as the same launch in Pallas (the same copy kernel, grid,
  block shapes, affine index maps, squeezed dimensions, scratch and VMEM limit) and compiled for v5e.
  jax, Pallas or libtpu must refuse it, unless our reason is one of `DELIBERATE` (a launch that compiles
  but would fault or leave memory unwritten on the chip). Found so far: a block larger than its array
  (Pallas pads it as one edge block and libtpu compiles it; we rejected it) — now accepted, tested in
  tests/trace_errors.rs. Rejects with no Pallas counterpart (a squeezed dimension whose block size is not
  1, `.squeeze(d)` past the rank) are counted, not sent. The compiles run in a worker process
  (`fuzz_libtpu_worker.py`): libtpu aborts the process on some launches (a constant out-of-range block
  index), which counts as a refusal.
"""
import collections
import json
import math
import os
import re
import subprocess

import pytest

import pathlib
import sys

import tpu_toolchain as tc

from conftest import REPO

HERE = pathlib.Path(__file__).parent

SAMPLE = int(os.environ.get("TPU_KERNEL_FUZZ_LIBTPU", "200"))

# Our rejections of launches the real toolchain compiles, each with the reason the launch is still wrong.
DELIBERATE = [
    ("OutOfBounds", r"^at grid point .* the index map returns block",
     "a block index out of range is a DMA outside the array at run time: no compiler sees it"),
    ("Grid", r"has an empty axis",
     "a grid without steps never writes the output, which would hold uninitialized HBM"),
    ("Grid", r"never writes output block",
     "an output block no grid step writes would hold uninitialized HBM"),
]


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz")
    env = {**os.environ, "TPU_KERNEL_FUZZ_DUMP": str(out), "TPU_KERNEL_FUZZ_LAUNCHES": str(SAMPLE * 5)}
    p = subprocess.run(["cargo", "test", "--quiet", "--test", "fuzz_launches"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def test_every_accepted_random_launch_compiles_with_libtpu(dump):
    files = sorted(dump.glob("accept_*.mlir"))
    assert len(files) >= SAMPLE, f"only {len(files)} accepted launches"
    rejected = []
    for path in files[:SAMPLE]:
        text = path.read_text()
        r = tc.compile_stablehlo(text.split("\n", 1)[1], "v5e")
        if not r.ok:
            rejected.append(f"{text.splitlines()[0]}\n{r.error[:800]}")
    assert not rejected, f"{len(rejected)} of {SAMPLE} accepted launches rejected by libtpu:\n" + \
        "\n\n".join(rejected[:5])


class Worker:
    """`fuzz_libtpu_worker.py` in a process of its own, restarted when libtpu aborts it."""

    def __init__(self):
        self.p = None

    def ask(self, launch: str) -> str:
        if self.p is None:
            self.p = subprocess.Popen([sys.executable, str(HERE / "fuzz_libtpu_worker.py")],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, cwd=HERE,
                                      env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        self.p.stdin.write(launch.strip() + "\n")
        self.p.stdin.flush()
        answer = self.p.stdout.readline()
        if not answer:  # the process died on this launch
            self.p.wait()
            self.p = None
            return "aborted"
        return answer.strip()

    def close(self):
        if self.p is not None:
            self.p.stdin.close()
            self.p.wait()


def test_rejected_random_launches_are_refused_by_the_real_toolchain(dump):
    counts = collections.Counter()
    false_rejects = []
    worker = Worker()
    try:
        for path in sorted(dump.glob("reject_*.json")):
            if counts["sent"] == SAMPLE:
                break
            text = path.read_text()
            answer = worker.ask(text)
            if answer == "inexpressible":
                counts["no Pallas counterpart"] += 1
                continue
            counts["sent"] += 1
            if answer == "aborted":
                counts["libtpu aborted the process (a refusal, loudly)"] += 1
                continue
            if answer != "ok":
                counts["refused by jax, Pallas or libtpu"] += 1
                continue
            d = json.loads(text)
            why = [reason for kind, pattern, reason in DELIBERATE
                   if d["kind"] == kind and re.search(pattern, d["error"])]
            if why:
                counts[f"compiles, rejected on purpose: {why[0]}"] += 1
            else:
                false_rejects.append(f"{path.name}: {d['kind']}: {d['error']}\n  {d}")
    finally:
        worker.close()
    print("\n".join(f"{n:5d}  {what}" for what, n in counts.most_common()))
    assert counts["sent"] >= SAMPLE, f"only {counts['sent']} rejected launches could be sent: {counts}"
    refused = counts["refused by jax, Pallas or libtpu"] + counts["libtpu aborted the process (a refusal, loudly)"]
    assert refused * 3 >= SAMPLE, counts  # the sample exercises our rules, not only the deliberate ones
    assert not false_rejects, f"{len(false_rejects)} launches we reject compile with Pallas + libtpu:\n" + \
        "\n".join(false_rejects[:5])

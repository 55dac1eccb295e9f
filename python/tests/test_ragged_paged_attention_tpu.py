"""Ragged paged attention on TPU, ours (examples/ragged_paged_attention.rs) beside tpu-inference
0.32.0's v3 kernel at one small config (rpa_tpu_worker.py: 64 tokens, 8 query / 2 kv heads, head_dim
128, bf16, pages of 16, 4 sequences of up to 8 pages), each traced for and compiled by libtpu for
v5e:1x1, v6e:1x1 and tpu7x:1x1x1 in a child process per generation; and how long each takes to lower.

Measured (libtpu 0.0.51; LLO ops of the case's kernel / total scheduled bundles of its program):

    gen    case    ours LLO  theirs   ours bundles  theirs
    v5e    decode       458    1043            305     628
    v5e    mixed       1409    3356            764    1104
    v6e    decode       512    1086            305     598
    v6e    mixed       1454    2964            636     955
    tpu7x  decode       512    1086            275     574
    tpu7x  mixed       1453    2207            584     814

Ours is at or under tpu-inference's in both on every generation. With a float8_e4m3fn cache (k and v
scales; our one launch beside the sum of tpu-inference's two, scheduled bundles): v5e 1169 / 1724,
v6e 1017 / 1561, tpu7x 871 / 1363. Both kernels compile with tpu-inference's default VMEM limit, the
TensorCore's whole VMEM: ours took libtpu's default scoped limit until 2026-12-02, and libtpu's
schedule under it was longer (v6e decode 578 bundles, mixed 891, fp8 2491 — the "60% above" of the
fp8 case was that limit, not the casts). Bundles count the static schedule (a
loop body once): ours loops over kv heads and over a block's pages where tpu-inference unrolls both
(it overlaps one head's `p @ v` with the next head's `q kᵀ` and issues the page copies back to back),
so fewer bundles here need not mean less time on a TPU — which nobody has measured (there is none
here). The example's module docs list every other difference. The figures are recorded so that a
regression fails: every figure of ours at or under its recording and under tpu-inference's.
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
GENERATIONS = ("v5e", "v6e", "tpu7x")

# gen -> case -> ((ours LLO, ours bundles), (theirs LLO, theirs bundles))
# gen -> (ours, tpu-inference's two launches): scheduled bundles with a float8_e4m3fn cache
RECORDED_FP8 = {"v5e": (1169, 1724), "v6e": (1017, 1561), "tpu7x": (871, 1363)}
FP8_ABOVE: set = set()  # where ours is above today (none)

RECORDED = {
    "v5e": {"decode": ((458, 305), (1043, 628)), "mixed": ((1409, 764), (3356, 1104))},
    "v6e": {"decode": ((512, 305), (1086, 598)), "mixed": ((1454, 636), (2964, 955))},
    "tpu7x": {"decode": ((512, 275), (1086, 574)), "mixed": ((1453, 584), (2207, 814))},
}

_results = {}


def measured(gen):
    if gen not in _results:
        p = subprocess.run([sys.executable, str(HERE / "rpa_tpu_worker.py"), gen], capture_output=True, text=True,
                           env=dict(os.environ), timeout=1200)
        assert p.returncode == 0, p.stderr[-4000:]
        _results[gen] = json.loads(p.stdout.strip().splitlines()[-1])
    r = _results[gen]
    assert "error" not in r, r["error"]
    return r


@pytest.mark.parametrize("gen", GENERATIONS)
def test_llo_ops_and_bundles_beside_tpu_inference(gen):
    r = measured(gen)
    for case in ("decode", "mixed"):
        ours, theirs = r[case]["ours"], r[case]["theirs"]
        (rec_llo, rec_bundles), (their_llo, their_bundles) = RECORDED[gen][case]
        print(f"{gen} {case}: LLO ours {ours['llo']} / tpu-inference {theirs['llo']}; "
              f"bundles ours {ours['bundles']} / tpu-inference {theirs['bundles']}")
        # tpu-inference's figures are the recording's (else the toolchain moved: re-measure)
        assert (theirs["llo"], theirs["bundles"]) == (their_llo, their_bundles), (gen, case, theirs)
        assert ours["llo"] <= rec_llo and ours["bundles"] <= rec_bundles, (gen, case, ours)
        assert ours["llo"] <= theirs["llo"] and ours["bundles"] <= theirs["bundles"], (gen, case, ours, theirs)
    ours, theirs = r["fp8"]["ours"]["bundles"], r["fp8"]["theirs"]["bundles"]
    print(f"{gen} fp8 cache: bundles ours {ours} / tpu-inference {theirs}")
    assert theirs == RECORDED_FP8[gen][1] and ours <= RECORDED_FP8[gen][0], (gen, ours, theirs)
    assert (ours > theirs) == (gen in FP8_ABOVE), (gen, ours, theirs)


def test_the_parity_table_is_the_recording():
    """The module docs' table says what RECORDED says."""
    for g in GENERATIONS:
        for c in ("decode", "mixed"):
            (ol, ob), (tl, tb) = RECORDED[g][c]
            assert f"{g:<6} {c:<7} {ol:>8} {tl:>7} {ob:>14} {tb:>7}" in __doc__, (g, c)


def test_lowering_is_100_times_faster_than_tpu_inferences():
    """Ours: the Rust library builds (traces and checks) and lowers (Mosaic bytecode, backend_config)
    the launch for a new signature, in-process through its C ABI; theirs: jax traces and lowers
    tpu-inference's `ragged_paged_attention` (its two Pallas kernels and the layout jnp) for TPU, a new
    static argument each time (its jit caches by them). The same config, for v6e; medians of 7."""
    import jax
    from jax.sharding import Mesh

    import pallas_rpa
    import rpa_tpu_worker as w
    import tpu_inference_rpa as tir
    import tpu_kernel.examples as ex
    import tpu_toolchain as tc

    mod = tir.kernel_module()
    launch = ex.library.kernels["ragged_paged_attention_launch"]
    args = w.args()
    _, desc = tc.topology("v6e")
    mesh = Mesh(np.array(desc.devices[:1]), ("x",))

    def ours(i):
        t = time.perf_counter()
        launch.lower(*pallas_rpa.ARGS, sm_scale=1.0 + i / 1024, target="v6e")
        return time.perf_counter() - t

    def theirs(i):
        with tir.tpu_generation(mod, 6), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            t = time.perf_counter()
            mod.ragged_paged_attention.trace(*args, sm_scale=1.0 + i / 1024).lower(lowering_platforms=("tpu",))
            return time.perf_counter() - t

    ours(1000), theirs(1000)  # first calls: imports, jax's caches of the unchanging parts
    o = statistics.median(ours(i) for i in range(7))
    t = statistics.median(theirs(i) for i in range(7))
    print(f"lowering: ours {o * 1e3:.2f} ms, tpu-inference {t * 1e3:.1f} ms: {t / o:.0f}x")
    assert t / o >= 100, (o, t)

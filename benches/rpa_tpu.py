"""Ragged paged attention at a Llama-3-8B-like config on TPU (issue 23 item 3): ours
(examples/ragged_paged_attention.rs through `tpu_kernel.examples.ragged_paged_attention`) beside
tpu-inference 0.32.0's v3 kernel, each traced for and compiled by libtpu for v5e:1x1, v6e:1x1 and
tpu7x:1x1x1 with no TPU present: LLO ops and total scheduled bundles per case (decode, mixed), ours vs
theirs, with ratios.

    .venv/bin/python benches/rpa_tpu.py                  # every generation: ~30 min on 2 cores
    .venv/bin/python benches/rpa_tpu.py --gens v6e       # one generation
    .venv/bin/python benches/rpa_tpu.py --json out.json  # also the figures as JSON

Config: 512 tokens, 32 query / 8 kv heads, head_dim 128, bf16 queries and cache, pages of 128 tokens,
128 sequences of up to 32 pages, kv_cache (2048, 128, 8, 2, 128); both kernels take tpu-inference's
default block sizes for the generation (ours computes the same heuristic, `default_blocks`) and
tpu-inference's default `vmem_limit_bytes`, the TensorCore's whole VMEM, given to both (ours defaults to
libtpu's default scoped limit, under which this config's decode case does not fit).

Each compile runs in a child process of this script (libtpu aborts the process on a body traced for
another generation; a crash costs one cell, printed as such): tpu-inference's `ragged_paged_attention`
as vLLM calls it (jitted, queries/keys/values/kv_cache donated) holds its decode and mixed kernels in one
program, told apart by their names (`RPAd-..`, `RPAm-..`); ours is traced with one case at a time
(`only_case`, kv_cache donated). The figures and helpers are those of the CI's small-config test
(python/tests/test_ragged_paged_attention_tpu.py, rpa_tpu_worker.py): LLO ops of the case's kernel (the
`post-finalize-llo` Mosaic dump) and total scheduled bundles of its custom-call program (a loop body
counts once: a static proxy, not a time). Mixed compiles take 80-190 s each on 2 cores; progress goes to
stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "python" / "tests"
GENERATIONS = ("v5e", "v6e", "tpu7x")
CASES = ("decode", "mixed")
# The Llama-3-8B-like config (rpa_tpu_worker.args' keys).
CONFIG = dict(tokens=512, heads=32, kv_heads=8, head_dim=128, page_size=128, pages_per_seq=32, seqs=128,
              pages=2048)
# One child per compile: tpu-inference's program (both its kernels), ours per case.
JOBS = ("theirs", "ours-decode", "ours-mixed")
MIB = 1 << 20
# tpu-inference's default `vmem_limit_bytes`: the TensorCore's whole VMEM (`pltpu.get_tpu_info()
# .vmem_capacity_bytes`; kernel-runtime's target table). Ours defaults to libtpu's default scoped limit
# (16 MiB on v5e, 32 MiB on v6e and tpu7x), under which this config's decode case does not fit (its
# default KV block of 4,096 tokens double-buffered is 32 MiB): both are given tpu-inference's default.
VMEM_LIMIT = {"v5e": 128 * MIB, "v6e": 128 * MIB, "tpu7x": 64 * MIB}


def child(gen: str, job: str) -> None:
    """Compile one program for `gen` and print one JSON line: case -> {"llo", "bundles"}, compile_s."""
    sys.path.insert(0, str(TESTS))
    sys.path.append(str(HERE.parent / "python"))
    import rpa_tpu_worker as w  # imports tpu_toolchain first: the dump directories before libtpu starts
    import tpu_inference_rpa as tir
    import tpu_kernel.examples as ex
    tc = w.tc

    args = w.args(CONFIG)
    before = set(os.listdir(tc.DUMP_DIR))
    t = time.perf_counter()
    if job == "theirs":
        mod = tir.kernel_module()
        with tir.tpu_generation(mod, w.VERSION[gen]):
            res = tc.compile_jax(lambda *x: mod.ragged_paged_attention(*x, vmem_limit_bytes=VMEM_LIMIT[gen]), args,
                                 gen, donate_argnums=(0, 1, 2, 3))
        prefixes = {"decode": "RPAd", "mixed": "RPAm"}
    else:
        case = job.split("-", 1)[1]
        res = tc.compile_jax(lambda *x: ex.ragged_paged_attention(*x, only_case=case, vmem_limit_bytes=VMEM_LIMIT[gen]),
                             args, gen, donate_argnums=(3,))
        prefixes = {case: "ragged_paged_attention_kernel"}
    seconds = time.perf_counter() - t
    if not res.ok:
        print(json.dumps({"error": (res.error or "")[:2000], "compile_s": seconds}))
        return
    llo = w.llo_by_kernel(before)
    out = {case: {"llo": w.one(llo, p), "bundles": w.one(res.bundles_by_program, p)}
           for case, p in prefixes.items()}
    print(json.dumps({"cases": out, "compile_s": seconds, "versions": tc.VERSIONS}))


def run_child(gen: str, job: str) -> dict:
    start = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--child", gen, job], capture_output=True, text=True,
                       env=dict(os.environ))
    took = time.perf_counter() - start
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        r = {"error": f"exit {p.returncode}: {tail}"}
    else:
        r = json.loads(lines[-1])
    print(f"  {gen} {job}: {'FAILED: ' + r['error'][:200] if 'error' in r else 'ok'} "
          f"({took:.0f} s, compile {r.get('compile_s', float('nan')):.0f} s)", file=sys.stderr, flush=True)
    return r


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, int) and isinstance(b, int) and b else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gens", default=",".join(GENERATIONS), help="comma-separated: v5e,v6e,tpu7x")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--child", nargs=2, metavar=("GEN", "JOB"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return 0
    gens = [g for g in a.gens.split(",") if g]
    results: dict = {}
    start = time.perf_counter()
    for i, gen in enumerate(gens):
        print(f"[{time.perf_counter() - start:.0f} s] {gen} ({i + 1}/{len(gens)}): "
              f"{', '.join(JOBS)}", file=sys.stderr, flush=True)
        results[gen] = {job: run_child(gen, job) for job in JOBS}

    print(f"# ragged paged attention, Llama-3-8B-like config ({CONFIG}); libtpu compiles, "
          f"{time.perf_counter() - start:.0f} s in all")
    print(f"{'gen':<6} {'case':<7} {'ours LLO':>9} {'theirs':>8} {'ratio':>6}   {'ours bundles':>12} {'theirs':>8} "
          f"{'ratio':>6}   {'compile s ours':>14} {'theirs':>7}")
    table = {}
    failed = False
    for gen in gens:
        r = results[gen]
        theirs = r["theirs"]
        for case in CASES:
            ours = r[f"ours-{case}"]
            o = ours.get("cases", {}).get(case, {})
            t = theirs.get("cases", {}).get(case, {})
            failed |= "error" in ours or "error" in theirs
            table.setdefault(gen, {})[case] = {"ours": o, "theirs": t,
                                               "compile_s": {"ours": ours.get("compile_s"),
                                                             "theirs (both cases)": theirs.get("compile_s")}}
            ol, tl, ob, tb = o.get("llo", "-"), t.get("llo", "-"), o.get("bundles", "-"), t.get("bundles", "-")
            oc, tcs = ours.get("compile_s"), theirs.get("compile_s")
            print(f"{gen:<6} {case:<7} {ol:>9} {tl:>8} {ratio(ol, tl):>6}   {ob:>12} {tb:>8} {ratio(ob, tb):>6}   "
                  f"{(f'{oc:.0f}' if oc else '-'):>14} {(f'{tcs:.0f}' if tcs else '-'):>7}")
    print("ratio = ours / tpu-inference's; theirs' compile time is one program holding both its kernels. "
          "Bundles are a static schedule (a loop body counts once), not a measured time.")
    for gen in gens:
        for job, r in results[gen].items():
            if "error" in r:
                print(f"{gen} {job}: {r['error'][:400]}")
    if a.json:
        Path(a.json).write_text(json.dumps({"config": CONFIG, "results": table}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

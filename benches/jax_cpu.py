"""P2: CPU execution inside `jax.jit`, side by side in one process: our kernels (tpu_kernel.examples:
the interpreter behind XLA FFI, call overhead included) vs the XLA-fused jnp baseline vs Pallas
`interpret=True` — the same cases, shapes and blocks as `cargo bench --bench interpret`.

    .venv/bin/python benches/jax_cpu.py            # 3 interleaved rounds, ~1 s per case, engine and round
    .venv/bin/python benches/jax_cpu.py --quick    # 1 round, shorter budgets
    .venv/bin/python benches/jax_cpu.py --no-pallas
    .venv/bin/python benches/jax_cpu.py --concurrent  # beside XLA's own work: thread oversubscription

Needs the package installed (`pip install .`, or TPU_KERNEL_EXAMPLES_LIB pointing at a built library).
Each figure is the median of warm runs (`block_until_ready` each); rounds interleave the engines case by
case, rotating their order, so load from other processes hits all alike, and each engine keeps its
best round. Before timing, our output is checked against the jnp result (exit status 1 if it differs).
The jnp and Pallas versions are benches/xla_baselines.py's (those of the Rust benchmark). Ragged paged
attention (a decode step and a mixed batch, benches/rpa_cpu.py) runs through tpu-inference's signature
beside two XLA programs — tpu-inference's own reference and the best jnp formulation — in a table of its
own, with no Pallas run; and again with the kv_cache donated to all three (as tpu-inference's own
`ragged_paged_attention` is jitted: `donate_argnames=(..., "kv_cache")`), where no program copies the cache.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A capped run (`TPU_KERNEL_CPU=avx2`, standing in for a CPU without AVX-512) holds XLA:CPU to the same ISA.
if os.environ.get("TPU_KERNEL_CPU", "native") not in ("", "native"):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX2").strip()
# `--concurrent` runs one call per device of an 8-device CPU mesh at once (set before jax starts).
if "--concurrent" in sys.argv:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import tpu_kernel.examples as ex  # noqa: E402
import xla_baselines as xb  # noqa: E402  (the jnp and Pallas interpret versions, and the inputs)
import rpa_cpu  # noqa: E402  (ragged paged attention's batches and its two XLA programs)

# case -> our kernel call, with the example's blocks spelled out (they are also the defaults)
OURS = {
    "matmul_bf16_256": lambda x, y: ex.matmul(x, y, block=(128, 128, 128)),
    "matmul_bf16_512": lambda x, y: ex.matmul(x, y, block=(128, 128, 128)),
    "matmul_bf16_1024": lambda x, y: ex.matmul(x, y, block=(128, 128, 128)),
    "softmax_f32_1024": lambda x: ex.softmax(x, block_rows=8),
    "rmsnorm_bf16_1024": lambda x, w: ex.rmsnorm(x, w, eps=1e-6, block_rows=16),
    "add_f32_1024": lambda x, y: ex.add(x, y, block=(256, 256)),
    "quantized_matmul": lambda x, w, s: ex.quantized_matmul(x, w, s, block=(128, 128, 128)),
    "quantized_matmul_w8a8": lambda x, xs, w, ws: ex.quantized_matmul_w8a8(x, xs, w, ws, block=(128, 128, 128)),
    "grouped_matmul": lambda o, g, t, lhs, rhs: ex.grouped_matmul(o, g, t, lhs, rhs, block=(128, 128, 128)),
    "flash_attention": lambda q, k, v: ex.flash_attention(q, k, v, causal=False, block=(128, 128)),
    "paged_attention": lambda lengths, table, q, kp, vp: ex.paged_attention(lengths, table, q, kp, vp,
                                                                            pages_per_compute_block=8),
    # Where users are (issue 22): a small matmul, flash attention at [4, 512, 128], a dequant matmul at
    # 256x512x256, rows 8 lanes wide.
    "matmul_bf16_128": lambda x, y: ex.matmul(x, y, block=(128, 128, 128)),
    "flash_attention_4x512": lambda q, k, v: ex.flash_attention(q, k, v, causal=False, block=(128, 128)),
    "quantized_matmul_256x512x256": lambda x, w, s: ex.quantized_matmul(x, w, s, block=(128, 128, 128)),
    "softmax_lanes8": lambda x: ex.softmax(x, block_rows=256),
    # Ragged paged attention (issue 23 item 4) through tpu-inference's signature: a decode step and a
    # mixed batch (benches/rpa_cpu.py), the default block sizes (on the CPU: tpu-inference's, with
    # query blocks of at most 32 tokens); its XLA side is tpu-inference's own reference and the best
    # jnp formulation, with no Pallas run.
    "ragged_paged_attention_decode": lambda *a: ex.ragged_paged_attention(*a, sm_scale=rpa_cpu.SM_SCALE),
    "ragged_paged_attention_mixed": lambda *a: ex.ragged_paged_attention(*a, sm_scale=rpa_cpu.SM_SCALE),
    # The mixed batch at tpu-inference's default blocks for v5e/v6e (rpa_cpu.BATCHES): what the CPU
    # default saves.
    "ragged_paged_attention_mixed_tpu_blocks": lambda *a: ex.ragged_paged_attention(
        *a, sm_scale=rpa_cpu.SM_SCALE,
        m_block_sizes=rpa_cpu.BATCHES["ragged_paged_attention_mixed_tpu_blocks"].m_block_sizes),
}
# The Rust benchmark's kernels that are not in the examples library (its bench-only kernels and the
# `--ops` cases) are not timed here.
assert set(OURS) <= set(xb.CASES), "every case here must be one of benches/xla_baselines.py's"


#: The kv_cache's position in ragged paged attention's arguments (tpu-inference's order).
RPA_CACHE = 3


def donated(f):
    """`f` under `jax.jit` with the kv_cache donated, as tpu-inference's own `ragged_paged_attention`
    is (`jax.jit(..., donate_argnames=("queries", "keys", "values", "kv_cache"))`, the call vLLM makes):
    each call takes the cache the previous call returned (the first a copy of the one given), so XLA
    may update it in place. Every call writes the same tokens into the same slots, so every call sees
    the same cache contents and returns the same output."""
    jf = jax.jit(f, donate_argnums=(RPA_CACHE,))
    state = {}

    def call(*args):
        if "cache" not in state:
            state["cache"] = jnp.array(args[RPA_CACHE], copy=True)
        out, state["cache"] = jf(*args[:RPA_CACHE], state["cache"], *args[RPA_CACHE + 1:])
        return out, state["cache"]
    return call


def median_ms(f, args, budget_s: float) -> float:
    """Median of warm runs (xla_baselines.times_ms: the Rust benchmark's baselines time the same way)."""
    return xb.times_ms(f, args, budget_s)[0]


def check(name: str, ours, ref) -> str | None:
    """None if our output matches the jnp result (bf16: within a rounding step), else why not."""
    o, r = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    if o.shape != r.shape:
        return f"shape {o.shape} != {r.shape}"
    bf16 = ours.dtype == jnp.bfloat16
    rtol, atol = (2e-2, 1e-2 * float(np.max(np.abs(r)))) if bf16 else (1e-5, 1e-6)
    bad = ~np.isclose(o, r, rtol=rtol, atol=atol)
    return f"{int(bad.sum())} elements differ (max |diff| {float(np.max(np.abs(o - r))):.3g})" if bad.any() else None


def check_rpa(name: str, ours, ref) -> str | None:
    """Ragged paged attention: the written tokens' outputs within bf16 rounding of tpu-inference's
    reference (which returns only those), the updated caches bit for bit."""
    (o, cache), (r, r_cache) = ours, ref
    n = rpa_cpu.written(name)
    why = check(name, o[:n], r)
    if why:
        return why
    same = np.array_equal(np.asarray(cache).view(np.uint16), np.asarray(r_cache).view(np.uint16))
    return None if same else "the updated caches differ"


CONCURRENT_CASES = ["matmul_bf16_256", "softmax_f32_1024", "flash_attention_4x512", "softmax_lanes8"]


def concurrent(budget: float, rounds: int) -> None:
    """Our op where XLA runs other work at the same time, vs XLA's own op in the same place, so that
    any fight between our worker threads and XLA's thread pool shows as a ratio worse than alone.

    - `beside`: one jit program of the case and an independent XLA matmul (1024² f32), which XLA may
      run concurrently; time / (case alone + matmul alone).
    - `8 devices`: the case on each of 8 CPU devices at once (`jax.shard_map`, inputs replicated, one
      call per device); time / (8 x the case alone) — below 1 when the calls overlap usefully.
    Each is printed for ours and for XLA's jnp version; ours/XLA under concurrency is the last column.
    """
    from jax.sharding import Mesh, PartitionSpec as P

    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("d",))
    big = [xb.uni((1024, 1024), jnp.float32), xb.uni((1024, 1024), jnp.float32)]
    side = jax.jit(lambda a, b: a @ b)
    print(f"# concurrency ({len(devices)} CPU devices, {os.cpu_count()} cores): median ms, best of {rounds}")
    print(f"{'case':<24} {'engine':<6} {'alone':>8} {'beside':>8} {'b/sum':>6} {'8 dev':>8} {'8d/8x':>6}")
    for name in [c for c in CONCURRENT_CASES if c in OURS]:
        ref, _, make = xb.CASES[name]
        args = make()
        row = {}
        for engine, f in (("ours", OURS[name]), ("xla", ref)):
            alone = jax.jit(f)
            pair = jax.jit(lambda a, b, f=f: (f(*a), side(*b)))
            n = len(args)
            per_dev = jax.jit(jax.shard_map(lambda *xs, f=f: f(*xs)[None], mesh=mesh,
                                            in_specs=tuple(P() for _ in range(n)), out_specs=P("d"),
                                            check_vma=False))
            for fn, a in ((alone, args), (side, big), (pair, (args, big)), (per_dev, args)):
                jax.block_until_ready(fn(*a))
            t = {k: math.inf for k in ("alone", "side", "pair", "dev")}
            for _ in range(rounds):
                t["alone"] = min(t["alone"], median_ms(alone, args, budget))
                t["side"] = min(t["side"], median_ms(side, big, budget))
                t["pair"] = min(t["pair"], median_ms(pair, (args, big), budget))
                t["dev"] = min(t["dev"], median_ms(per_dev, args, budget))
            row[engine] = t
            print(f"{name:<24} {engine:<6} {t['alone']:>8.3f} {t['pair']:>8.3f} "
                  f"{t['pair'] / (t['alone'] + t['side']):>6.2f} {t['dev']:>8.3f} {t['dev'] / (8 * t['alone']):>6.2f}")
        o, x = row["ours"], row["xla"]
        print(f"{'':<24} {'o/x':<6} {o['alone'] / x['alone']:>8.2f} {o['pair'] / x['pair']:>8.2f} "
              f"{'':>6} {o['dev'] / x['dev']:>8.2f}")


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, 0.3 s budgets")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--no-pallas", action="store_true", help="skip Pallas interpret=True (slow)")
    ap.add_argument("--only", default=None, help="cases whose name contains this")
    ap.add_argument("--concurrent", action="store_true",
                    help="only the concurrency table (beside XLA work, 8 devices at once)")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    budget = 0.3 if args.quick else 1.0
    if args.concurrent:
        concurrent(budget, rounds)
        return 0

    base_engines = ["ours", "xla"] + ([] if args.no_pallas else ["pallas"])

    def engines_of(name: str) -> list[str]:
        # ragged paged attention: no Pallas run; the best jnp formulation as a second XLA program; all
        # three also with the cache donated (`_donated`)
        if name in rpa_cpu.BATCHES:
            return ["ours", "xla", "best", "ours_donated", "xla_donated", "best_donated"]
        return base_engines

    cases = [c for c in OURS if not args.only or args.only in c]
    fns, inputs, failures = {}, {}, []
    for name in cases:
        ref, pallas, make = xb.CASES[name]
        inputs[name] = make()
        fns[(name, "ours")] = jax.jit(OURS[name])
        fns[(name, "xla")] = jax.jit(ref)
        fns[(name, "pallas")] = jax.jit(pallas)
        if name in xb.BEST:
            fns[(name, "best")] = jax.jit(xb.BEST[name])
        if name in rpa_cpu.BATCHES:
            for engine, f in (("ours", OURS[name]), ("xla", ref), ("best", xb.BEST[name])):
                fns[(name, f"{engine}_donated")] = donated(f)
        for engine in engines_of(name):  # compile + warm up outside the timed rounds
            jax.block_until_ready(fns[(name, engine)](*inputs[name]))
            jax.block_until_ready(fns[(name, engine)](*inputs[name]))
        ours_out, xla_out = fns[(name, "ours")](*inputs[name]), fns[(name, "xla")](*inputs[name])
        why = check_rpa(name, ours_out, xla_out) if name in rpa_cpu.BATCHES else check(name, ours_out, xla_out)
        if why:
            failures.append(f"{name}: ours != jnp: {why}")
        if name in xb.BEST:
            why = check_rpa(name, fns[(name, "best")](*inputs[name]), xla_out)
            if why:
                failures.append(f"{name}: the best jnp != tpu-inference's reference: {why}")
        if name in rpa_cpu.BATCHES:
            for engine in ("ours", "xla", "best"):
                why = check_rpa(name, fns[(name, f"{engine}_donated")](*inputs[name]), xla_out)
                if why:
                    failures.append(f"{name}: {engine} with the cache donated != tpu-inference's reference: {why}")

    best: dict[tuple[str, str], float] = {}
    for r in range(rounds):
        for name in cases:
            engines = engines_of(name)
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for engine in order:
                ms = median_ms(fns[(name, engine)], inputs[name], budget)
                key = (name, engine)
                best[key] = min(best.get(key, math.inf), ms)

    print(f"# CPU inside jax.jit, median ms of warm runs (best of {rounds} interleaved round(s)); "
          f"jax {jax.__version__}, {os.cpu_count()} cores")
    head = f"{'case':<30} {'ours':>9} {'XLA':>9} {'ours/XLA':>9}"
    if "pallas" in base_engines:
        head += f" {'Pallas':>10} {'Pallas/ours':>12}"
    print(head)
    r_xla, r_pallas = [], []
    for name in cases:
        o, x = best[(name, "ours")], best[(name, "xla")]
        r_xla.append(o / x)
        line = f"{name:<30} {o:>9.3f} {x:>9.3f} {o / x:>9.2f}"
        if "pallas" in engines_of(name):
            p = best[(name, "pallas")]
            r_pallas.append(p / o)
            line += f" {p:>10.3f} {p / o:>12.1f}"
        elif "pallas" in base_engines:
            line += f" {'-':>10} {'-':>12}"
        print(line)
    line = f"{'geomean':<30} {'':>9} {'':>9} {geomean(r_xla):>9.2f}"
    if "pallas" in base_engines:
        line += f" {'':>10} {(f'{geomean(r_pallas):.1f}' if r_pallas else '-'):>12}"
    print(line)
    rpa_cases = [c for c in cases if c in rpa_cpu.BATCHES]
    if rpa_cases:
        print("\n# ragged paged attention (benches/rpa_cpu.py): XLA ref = tpu-inference's ref_ragged_paged_attention "
              "under jax.jit (metadata as constants), XLA jnp = the best jnp formulation (metadata as arrays)")
        print(f"{'case':<30} {'ours':>9} {'XLA ref':>9} {'XLA jnp':>9} {'ours/ref':>9} {'ours/jnp':>9}")
        for name in rpa_cases:
            o, r, j = best[(name, "ours")], best[(name, "xla")], best[(name, "best")]
            print(f"{name:<30} {o:>9.3f} {r:>9.3f} {j:>9.3f} {o / r:>9.2f} {o / j:>9.2f}")
        print("\n# the same, the kv_cache donated to all three (as tpu-inference's own ragged_paged_attention "
              "jit donates it): updated in place, no copy of it per call")
        print(f"{'case':<30} {'ours':>9} {'XLA ref':>9} {'XLA jnp':>9} {'ours/ref':>9} {'ours/jnp':>9}")
        for name in rpa_cases:
            o, r, j = (best[(name, f"{e}_donated")] for e in ("ours", "xla", "best"))
            print(f"{name:<30} {o:>9.3f} {r:>9.3f} {j:>9.3f} {o / r:>9.2f} {o / j:>9.2f}")
    for f in failures:
        print("NUMERICS MISMATCH:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

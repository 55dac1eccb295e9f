"""Our tuner against hardware-tuned choices (issue 25, item 3): `tpu_kernel.tune` over tpu-inference
0.32.0's own Pallas quantized matmul on the keys of its shipped table (the v6 int8 x int8 entries of
`quantized_matmul/tuned_block_sizes.py`, tuned on TPUs), compiled for v6e by libtpu with no TPU and
ranked by our static cost model (docs/tune.md). Per key: is the table's choice our first, in our top 3,
and the model's predicted cost of the table's choice over our best.

    .venv/bin/python benches/tune_tpu_inference.py                 # every v6 int8 x int8 key (long)
    .venv/bin/python benches/tune_tpu_inference.py --sample 16     # 16 keys spread over the table
    .venv/bin/python benches/tune_tpu_inference.py --keys 3 --json out.json
    .venv/bin/python benches/tune_tpu_inference.py --sample 8 --ours   # our quantized_matmul_w8a8 instead

The space per key: batch blocks 128·2^i up to the batch (and the batch itself), out and in blocks
among the multiples of 128 dividing n_out / n_in (up to four, spread from 128 to the whole dimension),
and the table's own choice always. x is bf16 (quantized to int8 in the kernel, as the table's
`x_q_dtype` says), w int8 with f32 per-channel scales.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python" / "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tpu_inference_rpa  # noqa: E402  (registers tpu-inference's bare package, as the tests do)
import tpu_kernel  # noqa: E402


def qmm_module():
    import importlib
    tpu_inference_rpa._register_bare_package()
    logger = sys.modules["tpu_inference.logger"]
    if not hasattr(logger.init_logger(__name__), "warning_once"):
        import logging
        logging.Logger.warning_once = logging.Logger.warning  # tpu-inference's logger API
    kernel = importlib.import_module("tpu_inference.kernels.quantized_matmul.kernel")
    tuned = importlib.import_module("tpu_inference.kernels.quantized_matmul.tuned_block_sizes")
    tuned.get_tpu_version = lambda: 6  # the generation its VMEM limit is read for
    return kernel, tuned


def spread(values, n):
    """Up to `n` of `values` (sorted), spread from the first to the last."""
    values = sorted(set(values))
    if len(values) <= n:
        return values
    return sorted({values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)})


def space_for(key, table_value):
    b, o, i = key.n_batch, key.n_out, key.n_in
    batch = [v for v in (128, 256, 512, 1024, 2048) if v <= max(b, 128)] + ([b] if b % 128 == 0 else [])
    outs = spread([d for d in range(128, o + 1, 128) if o % d == 0], 4)
    ins = spread([d for d in range(128, i + 1, 128) if i % d == 0], 4)
    tv = table_value
    return {"bb": sorted(set(batch) | {tv.batch_block_size}), "bo": sorted(set(outs) | {tv.out_block_size}),
            "bi": sorted(set(ins) | {tv.in_block_size})}


def v6_int8_keys(tuned):
    """The table's v6 int8 x int8 entries, sorted: (TunedKey, TunedValue)."""
    return sorted((k, v) for k, v in tuned.TUNED_BLOCK_SIZES.items()
                  if k.tpu_version == 6 and k.x_q_dtype == "int8" and k.w_q_dtype == "int8")


def run(kernel, tuned, keys, workers=2, verbose=False):
    """Tune tpu-inference's kernel on each key; a row per key (see the module docstring)."""
    def qmm(x, w_q, w_scale, *, bb, bo, bi):
        return kernel.quantized_matmul_kernel(x, w_q, w_scale, x_q_dtype=jnp.int8,
                                              tuned_value=tuned.TunedValue(bb, bo, bi))

    rows = []
    t0 = time.perf_counter()
    for n, (key, value) in enumerate(keys):
        S = jax.ShapeDtypeStruct
        args = (S((key.n_batch, key.n_in), jnp.bfloat16), S((key.n_out, key.n_in), jnp.int8),
                S((key.n_out,), jnp.float32))
        space = space_for(key, value)
        t = tpu_kernel.tune(qmm, *args, space=space, generation="v6e", workers=workers, cache_dir="",
                            progress=False, name="tpu_inference.quantized_matmul")
        ranked = t.ranked()
        table = {"bb": value.batch_block_size, "bo": value.out_block_size, "bi": value.in_block_size}
        order = [c.config for c in ranked]
        pos = order.index(table) if table in order else None
        table_cycles = ranked[pos].cycles if pos is not None else None
        row = {"key": list(key)[1:4], "table": table, "ours": t.best, "rank_of_table": None if pos is None else pos + 1,
               "ranked": len(ranked), "candidates": len(t.candidates),
               "cost_ratio_table_over_ours": None if table_cycles is None else table_cycles / t.best_cycles,
               "table_outcome": next((c.outcome + (": " + c.reason if c.reason else "") for c in t.candidates
                                      if c.config == table), "absent")}
        rows.append(row)
        ratio = "-" if row["cost_ratio_table_over_ours"] is None else f"{row['cost_ratio_table_over_ours']:.3f}"
        if verbose:
            print(f"[{n + 1}/{len(keys)} {time.perf_counter() - t0:.0f} s] batch {key.n_batch} out {key.n_out} in "
                  f"{key.n_in}: table {table['bb']},{table['bo']},{table['bi']} rank {row['rank_of_table']}/{len(ranked)}"
                  f", ours {t.best['bb']},{t.best['bo']},{t.best['bi']}, table/ours {ratio}", flush=True)
    return rows


def run_ours(keys, workers=2, verbose=False):
    """Our `quantized_matmul_w8a8` (x int8 [m, k] with per-row scales, w int8 [k, n] with per-channel
    scales) tuned over the same space on each key: our best's predicted cycles, and the table's choice
    run through our kernel (or why our checks refuse it)."""
    import tpu_kernel.examples as ex

    def ours(x, xs, w, ws, *, bb, bo, bi):
        return ex.quantized_matmul_w8a8(x, xs, w, ws, block=(bb, bo, bi))

    rows = []
    t0 = time.perf_counter()
    for n, (key, value) in enumerate(keys):
        S = jax.ShapeDtypeStruct
        m, k, o = key.n_batch, key.n_in, key.n_out
        args = (S((m, k), jnp.int8), S((m, 1), jnp.float32), S((k, o), jnp.int8), S((1, o), jnp.float32))
        t = tpu_kernel.tune(ours, *args, space=space_for(key, value), generation="v6e", workers=workers,
                            cache_dir="", progress=False, name="examples.quantized_matmul_w8a8")
        table = {"bb": value.batch_block_size, "bo": value.out_block_size, "bi": value.in_block_size}
        mine = next((c for c in t.candidates if c.config == table), None)
        row = {"key": [m, o, k], "table": table, "ours_best": t.best, "ours_best_cycles": t.best_cycles,
               "table_through_ours": None if mine is None or mine.outcome != "ranked" else mine.cycles,
               "table_through_ours_outcome": "absent" if mine is None else
               mine.outcome + (": " + mine.reason if mine.reason else ""),
               "ranked": len(t.ranked()), "candidates": len(t.candidates)}
        rows.append(row)
        if verbose:
            tt = row["table_through_ours"]
            print(f"[{n + 1}/{len(keys)} {time.perf_counter() - t0:.0f} s] batch {m} out {o} in {k}: our best "
                  f"{t.best['bb']},{t.best['bo']},{t.best['bi']} {t.best_cycles:.0f} cycles; the table's "
                  f"{table['bb']},{table['bo']},{table['bi']} through ours: "
                  + (f"{tt:.0f} cycles ({tt / t.best_cycles:.3f}x)" if tt else row["table_through_ours_outcome"][:120]),
                  flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, help="this many keys, spread over the table")
    ap.add_argument("--keys", type=int, help="the first N keys")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--ours", action="store_true",
                    help="tune our quantized_matmul_w8a8 on the keys instead, and run the table's choice through it")
    a = ap.parse_args()
    kernel, tuned = qmm_module()
    keys = v6_int8_keys(tuned)
    if a.sample:
        keys = [keys[round(i * (len(keys) - 1) / max(1, a.sample - 1))] for i in range(min(a.sample, len(keys)))]
    if a.keys:
        keys = keys[:a.keys]
    print(f"{len(keys)} v6 int8 x int8 keys of tpu-inference's quantized matmul table", flush=True)

    t0 = time.perf_counter()
    if a.ours:
        rows = run_ours(keys, a.workers, verbose=True)
        through = [r for r in rows if r["table_through_ours"]]
        print(f"\nkeys {len(rows)}; the table's choice runs through our kernel on {len(through)}; "
              f"{time.perf_counter() - t0:.0f} s")
        if a.json:
            Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))
        return
    rows = run(kernel, tuned, keys, a.workers, verbose=True)
    ranked_rows = [r for r in rows if r["rank_of_table"] is not None]
    first = sum(r["rank_of_table"] == 1 for r in ranked_rows)
    top3 = sum(r["rank_of_table"] <= 3 for r in ranked_rows)
    print(f"\nkeys {len(rows)}; the table's choice compiled and ranked on {len(ranked_rows)}: our first on "
          f"{first} ({first / max(1, len(rows)):.0%}), in our top 3 on {top3} ({top3 / max(1, len(rows)):.0%}); "
          f"{time.perf_counter() - t0:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "first": first, "top3": top3}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    main()

"""Our tuner against hardware-tuned choices (issue 25, item 3): `tpu_kernel.tune` over tpu-inference
0.32.0's own Pallas kernels on the keys of the block-size tables it ships (tuned on TPUs), compiled by
libtpu with no TPU and ranked by our static cost model (docs/tune.md). Per key: is the table's choice
our first, in our top 3, and the model's predicted cost of the table's choice over our best.

Two tables (`--table`):

- `qmm`: `quantized_matmul/tuned_block_sizes.py`, its v6 int8 x int8 entries (319 keys), for v6e.
  x is bf16 (quantized to int8 in the kernel, as the key's `x_q_dtype` says), w int8 with f32
  per-channel scales. Space per key: batch blocks 128·2^i up to the batch (and the batch itself), out
  and in blocks among the multiples of 128 dividing n_out / n_in (up to four, spread from 128 to the
  whole dimension); pruned before compiling where tpu-inference's own VMEM accounting says the blocks
  need more than its v6 VMEM limit.
- `gmm`: `megablox/tuned_block_sizes.py` (50 keys: bf16 lhs x float8_e4m3fn rhs with per-channel
  scales, bf16 out). The table names no generation; fp8 weights point at tpu7x, whose MXU takes fp8,
  so the keys are compiled for tpu7x. Group sizes are run-time data, and so is the grid's group-tile
  axis: the model takes its bound with every group holding rows, m / tm + min(groups, m) - 1 visits.
  Space per key: tm among 128/256/512 dividing m (m itself if smaller), tk among the multiples of 128
  dividing k and k itself (gmm takes tk = k for any other tk), tn among the multiples of 128 up to n
  rounded up to 128 (up to four of each, spread).

In both the table's own choice is always a candidate.

    .venv/bin/python benches/tune_tpu_inference.py --sample 16                 # 16 qmm keys, spread
    .venv/bin/python benches/tune_tpu_inference.py --out qmm.jsonl             # every qmm key (hours)
    .venv/bin/python benches/tune_tpu_inference.py --table gmm --out gmm.jsonl # every gmm key
    .venv/bin/python benches/tune_tpu_inference.py --report qmm.jsonl gmm.jsonl  # re-rank, no compile
    .venv/bin/python benches/tune_tpu_inference.py --stored                    # grow the kept qmm rows
    .venv/bin/python benches/tune_tpu_inference.py --report                    # judge the kept rows
    .venv/bin/python benches/tune_tpu_inference.py --sample 8 --ours           # our quantized_matmul_w8a8
    .venv/bin/python benches/tune_tpu_inference.py --table gmm --sample 12 --ours  # our grouped_matmul
    .venv/bin/python benches/tune_tpu_inference.py --table gmm --ours --stored # grow our kernel's kept rows
    .venv/bin/python benches/tune_tpu_inference.py --report --ours             # judge them
    .venv/bin/python benches/tune_tpu_inference.py --report --every-step       # as if every block moved every step
    .venv/bin/python benches/tune_tpu_inference.py --add-copies                # kept rows: fill in copy patterns

The rows compiled so far are kept in the repository (`benches/data/tpu_inference_tables/`, gzipped
JSON lines): `--stored` appends to them, skipping the keys they hold, and `--report` with no file
judges them — the full tables grow run by run instead of being compiled again on every machine. Our
own kernels tuned on the same keys are kept beside them (`ours_<table>.<generation>.jsonl.gz`, every
candidate's schedule as well): `--ours --stored` appends, `--report --ours` judges them.

`--out` appends one JSON line per key with every candidate's outcome and the model's inputs
(`steps`, `body`, `outside`, `dma_step`; the schedule, and `copies`, what its pipeline copies after
the first step), and skips the keys already in the file, so a long run can be
stopped and resumed; keys run in a spread order (any prefix is spread over the table). `--report`
estimates the stored schedules again under the model as it is now and ranks them, so the model can
change without a compile.
"""
import argparse
import gzip
import importlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python" / "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tpu_inference_rpa  # noqa: E402  (registers tpu-inference's bare package, as the tests do)
import tpu_kernel  # noqa: E402


def _tpu_inference(module: str):
    tpu_inference_rpa._register_bare_package()
    logger = sys.modules["tpu_inference.logger"]
    if not hasattr(logger.init_logger(__name__), "warning_once"):
        import logging
        logging.Logger.warning_once = logging.Logger.warning  # tpu-inference's logger API
    return importlib.import_module(f"tpu_inference.kernels.{module}")


def qmm_module():
    kernel = _tpu_inference("quantized_matmul.kernel")
    tuned = _tpu_inference("quantized_matmul.tuned_block_sizes")
    tuned.get_tpu_version = lambda: 6  # the generation its VMEM limit is read for
    return kernel, tuned


def spread(values, n):
    """Up to `n` of `values` (sorted), spread from the first to the last."""
    values = sorted(set(values))
    if len(values) <= n:
        return values
    return sorted({values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)})


def spread_order(n):
    """0..n-1 in an order whose every prefix is spread over the range (bit-reversed, van der Corput)."""
    bits = max(1, (n - 1).bit_length())
    rev = sorted(range(1 << bits), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2))
    return [i for i in rev if i < n]


def _dim_blocks(d, n=4):
    return spread([b for b in range(128, d + 1, 128) if d % b == 0], n)


class Qmm:
    """tpu-inference's quantized matmul on its v6 int8 x int8 table, for v6e."""
    name, generation, params = "qmm", "v6e", ("bb", "bo", "bi")

    def __init__(self):
        self.kernel, self.tuned = qmm_module()

    def keys(self):
        """The table's v6 int8 x int8 entries, sorted: (key [batch, out, in], the table's config)."""
        t = self.tuned
        items = sorted((k, v) for k, v in t.TUNED_BLOCK_SIZES.items()
                       if k.tpu_version == 6 and k.x_q_dtype == "int8" and k.w_q_dtype == "int8")
        return [([k.n_batch, k.n_out, k.n_in], {"bb": v.batch_block_size, "bo": v.out_block_size,
                                                "bi": v.in_block_size}) for k, v in items]

    @staticmethod
    def space(key, table):
        b, o, i = key
        batch = [v for v in (128, 256, 512, 1024, 2048) if v <= max(b, 128)] + ([b] if b % 128 == 0 else [])
        return {"bb": sorted(set(batch) | {table["bb"]}), "bo": sorted(set(_dim_blocks(o)) | {table["bo"]}),
                "bi": sorted(set(_dim_blocks(i)) | {table["bi"]})}

    def args(self, key):
        b, o, i = key
        S = jax.ShapeDtypeStruct
        return (S((b, i), jnp.bfloat16), S((o, i), jnp.int8), S((o,), jnp.float32))

    @staticmethod
    def trips(key):
        return None  # a static grid

    def constraints(self, key, choice):
        """Prune before compiling what tpu-inference's own VMEM accounting (`util.get_vmem_limit`,
        uncapped) says needs more than its v6 limit (`DEVICE_VMEM_LIMIT[6]`, 96 MiB): such a kernel
        runs out of VMEM on the TPU. The table's choice is never pruned."""
        util = _tpu_inference("quantized_matmul.util")
        limit = self.tuned.DEVICE_VMEM_LIMIT[6]
        b, o, i = key

        def fits(c):
            if c == choice:
                return True
            up = [-(-d // blk) * blk for d, blk in ((b, c["bb"]), (o, c["bo"]), (i, c["bi"]))]
            nb, no, ni = up[0] // c["bb"], up[1] // c["bo"], up[2] // c["bi"]
            need = util.get_vmem_limit(
                n_batch=nb, n_out=no, n_in=ni, batch_block_size=c["bb"], out_block_size=c["bo"],
                in_block_size=c["bi"], x_dtype=jnp.bfloat16, x_q_dtype=jnp.int8, w_q_dtype=jnp.int8,
                scale_dtype=jnp.float32, out_dtype=jnp.bfloat16, acc_dtype=jnp.int32, save_acc=ni > 1,
                save_x_q=ni == 1 and no > 1, upper_limit_bytes=1 << 62)
            return need <= limit
        return [fits]

    def fn(self):
        kernel, tuned = self.kernel, self.tuned

        def qmm(x, w_q, w_scale, *, bb, bo, bi):
            return kernel.quantized_matmul_kernel(x, w_q, w_scale, x_q_dtype=jnp.int8,
                                                  tuned_value=tuned.TunedValue(bb, bo, bi))
        return qmm


class Gmm:
    """tpu-inference's megablox gmm on its table (bf16 x fp8, per-channel scales), for tpu7x."""
    name, generation, params = "gmm", "tpu7x", ("tm", "tk", "tn")

    def __init__(self):
        self.gmm = _tpu_inference("megablox.gmm")
        self.tuned = _tpu_inference("megablox.tuned_block_sizes")

    def keys(self):
        """(key [m, k, n, total groups, current groups], the table's config), sorted."""
        rows = []
        for k, v in sorted(self.tuned.TUNED_BLOCK_SIZES.items()):
            m, kk, n, g_total, g_cur, lhs, rhs, qbs = k
            assert (lhs, rhs, qbs) == ("bfloat16", "float8_e4m3fn", kk), k
            rows.append(([m, kk, n, g_total, g_cur], {"tm": v[0], "tk": v[1], "tn": v[2]}))
        return rows

    @staticmethod
    def space(key, table):
        m, k, n = key[:3]
        tms = [t for t in (128, 256, 512) if t <= m and m % t == 0] or [m]
        # gmm keeps a tk that divides k or that k divides (its scales are per channel: one quant block
        # of k) and takes tk = k otherwise: only those are distinct kernels
        tks = spread([t for t in range(128, k + 1, 128) if k % t == 0] + [k], 4)
        tns = spread(list(range(128, -(-n // 128) * 128 + 1, 128)), 4)
        return {"tm": sorted(set(tms) | {table["tm"]}), "tk": sorted(set(tks) | {table["tk"]}),
                "tn": sorted(set(tns) | {table["tn"]})}

    def args(self, key):
        m, k, n, g_total, g_cur = key
        S = jax.ShapeDtypeStruct
        return (S((m, k), jnp.bfloat16), S((g_cur, k, n), jnp.float8_e4m3fn), S((g_total,), jnp.int32),
                S((g_cur, 1, 1, n), jnp.float32))

    def constraints(self, key, choice):
        return []

    @staticmethod
    def trips(key):
        """The trip count of the grid's run-time axis (group-tile visits) for a configuration."""
        m, g_cur = key[0], key[4]
        return lambda c: [m // c["tm"] + min(g_cur, m) - 1]

    def fn(self):
        gmm = self.gmm.gmm

        def grouped(lhs, rhs, group_sizes, rhs_scale, *, tm, tk, tn):
            return gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, rhs_scale=rhs_scale,
                       tiling=(tm, tk, tn))
        return grouped


TABLES = {"qmm": Qmm, "gmm": Gmm}


def tune_key(table, key, choice, workers=2):
    """One key tuned: a JSON row with every candidate (config, outcome, the model's inputs)."""
    t0 = time.perf_counter()
    space = table.space(key, choice)
    t = tpu_kernel.tune(table.fn(), *table.args(key), space=space, generation=table.generation,
                        constraints=table.constraints(key, choice), workers=workers, cache_dir="",
                        progress=False, name=f"tpu_inference.{table.name}", trips=table.trips(key))
    size = math.prod(len(values) for values in space.values())
    return {"table": table.name, "generation": table.generation, "key": key, "table_choice": choice,
            "space": size, "candidates": kept_candidates(t), "seconds": round(time.perf_counter() - t0, 1)}


def kept_candidates(t):
    """A `Tuned`'s candidates as a stored row keeps them: config, outcome, the model's inputs."""
    return [{"config": c.config, "outcome": c.outcome, "estimate": c.estimate, "reason": c.reason,
             "schedule": c.schedule, "copies": c.copies} for c in t.candidates]


# the bound a pipeline descriptor carries for a grid axis sized at run time (i32::MAX, as
# kernel_runtime::libtpu::cost::RUN_TIME_BOUND reads it)
RUN_TIME_BOUND = 2**31 - 1


def at_their_share(schedule, trips):
    """`schedule` with its grid loop's rare regions (`loop_body_rare`: run only when an index equals a
    constant) counted at one step in the innermost grid axis's with more than one step (`trips` for
    the axes sized at run time), not every step: the branch rule of docs/tune.md, measured with
    `--report --branches`, not part of the model."""
    given = iter(trips)
    grid = [next(given) if b == RUN_TIME_BOUND else b for b in schedule["iteration_bounds"]]
    inner = next((b for b in reversed(grid) if b > 1), 1)
    rare = min(schedule.get("loop_body_rare", 0), schedule["loop_body_weighted"])
    return {**schedule, "loop_body_weighted": schedule["loop_body_weighted"] - rare + -(-rare // inner)}


def reestimate(row, branches=False, every_step=False):
    """`row` with every stored schedule estimated again by the model as it is now (no compile); with
    `branches`, each schedule's rare regions at their share (`at_their_share`); with `every_step`,
    every block moving every step (the stored copy patterns left out: the model before it read them)."""
    from tpu_kernel import libtpu
    # our kernels' grids are static; tpu-inference's gmm sizes one axis at run time
    trips_of = None if row.get("kernel") == "ours" else TABLES[row["table"]].trips(row["key"])
    cands = []
    for c in row["candidates"]:
        if c.get("schedule") and c["outcome"] in ("ranked", "rejected"):
            trips = trips_of(c["config"]) if trips_of else ()
            schedule = at_their_share(c["schedule"], trips) if branches else c["schedule"]
            copies = None if every_step else c.get("copies")
            est, why = libtpu.estimate(schedule, row["generation"], trips, copies)
            # a schedule is there only when libtpu compiled it: rejected, it was the model that refused
            if est is not None:
                c = {**c, "outcome": "ranked", "estimate": est, "reason": None}
            elif est is None and c["outcome"] == "ranked":
                c = {**c, "outcome": "rejected", "estimate": None, "reason": why}
        cands.append(c)
    return {**row, "candidates": cands}


def model_cycles(estimate, step_overhead=0.0):
    """The model's cycles (docs/tune.md) from its stored inputs, plus `step_overhead` per grid step."""
    return estimate["cycles"] + step_overhead * estimate["steps"]


def ranked(row, step_overhead=0.0):
    """`row`'s ranked candidates, cheapest first under the model (ties by config)."""
    return sorted((c for c in row["candidates"] if c["outcome"] == "ranked"),
                  key=lambda c: (model_cycles(c["estimate"], step_overhead), json.dumps(c["config"], sort_keys=True)))


def judge(row, step_overhead=0.0):
    """Where the table's choice lands in our ranking of `row`'s candidates."""
    ranked_ = ranked(row, step_overhead)
    configs = [c["config"] for c in ranked_]
    choice = row["table_choice"]
    pos = configs.index(choice) if choice in configs else None
    best = model_cycles(ranked_[0]["estimate"], step_overhead) if ranked_ else None
    out = {"key": row["key"], "table": choice, "ours": configs[0] if ranked_ else None, "ranked": len(ranked_),
           "candidates": len(row["candidates"]), "rank_of_table": None if pos is None else pos + 1,
           "cost_ratio_table_over_ours": None if pos is None else
           model_cycles(ranked_[pos]["estimate"], step_overhead) / best}
    if pos is None:
        c = next((c for c in row["candidates"] if c["config"] == choice), None)
        out["table_outcome"] = "absent" if c is None else f"{c['outcome']}: {c['reason']}"
    return out


def keep(out, raw):
    """Append a raw row to the JSON-lines file `out`, if any (as it is made: a run can be resumed)."""
    if out:
        with _open(out, "a") as f:
            f.write(json.dumps(raw) + "\n")


def run(table, keys, workers=2, verbose=False, out=None):
    """Tune `table`'s kernel on each (key, choice); rows as `judge` gives them. With `out`, every raw
    row is appended there as it is made."""
    rows = []
    t0 = time.perf_counter()
    for n, (key, choice) in enumerate(keys):
        raw = tune_key(table, key, choice, workers)
        keep(out, raw)
        row = judge(raw)
        rows.append(row)
        if verbose:
            print(f"[{n + 1}/{len(keys)} {time.perf_counter() - t0:.0f} s] {format_row(table.params, row)}",
                  flush=True)
    return rows


def _cfg(params, c, sep=","):
    return sep.join(str(c[p]) for p in params) if c else "-"


def format_row(params, r):
    ratio = "-" if r["cost_ratio_table_over_ours"] is None else f"{r['cost_ratio_table_over_ours']:.3f}"
    rank = f"{r['rank_of_table']}/{r['ranked']}" if r["rank_of_table"] else f"- ({r.get('table_outcome', '')[:80]})"
    return (f"key {r['key']}: table {_cfg(params, r['table'])} rank {rank}, ours {_cfg(params, r['ours'])}, "
            f"table/ours {ratio}")


def markdown_row(params, r):
    """`r` as a row of docs/tune.md's tables of the tables' choices in our ranking."""
    ratio = r["cost_ratio_table_over_ours"]
    rank = f"{r['rank_of_table']} / {r['ranked']}" if r["rank_of_table"] else "not ranked"
    return (f"| {', '.join(map(str, r['key']))} | {_cfg(params, r['table'])} | {rank} | "
            f"{_cfg(params, r['ours'])} | {'-' if ratio is None else f'{ratio:.3f}'} |")


def summary(rows, label=""):
    n = len(rows)
    first = sum(r["rank_of_table"] == 1 for r in rows)
    top3 = sum(r["rank_of_table"] is not None and r["rank_of_table"] <= 3 for r in rows)
    ratios = sorted(r["cost_ratio_table_over_ours"] for r in rows if r["cost_ratio_table_over_ours"])
    med = ratios[len(ratios) // 2] if ratios else float("nan")
    return (f"{label}keys {n}: the table's choice is our first on {first} ({first / max(1, n):.0%}), in our top 3 on "
            f"{top3} ({top3 / max(1, n):.0%}); median predicted cost table/ours {med:.3f}")


# Every key's compiled candidates kept in the repository (`--stored` appends to them, `--report` with
# no file judges them), so the full tables grow across runs and machines instead of being compiled
# again.
STORED = {"qmm": REPO / "benches" / "data" / "tpu_inference_tables" / "qmm.v6e.jsonl.gz",
          "gmm": REPO / "benches" / "data" / "tpu_inference_tables" / "gmm.tpu7x.jsonl.gz"}
# The same for our own kernels tuned on the tables' keys (`--ours --stored`, `--report --ours`).
STORED_OURS = {"qmm": REPO / "benches" / "data" / "tpu_inference_tables" / "ours_qmm.v6e.jsonl.gz",
               "gmm": REPO / "benches" / "data" / "tpu_inference_tables" / "ours_gmm.tpu7x.jsonl.gz"}


def _open(path, mode):
    """A JSON-lines file, gzip-compressed when its name ends in `.gz` (appending adds a gzip member;
    reading takes every member)."""
    path = str(path)
    return gzip.open(path, mode + "t") if path.endswith(".gz") else open(path, mode)


def read_rows(paths):
    rows = []
    for p in paths:
        with _open(p, "r") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _run_ours(table, keys, tune_one, describe, verbose, out=None):
    """Our kernel tuned on each key (`tune_one(key, choice)` -> (the `Tuned`, the table's choice as
    our kernel takes it)): rows as `judge_ours` gives them. With `out`, every raw row (every
    candidate's outcome and schedule, as `tune_key` keeps them) is appended there as it is made."""
    rows = []
    t0 = time.perf_counter()
    for n, (key, choice) in enumerate(keys):
        t1 = time.perf_counter()
        t, as_ours = tune_one(key, choice)
        raw = {"table": table.name, "kernel": "ours", "generation": table.generation, "key": key,
               "table_choice": choice, "table_as_ours": as_ours,
               "candidates": kept_candidates(t), "seconds": round(time.perf_counter() - t1, 1)}
        keep(out, raw)
        row = judge_ours(raw)
        rows.append(row)
        if verbose:
            print(f"[{n + 1}/{len(keys)} {time.perf_counter() - t0:.0f} s] {describe(key)}: "
                  + format_ours(table.params, row), flush=True)
    return rows


def judge_ours(row, step_overhead=0.0):
    """Our kernel's candidates on one key ranked by the model: our best, its cycles, and the table's
    choice run through our kernel (its cycles, or why our checks refuse it)."""
    ranked_ = ranked(row, step_overhead)
    mine = next((c for c in row["candidates"] if c["config"] == row["table_as_ours"]), None)
    through = (model_cycles(mine["estimate"], step_overhead)
               if mine is not None and mine["outcome"] == "ranked" else None)
    return {"key": row["key"], "table": row["table_choice"], "table_as_ours": row["table_as_ours"],
            "ours_best": ranked_[0]["config"] if ranked_ else None,
            "ours_best_cycles": model_cycles(ranked_[0]["estimate"], step_overhead) if ranked_ else None,
            "table_through_ours": through,
            "table_through_ours_outcome": "absent" if mine is None else
            mine["outcome"] + (": " + mine["reason"] if mine["reason"] else ""),
            "ranked": len(ranked_), "candidates": len(row["candidates"])}


def format_ours(params, r):
    tt, best = r["table_through_ours"], r["ours_best_cycles"]
    as_ours = f" (as {_cfg(params, r['table_as_ours'])})" if r["table_as_ours"] != r["table"] else ""
    return (f"our best {_cfg(params, r['ours_best'])} "
            + ("-" if best is None else f"{best:.0f} cycles") + f"; the table's {_cfg(params, r['table'])} "
            f"through ours{as_ours}: "
            + (f"{tt:.0f} cycles ({tt / best:.3f}x)" if tt and best else r["table_through_ours_outcome"][:160]))


def markdown_ours(params, r):
    """`r` as a row of docs/tune.md's tables of our kernels on the keys."""
    def cfg(c):
        return _cfg(params, c, ", ")
    tt, best = r["table_through_ours"], r["ours_best_cycles"]
    table = cfg(r["table"]) + (f" ({cfg(r['table_as_ours'])})" if r["table_as_ours"] != r["table"] else "")
    # the refusal's message without its outcome and source location (`pruned: path.rs:98:20: ...`)
    why = re.sub(r"^\w+: (\S+\.rs:\d+:\d+: )?", "", r["table_through_ours_outcome"])
    through = f"{tt:,.0f}" if tt else f"refused: {why[:90].rstrip()}"
    return (f"| {', '.join(map(str, r['key']))} | {table} | {cfg(r['ours_best'])} | "
            f"{'-' if best is None else f'{best:,.0f}'} | {through} | "
            f"{f'{tt / best:.3f}' if tt and best else '-'} | {r['ranked']} / {r['candidates']} |")


def summary_ours(rows, label=""):
    n = len(rows)
    through = [r for r in rows if r["table_through_ours"] and r["ours_best_cycles"]]
    same = sum(r["ours_best"] == r["table_as_ours"] for r in rows)
    ratios = sorted(r["table_through_ours"] / r["ours_best_cycles"] for r in through)
    med = ratios[len(ratios) // 2] if ratios else float("nan")
    return (f"{label}keys {n}: the table's choice runs through our kernel on {len(through)}, and is our best on "
            f"{same}; median predicted cost, the table's choice through ours / our best, {med:.3f}")


def ours_qmm():
    """Our `quantized_matmul_w8a8` as `run_ours` tunes it: `(fn, args_of(key))`."""
    import tpu_kernel.examples as ex
    limit = qmm_module()[1].DEVICE_VMEM_LIMIT[6]

    def ours(x, xs, w, ws, *, bb, bo, bi):
        return ex.quantized_matmul_w8a8(x, xs, w, ws, block=(bb, bo, bi), vmem_limit_bytes=limit)

    def args_of(key):
        S = jax.ShapeDtypeStruct
        m, o, k = key
        return (S((m, k), jnp.int8), S((m, 1), jnp.float32), S((k, o), jnp.int8), S((1, o), jnp.float32))
    return ours, args_of


def run_ours(keys, workers=2, verbose=False, out=None):
    """Our `quantized_matmul_w8a8` (x int8 [m, k] with per-row scales, w int8 [k, n] with per-channel
    scales) tuned over the qmm space on each key: our best's predicted cycles, and the table's choice
    run through our kernel (or why our checks refuse it). Ours runs under tpu-inference's v6 VMEM
    ceiling (`DEVICE_VMEM_LIMIT[6]`, 96 MiB), the limit its kernel raises its own to."""
    ours, args_of = ours_qmm()

    def tune_one(key, table):
        return tpu_kernel.tune(ours, *args_of(key), space=Qmm.space(key, table), generation="v6e", workers=workers,
                               cache_dir="", progress=False, name="examples.quantized_matmul_w8a8"), table

    return _run_ours(Qmm, keys, tune_one, lambda key: "batch {} out {} in {}".format(*key), verbose, out)


def group_metadata_jnp(sizes, m, tm):
    """`tpu_kernel.examples.group_metadata` in jnp ops, for a traced `sizes` under a TPU lowering (the
    library's own goes through a host callback): `(offsets [G + 1], group_ids, m_tiles)`, the last two
    `[m // tm + G - 1]`; each non-empty group visits the tiles its rows touch, in order, and unused
    trailing visits repeat the last one. Checked against the library's in python/tests/test_tune.py."""
    g = sizes.shape[0]
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes, dtype=jnp.int32)])
    start, end = offsets[:-1], offsets[1:]
    first, last = start // tm, (end + tm - 1) // tm
    count = jnp.where(end > start, last - first, 0)
    upto = jnp.cumsum(count)  # visits of groups 0..=g
    visits = m // tm + g - 1
    v = jnp.minimum(jnp.arange(visits, dtype=jnp.int32), upto[-1] - 1)
    group = jnp.searchsorted(upto, v, side="right").astype(jnp.int32)
    tile = first[group] + v - (upto[group] - count[group])
    return offsets, group, tile.astype(jnp.int32)


GMM_OURS_VMEM = 60 << 20


def ours_gmm():
    """Our `grouped_matmul` as `run_ours_gmm` tunes it: `(fn, args_of(key))`."""
    import tpu_kernel.examples as ex

    def ours(sizes, lhs, rhs, *, tm, tk, tn):
        return ex.grouped_matmul(*group_metadata_jnp(sizes, lhs.shape[0], tm), lhs, rhs, block=(tm, tk, tn),
                                 vmem_limit_bytes=GMM_OURS_VMEM)

    def args_of(key):
        m, k, n, _, g = key
        S = jax.ShapeDtypeStruct
        return (S((g,), jnp.int32), S((m, k), jnp.bfloat16), S((g, k, n), jnp.bfloat16))
    return ours, args_of


def add_copies(path, rows):
    """`rows` (kept rows, as read from `path`) with every compiled candidate's copy pattern
    (`tpu_kernel.tune`'s `copies`: what the pipeline copies after the first step, from the kernel's
    index maps) filled in where the row was kept before the model read it: each such candidate is
    lowered again (no compile). Written back to `path` when anything was added."""
    from tpu_kernel._copies import block_copies
    from tpu_kernel._tune import _lower
    added, t0 = 0, time.perf_counter()
    for n, row in enumerate(rows):
        missing = [c for c in row["candidates"] if c.get("schedule") and "copies" not in c]
        if not missing:
            continue
        table = TABLES[row["table"]]
        if row.get("kernel") == "ours":
            fn, args_of = (ours_qmm if row["table"] == "qmm" else ours_gmm)()
            fn_args = (fn, args_of(row["key"]))
        else:
            t = table()
            fn_args = (t.fn(), t.args(row["key"]))
        for c in missing:
            c["copies"] = block_copies(_lower(*fn_args, c["config"], row["generation"]))
            added += 1
        print(f"[{n + 1}/{len(rows)} {time.perf_counter() - t0:.0f} s] {path.name if hasattr(path, 'name') else path}"
              f" key {row['key']}: {len(missing)} candidates", flush=True)
    if added:
        tmp = str(path) + ".tmp" + (".gz" if str(path).endswith(".gz") else "")
        with _open(tmp, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    return added


def run_ours_gmm(keys, workers=2, verbose=False, out=None):
    """Our `grouped_matmul` tuned over the gmm space on each key, and the table's choice run through it
    (or why our checks refuse it). Our kernel takes bf16 weights only: the key's float8_e4m3fn
    weights and their per-channel scales are bf16 weights here, twice the bytes of the weight blocks.
    Its metadata is computed in the function (`group_metadata_jnp`) from the current groups' sizes,
    as megablox's gmm computes its own; its grid's group-tile axis is static (m / tm + G - 1 visits).
    Megablox runs under tpu7x's default scoped VMEM limit (32 MiB); ours, whose weight blocks are
    twice the bytes, under `GMM_OURS_VMEM` (60 MiB of the 64 MiB a tpu7x TensorCore has), so that the
    table's choices fit."""
    ours, args_of = ours_gmm()

    def tune_one(key, choice):
        k = key[1]
        # a tk past k is one (masked) tile of all of k in megablox's gmm: ours takes that as tk = k
        table = {**choice, "tk": min(choice["tk"], k)}
        return tpu_kernel.tune(ours, *args_of(key), space=Gmm.space(key, table), generation=Gmm.generation,
                               workers=workers, cache_dir="", progress=False, name="examples.grouped_matmul"), table

    return _run_ours(Gmm, keys, tune_one,
                     lambda key: "m {} k {} n {} groups {}".format(key[0], key[1], key[2], key[4]), verbose, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", choices=sorted(TABLES), default="qmm")
    ap.add_argument("--sample", type=int, help="this many keys, spread over the table")
    ap.add_argument("--keys", type=int, help="the first N keys (in the spread order)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="append every key's candidates here (JSON lines); keys already there are skipped")
    ap.add_argument("--json", help="write the judged rows here")
    ap.add_argument("--stored", action="store_true",
                    help="--out to the rows kept in the repository (benches/data/tpu_inference_tables/)")
    ap.add_argument("--report", nargs="*", metavar="JSONL",
                    help="judge stored rows again, no compile (no files: the rows kept in the repository)")
    ap.add_argument("--markdown", action="store_true", help="--report as a markdown table")
    ap.add_argument("--branches", action="store_true",
                    help="--report: count each schedule's regions run only when an index equals a constant at "
                         "their share of the innermost grid axis (docs/tune.md, the branch rule)")
    ap.add_argument("--every-step", action="store_true",
                    help="--report: every block moving every step, as the model took it before it read the "
                         "kernels' copy patterns (docs/tune.md)")
    ap.add_argument("--step-overhead", type=float, default=0.0,
                    help="cycles added per grid step when judging (default: the model as it is)")
    ap.add_argument("--ours", action="store_true",
                    help="tune our kernel on the keys instead (qmm: quantized_matmul_w8a8; gmm: grouped_matmul, "
                         "bf16 weights), and run the table's choice through it (with --stored / --report: "
                         "our kernels' kept rows)")
    ap.add_argument("--add-copies", action="store_true",
                    help="fill in the copy pattern of kept rows compiled before the model read it (lowers "
                         "each such candidate again, no compile; rewrites the kept files)")
    a = ap.parse_args()

    if a.add_copies:
        for path in [*STORED.values(), *STORED_OURS.values()]:
            if path.exists():
                print(f"{path.name}: {add_copies(path, read_rows([path]))} candidates given their copy pattern")
        return

    if a.report is not None:
        if a.ours:  # our kernels on the tables' keys
            stored, judge_, label = STORED_OURS, judge_ours, " through ours"
            header = ("table's choice (as ours) | our best | our best, cycles | the table's choice through ours "
                      "| ratio | ranked / candidates |")
            line, markdown, summary_ = (lambda p, r: f"key {r['key']}: " + format_ours(p, r)), markdown_ours, summary_ours
        else:  # tpu-inference's kernels: the tables' choices in our ranking
            stored, judge_, label = STORED, judge, ""
            header = "table's choice | its rank | our best | model cost, table / ours |"
            line, markdown, summary_ = format_row, markdown_row, summary
        paths = a.report or [p for p in stored.values() if p.exists()]
        raw = [reestimate(r, a.branches, a.every_step) for r in read_rows(paths)]
        for name in sorted({r["table"] for r in raw}):
            params = TABLES[name].params
            rows = [judge_(r, a.step_overhead) for r in raw if r["table"] == name]
            if a.markdown:
                print(f"\n| {name} key | {header}")
                print("|---" * (1 + header.count("|")) + "|")
            for r in rows:
                print(markdown(params, r) if a.markdown else line(params, r))
            if a.markdown:
                print()
            print(summary_(rows, f"{name}{label}: "))
        return

    table = TABLES[a.table]()
    keys = table.keys()
    print(f"{len(keys)} keys of tpu-inference's {a.table} table, for {table.generation}", flush=True)
    if a.sample:
        keys = [keys[round(i * (len(keys) - 1) / max(1, a.sample - 1))] for i in range(min(a.sample, len(keys)))]
    else:
        keys = [keys[i] for i in spread_order(len(keys))]
    if a.keys:
        keys = keys[:a.keys]
    if a.stored:
        a.out = str((STORED_OURS if a.ours else STORED)[a.table])
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    if a.out and os.path.exists(a.out):
        done = {json.dumps(r["key"]) for r in read_rows([a.out]) if r["table"] == a.table}
        keys = [k for k in keys if json.dumps(k[0]) not in done]
        print(f"{len(done)} keys already in {a.out}; {len(keys)} to go", flush=True)
    t0 = time.perf_counter()
    if a.ours:
        rows = (run_ours if a.table == "qmm" else run_ours_gmm)(keys, a.workers, verbose=True, out=a.out)
        line = summary_ours(rows)
    else:
        rows = run(table, keys, a.workers, verbose=True, out=a.out)
        line = summary(rows)
    print(f"\n{line}; {time.perf_counter() - t0:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    main()

#!/usr/bin/env python3
"""Before/after of our own side of P1 (lowering) and P2 (interpret mode), two builds side by side in
one run: the bench binaries of two commits run alternately (the order flips every round, so drift and
noise hit both alike), the best of the rounds kept per case, and the ratio after/before printed.

    # build the two bench binaries, e.g. the old commit in a worktree with its own target folder:
    #   git worktree add /tmp/before <commit> && (cd /tmp/before && CARGO_TARGET_DIR=/tmp/tb cargo bench --no-run)
    #   cargo bench --no-run
    benches/ab.py interpret BEFORE_BIN AFTER_BIN [--rounds 3]   # `--ours-only --quick`, every case
    benches/ab.py lowering  BEFORE_BIN AFTER_BIN [--rounds 3]   # `--loop NAME`: build + backend_config

The binaries are `target/release/deps/interpret-<hash>` / `lowering-<hash>` (cargo prints them). Run
from the repository root (the lowering bench reads nothing else; the interpret bench needs no Python
with `--ours-only`).
"""

import math
import re
import subprocess
import sys

LOWERING_CASES = ["add", "matmul", "softmax", "rmsnorm", "flash_attention", "paged_attention",
                  "quantized_matmul", "grouped_matmul"]
UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def run_interpret(binary):
    out = subprocess.run([binary, "--ours-only", "--quick"], capture_output=True, text=True, check=True).stdout
    times = {}
    for line in out.splitlines():
        # A case row: name, ours ms, then (with `--ours-only`) dashes for every baseline column.
        parts = line.split()
        if len(parts) >= 4 and "-" in parts[2:4]:
            times[parts[0]] = float(parts[1])
    return times


def run_lowering(binary):
    times = {}
    for case in LOWERING_CASES:
        out = subprocess.run([binary, "--loop", case], capture_output=True, text=True, check=True).stdout
        m = re.search(r"build \+ backend_config, new shapes ([0-9.]+)(ns|µs|us|ms|s) each", out)
        if not m:
            raise SystemExit(f"{binary} --loop {case}: no timing in its output:\n{out}")
        times[case] = float(m.group(1)) * UNITS[m.group(2)]
    return times


def main():
    args = sys.argv[1:]
    rounds = 3
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 3 or args[0] not in ("interpret", "lowering"):
        raise SystemExit(__doc__)
    mode, before, after = args
    run = run_interpret if mode == "interpret" else run_lowering
    best = {"before": {}, "after": {}}
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        if r % 2:
            order.reverse()
        for side, binary in order:
            print(f"round {r + 1}/{rounds}: {side}", file=sys.stderr, flush=True)
            for case, ms in run(binary).items():
                best[side][case] = min(ms, best[side].get(case, math.inf))
    cases = [c for c in best["before"] if c in best["after"]]
    print(f"{mode}: ours before vs after, best of {rounds} alternating rounds (ms)")
    print(f"{'case':<24} {'before':>10} {'after':>10} {'after/before':>13}")
    ratios = []
    for c in cases:
        b, a = best["before"][c], best["after"][c]
        ratios.append(a / b)
        print(f"{c:<24} {b:>10.4f} {a:>10.4f} {a / b:>13.3f}")
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{'geomean':<24} {'':>10} {'':>10} {g:>13.3f}")
        print(f"range {min(ratios):.3f} .. {max(ratios):.3f}")


if __name__ == "__main__":
    main()

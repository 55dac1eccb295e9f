"""Parity benchmark (issue 3, item 5): for every example kernel and TPU generation, the final LLO op count
of ours (our StableHLO through libtpu) beside that of the Pallas version of the same kernel, their ratio,
and, for reference, the XLA-fused jnp baseline's `estimated_cycles` (sum over the compiled module).

usage: .venv/bin/python benches/parity.py [--generations v5e,v6e] [--kernels add,matmul] [--markdown]
(or scripts/parity.sh). No TPU needed: libtpu compiles for the topology `<generation>:1x1`.
LLO ops are a static proxy for the work of one grid step (ops in loop bodies counted once); lower is
better; ratio = ours / Pallas.
"""
import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

import tpu_toolchain as tc  # noqa: E402  (first: sets the Mosaic dump directory)
import pallas_kernels  # noqa: E402


def examples():
    ex = os.path.join(REPO, "examples")
    return sorted(f[:-3] for f in os.listdir(ex) if f.endswith(".rs"))


def emit(name, kind):
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    p = subprocess.run([os.path.join(target, "debug", "examples", name), "--emit", kind], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{name} --emit {kind}: {p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", default="v5e,v6e")
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--quiet", "--examples"], cwd=REPO, check=True)
    names = a.kernels.split(",") if a.kernels else examples()
    gens = [g for g in a.generations.split(",") if g]

    rows, worst = [], 0.0
    for name in names:
        twin = pallas_kernels.KERNELS.get(name)
        hlo = emit(name, "stablehlo")
        for gen in gens:
            ours = tc.compile_stablehlo(hlo, gen)
            pallas = tc.compile_jax(*twin, gen) if twin else None
            ref = pallas_kernels.REFERENCES.get(name)
            xla = tc.compile_jax(ref, twin[1], gen) if ref and twin else None
            o = ours.llo_total if ours.ok else None
            p = pallas.llo_total if pallas and pallas.ok else None
            ratio = o / p if o is not None and p else None
            worst = max(worst, ratio or 0.0)
            cycles = sum(xla.estimated_cycles) if xla and xla.ok and xla.estimated_cycles else None
            rows.append((name, gen, o if ours.ok else "FAIL", p if pallas else "-",
                         f"{ratio:.3f}" if ratio is not None else "-", cycles if cycles is not None else "-"))

    hdr = ("kernel", "gen", "ours LLO", "Pallas LLO", "ratio", "XLA est. cycles")
    print(f"tpu-kernel parity (jax {tc.VERSIONS['jax']}, libtpu {tc.VERSIONS['libtpu']}; ratio = ours / Pallas)")
    if a.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for r in rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        print(f"{hdr[0]:<14} {hdr[1]:<4} {hdr[2]:>9} {hdr[3]:>11} {hdr[4]:>6} {hdr[5]:>16}")
        for r in rows:
            print(f"{r[0]:<14} {r[1]:<4} {str(r[2]):>9} {str(r[3]):>11} {r[4]:>6} {str(r[5]):>16}")
    return 0 if worst <= 1.0 and all(r[2] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Parity benchmark (issue 3, item 5; issue 11, item 6): for every example kernel and TPU generation, the
final LLO op count and the total scheduled VLIW bundles of ours (our StableHLO through libtpu) beside
those of the Pallas version of the same kernel, their ratios, and, for reference, the XLA-fused jnp
baseline's `estimated_cycles` (sum over the compiled module).

usage: .venv/bin/python benches/parity.py [--generations v5e,v6e,tpu7x] [--kernels add,matmul] [--markdown]
(or scripts/parity.sh). No TPU needed: libtpu compiles for the generation's topology
(`tpu_toolchain.GENERATION_TOPOLOGIES`); ours is built for the generation (`--target`), Pallas's traced for it.
LLO ops are a static proxy for the work of one grid step (ops in loop bodies counted once); bundles
(libtpu's final schedule of the tpu_custom_call program, a loop body counted once) are the closer
proxy for its cycles: ops that pack into bundles that exist anyway cost nothing. Lower is better;
ratio = ours / Pallas. The exit status is 1 when ours is above Pallas on either count, or fails.
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


def emit(name, kind, generation):
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    p = subprocess.run([os.path.join(target, "debug", "examples", name), "--emit", kind, "--target", generation],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{name} --emit {kind}: {p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", default="v5e,v6e,tpu7x")
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--quiet", "--examples"], cwd=REPO, check=True)
    names = a.kernels.split(",") if a.kernels else examples()
    gens = [g for g in a.generations.split(",") if g]

    def ratio(a, b):
        return a / b if a is not None and b else None

    rows, worst = [], 0.0
    for name in names:
        twin = pallas_kernels.KERNELS.get(name)
        for gen in gens:
            hlo = emit(name, "stablehlo", gen)
            ours = tc.compile_stablehlo(hlo, gen)
            pallas = tc.compile_jax(*twin, gen) if twin else None
            ref = pallas_kernels.REFERENCES.get(name)
            xla = tc.compile_jax(ref, twin[1], gen) if ref and twin else None
            o, ob = (ours.llo_total, ours.bundles) if ours.ok else (None, None)
            p, pb = (pallas.llo_total, pallas.bundles) if pallas and pallas.ok else (None, None)
            r, rb = ratio(o, p), ratio(ob, pb)
            worst = max(worst, r or 0.0, rb or 0.0)
            cycles = sum(xla.estimated_cycles) if xla and xla.ok and xla.estimated_cycles else None
            rows.append((name, gen, o if ours.ok else "FAIL", p if pallas else "-",
                         f"{r:.3f}" if r is not None else "-",
                         ob if ours.ok else "FAIL", pb if pallas else "-",
                         f"{rb:.3f}" if rb is not None else "-", cycles if cycles is not None else "-"))

    hdr = ("kernel", "gen", "ours LLO", "Pallas LLO", "ratio", "ours bundles", "Pallas bundles", "ratio",
           "XLA est. cycles")
    print(f"tpu-kernel parity (jax {tc.VERSIONS['jax']}, libtpu {tc.VERSIONS['libtpu']}; ratio = ours / Pallas)")
    if a.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for r in rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        widths = (16, 4, 9, 11, 6, 13, 15, 6, 16)
        print(" ".join(f"{h:<{w}}" if i < 2 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(hdr, widths))))
        for r in rows:
            print(" ".join(f"{str(c):<{w}}" if i < 2 else f"{str(c):>{w}}" for i, (c, w) in enumerate(zip(r, widths))))
    return 0 if worst <= 1.0 and all(r[2] != "FAIL" and r[5] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

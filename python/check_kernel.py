"""`cargo run --example <name> -- --check <generation>` runs this: one kernel through the real toolchain.

usage: check_kernel.py --generation v5e --name NAME --mosaic FILE --stablehlo FILE
                       [--vmem-estimate BYTES] [--vmem-limit BYTES]

Prints the jaxlib verify result, libtpu's verdict for the generation's topology (`tpu_toolchain.
GENERATION_TOPOLOGIES`, or the topology given, `v5e:2x2`), our VMEM estimate
beside the VMEM libtpu reports using (`used_scoped_memory_configs`), the final LLO op count and the
total scheduled bundles of the kernel's program (libtpu's final VLIW schedule); on a failure, the error with the Rust source lines it points at. Exit status: 0 accepted, 1 rejected,
2 the toolchain could not run.
"""
import argparse
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kib(n):
    return "?" if n is None else f"{n / 1024:.1f} KiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generation", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--mosaic", required=True)
    ap.add_argument("--stablehlo", required=True)
    ap.add_argument("--vmem-estimate", type=int)
    ap.add_argument("--vmem-limit", type=int)
    ap.add_argument("--launch", help="file:line:col of the pallas_call")
    ap.add_argument("--operand", action="append", default=[], help="'input 0=file:line:col' (repeated)")
    a = ap.parse_args()
    try:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import tpu_toolchain as tc
    except Exception as e:  # the toolchain is missing: not a verdict on the kernel
        print(f"cannot load jax/jaxlib/libtpu: {type(e).__name__}: {e}\nrun scripts/setup.sh --python")
        return 2
    mosaic = open(a.mosaic).read()
    hlo = open(a.stablehlo).read()
    topo, _ = tc.topology(a.generation)
    print(f"kernel `{a.name}` on {topo} (jax {tc.VERSIONS['jax']}, jaxlib {tc.VERSIONS['jaxlib']}, "
          f"libtpu {tc.VERSIONS['libtpu']})")
    rejected = False
    try:
        tc.verify_mosaic(mosaic)
        print("  jaxlib verify (registered tpu dialect, strict): ok")
    except Exception as e:
        rejected = True
        print(f"  jaxlib verify (registered tpu dialect, strict): FAILED\n{indent(str(e))}")
    try:
        r = tc.compile_stablehlo(hlo, topo)
    except Exception as e:
        print(f"  libtpu: could not run: {type(e).__name__}: {e}")
        return 2
    if r.ok:
        print(f"  libtpu compile: ok ({r.compile_ms:.0f} ms)")
    else:
        rejected = True
        print(f"  libtpu compile: REJECTED ({r.compile_ms:.0f} ms)\n{indent(r.error)}")
        where = [(f"{p}:{l}:{c}", src) for p, l, c, src in tc.rust_locations(r.error, REPO)]
        operands = dict(o.split("=", 1) for o in a.operand if "=" in o)
        for m in re.finditer(r"\b(input|output) (\d+)\b", r.error or ""):
            loc = operands.get(f"{m.group(1)} {m.group(2)}")
            if loc:
                where.append((loc, f"({m.group(0)})"))
        if "E1001" in (r.error or "") and a.launch:
            where.append((a.launch, "(the launch: its blocks and scratch do not fit the VMEM limit)"))
        if where:
            print("  in the Rust source:")
            for loc, note in dict(where).items():
                print(f"    {loc}    {source_line(loc) or note}" + (f"  {note}" if source_line(loc) and note.startswith("(") else ""))
    limit = f", limit {kib(a.vmem_limit)}" if a.vmem_limit else ""
    used = r.used_vmem_bytes if r.ok else tc.oom_bytes(r.error)
    print(f"  VMEM: estimated {kib(a.vmem_estimate)} (tpu-kernel), used {kib(used)} (libtpu){limit}")
    if r.llo_total is not None:
        top = ", ".join(f"{k.removeprefix('llo.')} {v}" for k, v in list(r.llo_counts.items())[:6])
        print(f"  LLO ops (post-finalize-llo): {r.llo_total}   [{top}]")
    else:
        print("  LLO ops: - (no post-finalize-llo dump)")
    if r.bundles is not None:
        print(f"  scheduled bundles (final schedule of the custom call): {r.bundles}")
    return 1 if rejected else 0


def source_line(loc):
    path, line = loc.rsplit(":", 2)[0], int(loc.rsplit(":", 2)[1])
    for cand in (path, os.path.join(REPO, path)):
        if os.path.isfile(cand):
            lines = open(cand).read().splitlines()
            return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return ""


def indent(s, pad="    "):
    lines = [l for l in (s or "").splitlines() if l.strip() and "Source Location Trace" not in l]
    return "\n".join(pad + l for l in lines[:40])


if __name__ == "__main__":
    sys.exit(main())

"""`cargo run --example <name> -- --check <generation>` runs this: one kernel through the real toolchain.

usage: check_kernel.py --generation v5e --name NAME --mosaic FILE --stablehlo FILE
                       [--vmem-estimate BYTES] [--vmem-limit BYTES]

Prints the jaxlib verify result, libtpu's verdict for the topology `<generation>:1x1`, our VMEM estimate
beside the VMEM libtpu reports using (`used_scoped_memory_configs`), and the final LLO op count; on a
failure, the error with the Rust source lines it points at. Exit status: 0 accepted, 1 rejected,
2 the toolchain could not run.
"""
import argparse
import os
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
    a = ap.parse_args()
    try:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import tpu_toolchain as tc
    except Exception as e:  # the toolchain is missing: not a verdict on the kernel
        print(f"cannot load jax/jaxlib/libtpu: {type(e).__name__}: {e}\nrun scripts/setup.sh --python")
        return 2
    mosaic = open(a.mosaic).read()
    hlo = open(a.stablehlo).read()
    topo = a.generation if ":" in a.generation else f"{a.generation}:1x1"
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
        locs = tc.rust_locations(r.error, REPO)
        if locs:
            print("  the failing Mosaic ops come from:")
            for path, line, col, src in locs:
                print(f"    {path}:{line}:{col}" + (f"    {src}" if src else ""))
    limit = f", limit {kib(a.vmem_limit)}" if a.vmem_limit else ""
    print(f"  VMEM: estimated {kib(a.vmem_estimate)} (tpu-kernel), used {kib(r.used_vmem_bytes)} (libtpu){limit}")
    if r.llo_total is not None:
        top = ", ".join(f"{k.removeprefix('llo.')} {v}" for k, v in list(r.llo_counts.items())[:6])
        print(f"  LLO ops (post-finalize-llo): {r.llo_total}   [{top}]")
    else:
        print("  LLO ops: - (no post-finalize-llo dump)")
    return 1 if rejected else 0


def indent(s, pad="    "):
    lines = [l for l in (s or "").splitlines() if l.strip() and "Source Location Trace" not in l]
    return "\n".join(pad + l for l in lines[:40])


if __name__ == "__main__":
    sys.exit(main())

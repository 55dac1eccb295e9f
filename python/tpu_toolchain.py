"""The real TPU toolchain on a CPU-only host, as the test suite, `--check` and the parity benchmark use it.

- jaxlib's registered `tpu` dialect: strict parse + verify of Mosaic text;
- jaxlib's `mosaic-serde` pass: (de)serialization of kernel bodies;
- libtpu: compile of a StableHLO program (ours, or a jax/Pallas function) for a TPU topology
  (`v5e:1x1`, `v6e:1x1`, ...) with no TPU present, down to LLO; the `llo.*` ops of the final
  (`*-post-finalize-llo*`) Mosaic dump are counted per the rule of ../shared/pallas-reference/README.md.

Mosaic dumps: libtpu reads `LIBTPU_INIT_ARGS` once, when it starts, so importing this module points
`--xla_mosaic_dump_to` at one temporary directory for the whole process (before jax touches libtpu);
each compile's files are told apart by listing the directory before and after it.

Missing jax/jaxlib/libtpu is an ImportError here: a loud failure, never a skip.
"""
from __future__ import annotations

import atexit
import base64
import collections
import dataclasses
import json
import os
import re
import shutil
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Quiet libtpu's "could not determine TPU accelerator type" warnings on a host without a TPU.
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Compile-only use: several processes (the test suite and a `--check` it runs) may load libtpu at once;
# without this, the second one fails on libtpu's /tmp/libtpu_lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _init_dump_dir() -> str:
    d = tempfile.mkdtemp(prefix="tpu-kernel-mosaic-dump-")
    args = [a for a in os.environ.get("LIBTPU_INIT_ARGS", "").split() if "xla_mosaic_dump_to" not in a]
    args.append(f"--xla_mosaic_dump_to={d}")
    os.environ["LIBTPU_INIT_ARGS"] = " ".join(args)
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


DUMP_DIR = _init_dump_dir()

import jax  # noqa: E402  (after the environment above)
import numpy as np  # noqa: E402
from jax._src.interpreters import mlir as jmlir  # noqa: E402
from jax._src.lib import tpu as _tpu  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402
from jaxlib.mlir.passmanager import PassManager  # noqa: E402

import importlib.metadata as _md  # noqa: E402

VERSIONS = {"jax": jax.__version__, "jaxlib": _md.version("jaxlib"), "libtpu": _md.version("libtpu")}

# ----------------------------------------------------------------------------------------- jaxlib


def make_ctx(allow_unregistered: bool = False) -> ir.Context:
    """An MLIR context with jax's dialects and the registered tpu dialect."""
    ctx = jmlir.make_ir_context()
    _tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = allow_unregistered
    return ctx


def verify_mosaic(text: str) -> None:
    """Parse and verify Mosaic text under the real tpu dialect, unregistered dialects disallowed.
    Raises ir.MLIRError (with jaxlib's diagnostics) on failure."""
    with make_ctx(False), ir.Location.unknown():
        m = ir.Module.parse(text)
        if not m.operation.verify():
            raise AssertionError("module does not verify")


def canonical_mosaic(text: str) -> str:
    """Our Mosaic text, parsed strictly and printed by jaxlib (custom form, no locations): the
    normalization both sides of the body round trip are compared in."""
    with make_ctx(False), ir.Location.unknown():
        m = ir.Module.parse(text)
        m.operation.verify()
        return m.operation.get_asm(enable_debug_info=False)


def deserialize_body(raw: bytes, with_locations: bool = False) -> str:
    """A serialized body (MLIR bytecode) through jaxlib's `mosaic-serde{serialize=false}`, verified
    under the real tpu dialect, printed as jaxlib prints Mosaic."""
    ctx = make_ctx(True)
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(raw)
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(m.operation)
        ctx.allow_unregistered_dialects = False
        m.operation.verify()
        return m.operation.get_asm(enable_debug_info=with_locations)


def body_generic(raw: bytes) -> str:
    """A serialized body as generic text (no locations), without deserializing it."""
    with make_ctx(True), ir.Location.unknown():
        m = ir.Module.parse(raw)
        return m.operation.get_asm(enable_debug_info=False, print_generic_op_form=True)


def jaxlib_serialize(text: str, version: int) -> str:
    """What jaxlib's `mosaic-serde{serialize=true target-version=V}` makes of Mosaic text, as generic
    text (no locations) — the reference our own serializer must equal."""
    with make_ctx(True), ir.Location.unknown():
        m = ir.Module.parse(text)
        PassManager.parse(f"builtin.module(mosaic-serde{{serialize=true target-version={version}}})").run(m.operation)
        return m.operation.get_asm(enable_debug_info=False, print_generic_op_form=True)


def tpu_custom_calls(stablehlo_text: str) -> list[dict]:
    """Each `tpu_custom_call` of a StableHLO module: its attributes (as text), parsed backend_config,
    operand and result types."""
    out = []
    with make_ctx(False), ir.Location.unknown():
        m = ir.Module.parse(stablehlo_text)
        if not m.operation.verify():
            raise AssertionError("StableHLO module does not verify")

        def walk(op):
            if op.name == "stablehlo.custom_call" and \
                    ir.StringAttr(op.attributes["call_target_name"]).value == "tpu_custom_call":
                attrs = {n: str(op.attributes[n]) for n in op.attributes if n != "backend_config"}
                out.append({
                    "attrs": attrs,
                    "config": json.loads(ir.StringAttr(op.attributes["backend_config"]).value),
                    "operand_types": [str(v.type) for v in op.operands],
                    "result_types": [str(r.type) for r in op.results],
                })
            return ir.WalkResult.ADVANCE

        m.operation.walk(walk)
    return out


# ----------------------------------------------------------------------------------------- libtpu

_OP_RE = re.compile(r'^\s*(?:%[^=]*?=\s*)?"?([a-z_][a-z0-9_]*\.[A-Za-z0-9_.]+)"?(?=[\s(<{:"]|$)')
_USED_VMEM_RE = re.compile(r'"used_scoped_memory_configs":\[\{"memory_space":"1","offset":"\d+","size":"(\d+)"')
_EST_CYCLES_RE = re.compile(r'"estimated_cycles":"(\d+)"')


def count_llo(text: str) -> collections.Counter:
    """`llo.*` ops of a Mosaic dump: lines whose statement starts with an `llo.` op name (optionally
    after `%x = ` and a quote); attributes such as `llo.type` do not count."""
    c = collections.Counter()
    for line in text.splitlines():
        m = _OP_RE.match(line)
        if m and m.group(1).startswith("llo."):
            c[m.group(1)] += 1
    return c


@dataclasses.dataclass
class Compiled:
    """libtpu's verdict on one program for one topology."""
    topology: str
    ok: bool
    error: str | None = None
    compile_ms: float = 0.0
    llo_total: int | None = None
    llo_counts: dict = dataclasses.field(default_factory=dict)
    used_vmem_bytes: int | None = None
    estimated_cycles: list = dataclasses.field(default_factory=list)
    n_custom_calls: int = 0

    def summary(self) -> str:
        if not self.ok:
            return f"{self.topology}: REJECTED: {first_line(self.error)}"
        return f"{self.topology}: ok, {self.llo_total} LLO ops, VMEM used {self.used_vmem_bytes}"


_TOPOLOGIES: dict = {}


def topology(name: str):
    """`v5e` or `v5e:1x1` → jax topology description (cached)."""
    if ":" not in name:
        name = f"{name}:1x1"
    if name not in _TOPOLOGIES:
        from jax.experimental import topologies
        _TOPOLOGIES[name] = topologies.get_topology_desc(name, "tpu")
    return name, _TOPOLOGIES[name]


def _finalize_llo_after(before: set) -> str | None:
    new = sorted(f for f in os.listdir(DUMP_DIR) if f not in before and "post-finalize-llo" in f)
    if not new:
        return None
    with open(os.path.join(DUMP_DIR, new[-1])) as f:
        return f.read()


def _finish(res: Compiled, before: set, hlo_text: str | None) -> Compiled:
    llo = _finalize_llo_after(before) if res.ok else None  # a rejected compile's dump is partial
    if llo is not None:
        counts = count_llo(llo)
        res.llo_counts = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        res.llo_total = sum(counts.values())
    if hlo_text:
        used = [int(s) for s in _USED_VMEM_RE.findall(hlo_text)]
        res.used_vmem_bytes = max(used) if used else None
        res.estimated_cycles = [int(c) for c in _EST_CYCLES_RE.findall(hlo_text)]
        res.n_custom_calls = hlo_text.count('custom_call_target="tpu_custom_call"')
    return res


def compile_stablehlo(text: str, topo: str) -> Compiled:
    """Compile a StableHLO module (text) with libtpu for `topo`; never raises on a compile error."""
    from jax._src import compiler
    from jax._src.lib import xla_client as xc
    name, desc = topology(topo)
    dev = desc.devices[0]
    before = set(os.listdir(DUMP_DIR))
    res = Compiled(topology=name, ok=False)
    t = time.perf_counter()
    try:
        with make_ctx(False), ir.Location.unknown():
            module = ir.Module.parse(text)
            opts = compiler.get_compile_options(num_replicas=1, num_partitions=1)
            exe = dev.client.compile(module, executable_devices=xc.DeviceList((dev,)), compile_options=opts)
        res.ok = True
    except Exception as e:  # libtpu's verdict: any compile error
        res.error = f"{type(e).__name__}: {e}"
        exe = None
    res.compile_ms = (time.perf_counter() - t) * 1e3
    hlo = "\n".join(m.to_string() for m in exe.hlo_modules()) if exe is not None else None
    return _finish(res, before, hlo)


_OOM_RE = re.compile(r"Scoped allocation with size ([\d.]+)([KMG]?)")


def oom_bytes(error: str | None) -> int | None:
    """The scoped VMEM allocation libtpu reports in an E1001 error (rounded as printed)."""
    m = _OOM_RE.search(error or "")
    if not m:
        return None
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])


def compile_jax(fn, args, topo: str) -> Compiled:
    """Compile `jax.jit(fn)` on `args` (ShapeDtypeStructs) with libtpu for `topo`."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    name, desc = topology(topo)
    rep = NamedSharding(Mesh(np.array(desc.devices[:1]), ("x",)), P())
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep) for a in args]
    before = set(os.listdir(DUMP_DIR))
    res = Compiled(topology=name, ok=False)
    t = time.perf_counter()
    try:
        compiled = jax.jit(fn).trace(*sds).lower().compile()
        res.ok = True
        hlo = compiled.as_text()
    except Exception as e:
        res.error = f"{type(e).__name__}: {e}"
        hlo = None
    res.compile_ms = (time.perf_counter() - t) * 1e3
    return _finish(res, before, hlo)


def lower_jax_for_tpu(fn, args) -> str:
    """StableHLO text of `jax.jit(fn)` cross-lowered for TPU (no compile)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()


# ----------------------------------------------------------------------------------------- errors

_LOC_RE = re.compile(r'(?:loc\()?"?([^"\s():]+\.rs)"?:(\d+):(\d+)')


def first_line(msg: str | None) -> str:
    if not msg:
        return ""
    lines = [l for l in msg.splitlines() if l.strip()]
    return lines[0][:300] if lines else ""


def rust_locations(msg: str, repo: str | None = None) -> list[tuple[str, int, int, str]]:
    """`file.rs:line:col` locations in a toolchain message, with the source line when the file is
    found (relative to `repo`)."""
    out, seen = [], set()
    for m in _LOC_RE.finditer(msg or ""):
        path, line, col = m.group(1), int(m.group(2)), int(m.group(3))
        if (path, line, col) in seen:
            continue
        seen.add((path, line, col))
        src = ""
        for cand in (path, os.path.join(repo or "", path)):
            if os.path.isfile(cand):
                with open(cand) as f:
                    lines = f.read().splitlines()
                if 0 < line <= len(lines):
                    src = lines[line - 1].strip()
                break
        out.append((path, line, col, src))
    return out


def b64_body(config: dict) -> bytes:
    return base64.b64decode(config["custom_call_config"]["body"])


# ------------------------------------------------------------------------------------ collectives

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_COLLECTIVE_RE = re.compile(
    r"=\s*(?:\([^()]*\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\((.*)$", re.M)


def _iota_groups(spec: str) -> list[list[int]]:
    """`[2,2]<=[4]` or `[2,2]<=[2,2]T(1,0)` (XLA's iota replica groups) → explicit groups."""
    m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
    if not m:
        raise ValueError(f"unrecognized replica groups {spec!r}")
    shape = [int(d) for d in m.group(1).split(",")]
    dims = [int(d) for d in m.group(2).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(3):
        ids = ids.transpose([int(p) for p in m.group(3).split(",")])
    return ids.reshape(shape[0], -1).tolist()


def _mesh_groups(spec: str) -> list[list[int]]:
    """`mesh['x'=2,'y'=2] {'y'}` (XLA's mesh-axes replica groups) → explicit groups: the devices
    (positions in the mesh's flat order) that vary along the listed axes."""
    m = re.fullmatch(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", spec)
    if not m:
        raise ValueError(f"unrecognized replica groups {spec!r}")
    axes = [(a.strip().strip("'\""), int(n)) for a, n in
            (part.split("=") for part in m.group(1).split(",") if part.strip())]
    chosen = [a.strip().strip("'\"") for a in m.group(2).split(",") if a.strip()]
    names = [a for a, _ in axes]
    ids = np.arange(int(np.prod([n for _, n in axes]))).reshape([n for _, n in axes])
    picked = [names.index(a) for a in chosen]
    rest = [i for i in range(len(names)) if i not in picked]
    size = int(np.prod([axes[i][1] for i in picked]))
    return ids.transpose(rest + picked).reshape(-1, size).tolist()


def hlo_collectives(hlo_text: str) -> list[dict]:
    """The collectives of an (optimized) HLO module: `kind` (async `-start` forms folded into their
    op, `-done` halves dropped), `groups` (replica groups — explicit, iota or mesh-axes form —
    expanded and sorted), `dimension` (gather /
    scatter / split dimension, when the op has one), in program order."""
    out = []
    for m in _COLLECTIVE_RE.finditer(hlo_text):
        kind, rest = m.group(1), m.group(3)
        groups = None
        g = re.search(r"replica_groups=(\{[\d,{}\s]*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?"
                      r"|mesh\[[^\]]*\]\s*\{[^}]*\})", rest)
        if g and g.group(1).startswith("mesh"):
            groups = _mesh_groups(g.group(1))
        elif g:
            text = g.group(1)
            if text.startswith("{"):
                groups = [[int(i) for i in grp.split(",") if i.strip()]
                          for grp in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
            else:
                groups = _iota_groups(text)
            groups = sorted(sorted(grp) for grp in groups)
        pairs = re.search(r"source_target_pairs=\{([^}]*(?:\}[^}]*)*?)\}\s*(?:,|$)", rest)
        dim = re.search(r"dimensions=\{(\d+)\}", rest)
        out.append({"kind": kind, "groups": groups,
                    "dimension": int(dim.group(1)) if dim else None,
                    "pairs": pairs.group(1) if (kind == "collective-permute" and pairs) else None})
    return out


def mesh_axis_groups(mesh_shape: tuple, axis: int) -> list[list[int]]:
    """The device groups (positions in the mesh's flat order, which is the partition order XLA uses)
    that vary along `axis` of a mesh of `mesh_shape`: the replica groups of a collective over it."""
    ids = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
    moved = np.moveaxis(ids, axis, -1).reshape(-1, mesh_shape[axis])
    return sorted(sorted(int(i) for i in row) for row in moved)

"""The real TPU toolchain on a CPU-only host, as the test suite, `--check` and the parity benchmark use it.

- jaxlib's registered `tpu` dialect: strict parse + verify of Mosaic text;
- jaxlib's `mosaic-serde` pass: (de)serialization of kernel bodies;
- libtpu: compile of a StableHLO program (ours, or a jax/Pallas function) for a TPU topology
  (`v5e:1x1`, `v6e:1x1`, ...) with no TPU present, down to LLO; the `llo.*` ops of the final
  (`*-post-finalize-llo*`) Mosaic dump are counted per the rule of ../shared/pallas-reference/README.md.

- libtpu's final VLIW schedule: the "total scheduled bundles" of the `tpu_custom_call` program (a
  loop body counts once), a closer static proxy for time than LLO ops (ops that pack into bundles
  that exist anyway cost nothing).

Dumps: libtpu reads `LIBTPU_INIT_ARGS` once, when it starts, so importing this module points
`--xla_mosaic_dump_to` (Mosaic stages, for LLO ops) and `--xla_jf_dump_to` (the backend's LLO
programs, for bundles) at temporary directories for the whole process (before jax touches libtpu);
each compile's files are told apart by listing the directory before and after it. The backend dump
is narrowed to the final schedule (`--xla_jf_dump_llo_pass_label_regex=final_bundles`): about ten
small files per compile instead of ~300 (every pass), and no measurable compile time.

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


def _init_dump_dirs() -> tuple[str, str]:
    mosaic = tempfile.mkdtemp(prefix="tpu-kernel-mosaic-dump-")
    backend = tempfile.mkdtemp(prefix="tpu-kernel-llo-dump-")
    ours = ("xla_mosaic_dump_to", "xla_jf_dump_to", "xla_jf_dump_llo_pass_label_regex")
    args = [a for a in os.environ.get("LIBTPU_INIT_ARGS", "").split() if not any(f in a for f in ours)]
    args += [f"--xla_mosaic_dump_to={mosaic}", f"--xla_jf_dump_to={backend}",
             "--xla_jf_dump_llo_pass_label_regex=final_bundles"]
    os.environ["LIBTPU_INIT_ARGS"] = " ".join(args)
    for d in (mosaic, backend):
        atexit.register(shutil.rmtree, d, ignore_errors=True)
    return mosaic, backend


DUMP_DIR, BUNDLES_DUMP_DIR = _init_dump_dirs()

import jax  # noqa: E402  (after the environment above)
import numpy as np  # noqa: E402
from jax._src.interpreters import mlir as jmlir  # noqa: E402
from jax._src.lib import tpu as _tpu  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402
from jaxlib.mlir.passmanager import PassManager  # noqa: E402

import importlib.metadata as _md  # noqa: E402

def libtpu_path() -> str:
    """The shared library jax loads for TPU (the `libtpu` package's `libtpu.so`): what the Rust path
    (`kernel_runtime::libtpu`) is pointed at with TPU_LIBRARY_PATH, so both compile with one libtpu."""
    import libtpu
    return os.path.join(os.path.dirname(libtpu.__file__), "libtpu.so")


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
    # total scheduled bundles of the tpu_custom_call program(s); None when libtpu wrote no schedule for one
    bundles: int | None = None
    # every program of the compiled module but the runtime's (TLP, <late-...>): name -> total scheduled
    # bundles. Besides the custom call this may hold XLA's own programs, e.g. the copy XLA inserts in
    # front of an aliased input that is not donated.
    bundles_by_program: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        if not self.ok:
            return f"{self.topology}: REJECTED: {first_line(self.error)}"
        return (f"{self.topology}: ok, {self.llo_total} LLO ops, {self.bundles} scheduled bundles, "
                f"VMEM used {self.used_vmem_bytes}")


_TOPOLOGIES: dict = {}

# Each generation's smallest topology libtpu 0.0.51 compiles for (kernel_runtime::target's `topology`
# column; the library description's `targets` — test_jax_targets.py holds the two equal). v4 and v5p
# have no 1x1; tpu7x:1x1x1 is one chip of two TensorCores, each its own device.
GENERATION_TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:1x1", "v5p": "v5p:2x2x1", "v6e": "v6e:1x1",
                         "tpu7x": "tpu7x:1x1x1"}


def topology(name: str):
    """`v5e` (a generation: its topology above) or a topology `v5e:2x2` → (name, jax topology
    description), cached."""
    if ":" not in name:
        name = GENERATION_TOPOLOGIES.get(name, f"{name}:1x1")
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


_BUNDLES_FILE_RE = re.compile(r"^\d+-(?P<program>.+)-\d+-schedule-analysis_final_bundles\.txt$")
_TOTAL_BUNDLES_RE = re.compile(r"^\s*total scheduled bundles:\s*(\d+)\s*$", re.M)
_TPU_CUSTOM_CALL_RE = re.compile(
    r'^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=[^\n]*\bcustom-call\([^\n]*custom_call_target="tpu_custom_call"', re.M)


def total_bundles(text: str) -> int:
    """`total scheduled bundles: N` of one `*-schedule-analysis_final_bundles.txt` dump (libtpu writes
    an empty file for a program with nothing to schedule, e.g. a grid with an empty axis: 0)."""
    if not text.strip():
        return 0
    m = _TOTAL_BUNDLES_RE.findall(text)
    if len(m) != 1:
        raise ValueError(f"expected one 'total scheduled bundles' line, found {len(m)}")
    return int(m[0])


def tpu_custom_call_names(hlo_text: str) -> list[str]:
    """Instruction names of the `tpu_custom_call`s of an optimized HLO module: libtpu names each one's
    program after it (`<id>-<name>-NN-...` dump files)."""
    return _TPU_CUSTOM_CALL_RE.findall(hlo_text)


def _snapshot() -> tuple[set, set]:
    return set(os.listdir(DUMP_DIR)), set(os.listdir(BUNDLES_DUMP_DIR))


def _bundles_after(before: set, complete: bool = True) -> dict:
    """Program name -> total scheduled bundles, from the final-schedule dumps written since `before`
    (the runtime's TLP and `<late-...>` programs left out); the files are removed once read, so the
    directory stays small over a long session. After a failed compile (`complete` false) a dump may
    be cut short: such files are skipped rather than read."""
    out = {}
    new = sorted(f for f in os.listdir(BUNDLES_DUMP_DIR) if f not in before)
    for f in new:
        m = _BUNDLES_FILE_RE.match(f)
        if m and m.group("program") != "TLP" and not m.group("program").startswith("<late-"):
            with open(os.path.join(BUNDLES_DUMP_DIR, f)) as fh:
                text = fh.read()
            if complete or len(_TOTAL_BUNDLES_RE.findall(text)) == 1:
                out[m.group("program")] = total_bundles(text)
    for f in new:
        os.remove(os.path.join(BUNDLES_DUMP_DIR, f))
    return out


def _finish(res: Compiled, before: tuple[set, set], hlo_text: str | None) -> Compiled:
    llo = _finalize_llo_after(before[0]) if res.ok else None  # a rejected compile's dump is partial
    if llo is not None:
        counts = count_llo(llo)
        res.llo_counts = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        res.llo_total = sum(counts.values())
    programs = _bundles_after(before[1], complete=res.ok)
    if res.ok:
        res.bundles_by_program = programs
        names = tpu_custom_call_names(hlo_text or "")
        if names and all(n in programs for n in names):
            res.bundles = sum(programs[n] for n in names)
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
    before = _snapshot()
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


def compile_jax(fn, args, topo: str, donate_argnums: tuple = ()) -> Compiled:
    """Compile `jax.jit(fn)` on `args` (ShapeDtypeStructs) with libtpu for `topo`: traced and lowered
    for that generation (inside the topology's abstract mesh, where Pallas's `get_tpu_info()` and our
    JAX op read the device kind), on one of its devices. `donate_argnums` as `jax.jit`'s (an aliased
    input that is not donated is copied by XLA first — into VMEM when it is small)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    name, desc = topology(topo)
    mesh = Mesh(np.array(desc.devices[:1]), ("x",))
    rep = NamedSharding(mesh, P())
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep) for a in args]
    return _compile_in(name, mesh, jax.jit(fn, donate_argnums=donate_argnums), sds)


def _compile_in(name: str, mesh, program, sds) -> Compiled:
    """Trace, lower and compile the jitted `program` on `sds` inside `mesh`'s abstract mesh (where
    Pallas and our JAX op read the device kind); libtpu's verdict and counts, never raising."""
    before = _snapshot()
    res = Compiled(topology=name, ok=False)
    t = time.perf_counter()
    try:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            compiled = program.trace(*sds).lower().compile()
        res.ok = True
        hlo = compiled.as_text()
    except Exception as e:  # libtpu's verdict: any compile error
        res.error = f"{type(e).__name__}: {e}"
        hlo = None
    res.compile_ms = (time.perf_counter() - t) * 1e3
    return _finish(res, before, hlo)


def compile_shard_map(fn, topo: str, axes: tuple, in_specs, out_specs, args) -> Compiled:
    """Compile `jax.jit(jax.shard_map(fn))` with libtpu for every device of the topology `topo`
    (`v5e:2x2`), the devices arranged as a mesh of named `axes` (`(("x", 2), ("y", 2))`), on global
    `args` (ShapeDtypeStructs, sharded by `in_specs`). Traced inside the mesh's abstract mesh, where
    Pallas and our JAX op read the device kind. The result's counts are the whole program's."""
    from jax.sharding import Mesh, NamedSharding
    name, desc = topology(topo)
    mesh = Mesh(np.array(desc.devices).reshape([s for _, s in axes]), tuple(n for n, _ in axes))
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec))
           for a, spec in zip(args, in_specs)]
    program = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs,
                                    check_vma=False))
    return _compile_in(name, mesh, program, sds)


def lower_jax_for_tpu(fn, args, generation: str | None = None) -> str:
    """StableHLO text of `jax.jit(fn)` cross-lowered for TPU (no compile); with a `generation`, traced
    and lowered for it (inside its topology's abstract mesh, as `compile_jax`)."""
    if generation is None:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    from jax.sharding import Mesh
    _, desc = topology(generation)
    with jax.sharding.use_abstract_mesh(Mesh(np.array(desc.devices[:1]), ("x",)).abstract_mesh):
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



def expand_iota(reshape: list[int], dims: list[int], perm: list[int] | None) -> np.ndarray:
    """XLA's iota tile assignment `[reshape]<=[dims]T(perm)`: iota(prod(dims)) reshaped to dims,
    transposed by perm, reshaped to `reshape`."""
    a = np.arange(int(np.prod(dims))).reshape(dims)
    if perm is not None:
        a = a.transpose(perm)
    return a.reshape(reshape)


_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v.strip()]


def _iota_groups(m: re.Match) -> list[list[int]]:
    return expand_iota(_ints(m.group(1)), _ints(m.group(2)),
                       _ints(m.group(3)) if m.group(3) else None).tolist()


def mesh_axes_groups(text: str) -> list[list[int]]:
    """XLA's mesh-axes replica groups, `mesh['a'=2,'b'=2] {'b'}` (optionally `, device_ids=(...)`
    after the mesh, and sub-axes `'a':(pre)size`): devices that differ only along the listed axes
    form a group (xla/hlo/ir/replica_group.cc, MeshAxesReplicaGroupList)."""
    m = re.fullmatch(r"mesh\[(.*?)\](?:, device_ids=\((.*?)\))? \{(.*)\}", text.strip())
    if not m:
        raise ValueError(f"unrecognized mesh replica groups: {text!r}")
    axes = re.findall(r"'?([^',=\[\]]+)'?=(\d+)", m.group(1))
    names = [a for a, _ in axes]
    sizes = [int(s) for _, s in axes]
    n = int(np.prod(sizes))
    if m.group(2) is None:
        devices = np.arange(n)
    elif (im := _IOTA.fullmatch(m.group(2).strip())):
        devices = np.array(_iota_groups(im)).reshape(-1)
    else:
        devices = np.array(_ints(m.group(2)))
    refs = []  # (axis index, pre_size, size) per grouped axis reference
    for ref in filter(None, (r.strip() for r in m.group(3).split(","))):
        rm = re.fullmatch(r"'?([^':]+)'?(?::\((\d+)\)(\d+))?", ref)
        if not (rm and rm.group(1) in names):
            raise ValueError(f"unknown axis {ref!r} in {text!r}")
        i = names.index(rm.group(1))
        refs.append((i, int(rm.group(2)), int(rm.group(3))) if rm.group(2) else (i, 1, sizes[i]))
    # split every mesh axis into the pieces its referenced sub-axes need, then group those pieces
    split_sizes, piece_of = [], {}
    for i, size in enumerate(sizes):
        used = sorted((pre, sz) for (j, pre, sz) in refs if j == i)
        covered = 1
        for pre, sz in used:
            if pre != covered:
                split_sizes.append(pre // covered)
                covered = pre
            piece_of[(i, pre, sz)] = len(split_sizes)
            split_sizes.append(sz)
            covered *= sz
        if covered != size:
            split_sizes.append(size // covered)
    grouped = [piece_of[r] for r in refs]
    rest = [k for k in range(len(split_sizes)) if k not in grouped]
    group_size = int(np.prod([split_sizes[k] for k in grouped]))
    return devices.reshape(split_sizes).transpose(rest + grouped).reshape(-1, group_size).tolist()


def replica_groups(attr: str, num_partitions: int) -> list[list[int]]:
    """The value of `replica_groups=` in any printed form → explicit groups."""
    attr = attr.strip()
    if attr.startswith("mesh["):
        return mesh_axes_groups(attr)
    if (m := _IOTA.fullmatch(attr)):
        return _iota_groups(m)
    if attr in ("{}", "{{}}"):
        return [list(range(num_partitions))]  # one group of every participant
    groups = [_ints(g) for g in re.findall(r"\{([\d,]*)\}", attr[1:-1])]
    if not groups:
        raise ValueError(f"unrecognized replica_groups {attr!r}")
    return groups


# ------------------------------------------------------------------------- collectives in optimized HLO

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s(?P<op>" + "|".join(COLLECTIVES)
                    + r")(?P<suffix>-start|-done)?\((?P<rest>.*)$")


def _attr(rest: str, name: str) -> str | None:
    """The text of attribute `name=` in an instruction's tail, up to the next top-level `, key=`."""
    i = rest.find(f" {name}=")
    if i < 0:
        return None
    s = rest[i + len(name) + 2:]
    depth = 0
    for j, ch in enumerate(s):
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == "," and depth == 0 and re.match(r", [\w.]+=", s[j:]):
            return s[:j]
    return s


def _strip_layouts(t: str) -> str:
    t = re.sub(r"\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", t)  # layouts like {1,0:T(8,128)(2,1)}
    return re.sub(r"\s+", " ", t).strip()


def hlo_collectives(hlo: str) -> list[dict]:
    """Every collective in an optimized HLO module (all computations), in program order: `kind`,
    `groups` (replica groups in any printed form — explicit, iota `[2,2]<=[4]`, mesh axes
    `mesh[...] {'y'}` — expanded; for a collective-permute, None), `dimension` (gather / scatter /
    split dimension; None for all-reduce), `pairs` (a collective-permute's source/target pairs),
    `type` (result type without layouts). An async pair counts once, at its `-start`."""
    m = re.search(r"num_partitions=(\d+)", hlo)
    num_partitions = int(m.group(1)) if m else 1
    found = []
    for line in hlo.splitlines():
        im = _INSTR.match(line)
        if not im or im.group("suffix") == "-done":
            continue
        kind, rest = im.group("op"), im.group("rest")
        entry = {"kind": kind, "groups": None, "dimension": None, "pairs": None,
                 "type": _strip_layouts(im.group("type"))}
        if kind == "collective-permute":
            pairs_attr = _attr(rest, "source_target_pairs")
            entry["pairs"] = [_ints(p) for p in re.findall(r"\{([\d,]+)\}", pairs_attr or "")]
            found.append(entry)
            continue
        groups_attr = _attr(rest, "replica_groups")
        groups = replica_groups(groups_attr, num_partitions) if groups_attr is not None \
            else [list(range(num_partitions))]
        entry["groups"] = sorted(sorted(g) for g in groups)
        if kind != "all-reduce":
            dims_attr = _attr(rest, "dimensions")
            if not dims_attr:
                raise ValueError(f"{kind} without dimensions: {line.strip()[:200]}")
            dims = _ints(dims_attr.strip("{}"))
            if len(dims) != 1:
                raise ValueError(f"{kind} over several dimensions: {line.strip()[:200]}")
            entry["dimension"] = dims[0]
        found.append(entry)
    return found


def mesh_axis_groups(mesh_shape: tuple, axis: int) -> list[list[int]]:
    """The device groups (positions in the mesh's flat order, which is the partition order XLA uses)
    that vary along `axis` of a mesh of `mesh_shape`: the replica groups of a collective over it."""
    ids = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
    moved = np.moveaxis(ids, axis, -1).reshape(-1, mesh_shape[axis])
    return sorted(sorted(int(i) for i in row) for row in moved)

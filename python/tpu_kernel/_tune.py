"""`tpu_kernel.tune`: choose a kernel's static parameters for a TPU generation with no TPU.

    import tpu_kernel, tpu_kernel.examples as ex
    t = tpu_kernel.tune(ex.matmul, x, y, space={"block": [(128, 128, 128), (256, 256, 256)]},
                        generation="v6e")
    t.best                  # {"block": [256, 256, 256]}
    print(t.report())

`fn` is any jax function that lowers to one `tpu_custom_call` — one of our kernels, or a Pallas
kernel — called as `fn(*args, **config)` for each configuration of `space` (parameter → candidates;
`constraints` are predicates on a configuration). Each configuration is traced and lowered for the
generation (a configuration our checks, or Pallas's, refuse is pruned before any compile, with the
reason), the rest are compiled by libtpu in parallel worker processes (`tpu_kernel.libtpu`) and ranked
by the static cost model of `docs/tune.md` (libtpu's schedule: the grid loop's bundles per step against
the step's DMA bytes over the generation's HBM bandwidth — the bytes of the blocks whose index changed,
from the kernel's index maps, `_copies.py`).

Results are cached in `<cache_dir>/<generation>.json` (`cache_dir` defaults to
`$TPU_KERNEL_TUNE_CACHE`), keyed by the kernel, its arguments' dtypes and shapes and the static
parameters given outside the space. With `$TPU_KERNEL_TUNE_CACHE` set, our JAX ops consult it: a
parameter the caller leaves out takes the tuned value for its key, and a key with no entry is warned
about once (naming the key and the file).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import sys
import threading
import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence

from ._copies import block_copies

ENV_CACHE = "TPU_KERNEL_TUNE_CACHE"


def _topologies(library: Any = None) -> dict:
    """Generation name → its smallest topology, from Rust's target table (`library.targets`; the
    examples library's when none is given)."""
    if library is None:
        from .examples import library
    return {t["name"]: t["topology"] for t in library.targets}


@dataclasses.dataclass
class Candidate:
    config: dict
    outcome: str                     # "ranked", "pruned" or "rejected"
    cycles: float | None = None
    estimate: dict | None = None
    bundles: int | None = None
    reason: str | None = None
    #: libtpu's schedule of the compiled candidate (`tpu_kernel.libtpu.estimate` re-estimates it)
    schedule: dict | None = None
    #: what its pipeline copies after the first step (`_copies.block_copies`; None: not known)
    copies: list | None = None


@dataclasses.dataclass
class Tuned:
    key: str
    generation: str
    best: dict
    best_cycles: float
    candidates: list = dataclasses.field(default_factory=list)
    compiles: int = 0
    from_cache: bool = False

    def ranked(self) -> list:
        return [c for c in self.candidates if c.outcome == "ranked"]

    def report(self) -> str:
        lines = [f"{self.key} on {self.generation}: best {self.best} ({self.best_cycles:.0f} cycles)"
                 + (" [cached]" if self.from_cache else "")]
        for c in self.candidates:
            if c.outcome == "ranked":
                e = c.estimate or {}
                every = (e.get("dma_step") or 0.0) * (e.get("steps") or 1)
                moved = f", {e['dma_grid'] / every:.0%} of the blocks' bytes moved" if every and "dma_grid" in e else ""
                lines.append(f"  {c.config}  {c.cycles:.0f} cycles  {e.get('iterations')} iterations x {e.get('body')} "
                             f"bundles{', DMA-bound' if e.get('dma_bound') else ''}{moved}")
            else:
                lines.append(f"  {c.config}  {c.outcome}: {c.reason}")
        return "\n".join(lines)


def _aval_text(a: Any) -> str:
    import numpy as np
    return f"{np.dtype(a.dtype).name}[{','.join(str(int(d)) for d in a.shape)}]"


def key_of(name: str, args: Sequence[Any], static: Mapping[str, Any]) -> str:
    """The cache key: `name(dtype[shape], ...)[static parameters as sorted JSON]`."""
    return f"{name}({', '.join(_aval_text(a) for a in args)})[{json.dumps(dict(sorted(static.items())), sort_keys=True)}]"


def _name_of(fn: Any) -> str:
    from ._library import Kernel
    if isinstance(fn, Kernel):
        return f"{fn.library.name}.{fn.name}"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


_LOCAL = threading.local()


@contextlib.contextmanager
def _tuning():
    old = getattr(_LOCAL, "active", False)
    _LOCAL.active = True
    try:
        yield
    finally:
        _LOCAL.active = old


@functools.lru_cache(maxsize=None)
def _mesh(generation: str) -> Any:
    """A one-device mesh of `generation`'s topology (jax's TPU topology description: libtpu, no TPU)."""
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh
    desc = topologies.get_topology_desc(_topologies().get(generation, generation), "tpu")
    return Mesh(np.array(desc.devices[:1]), ("x",))


def _lower(fn: Callable, args: Sequence[Any], config: Mapping[str, Any], generation: str) -> str:
    """StableHLO text of `fn(*args, **config)` traced and lowered for `generation` (inside its
    topology's abstract mesh, where Pallas and our op read the device kind)."""
    import jax
    mesh = _mesh(generation)
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), _tuning():
        lowered = jax.jit(functools.partial(fn, **config)).trace(*sds).lower(lowering_platforms=("tpu",))
    return lowered.as_text()


def _copy_pattern(hlo: str, name: str) -> list | None:
    """`block_copies(hlo)`; a module it cannot read leaves the pattern unknown (the model then takes
    every block to move every step), with a warning naming the kernel and the reason."""
    try:
        return block_copies(hlo)
    except Exception as e:  # an op or attribute form this jax prints differently
        warnings.warn(f"tune {name}: the copy pattern of a configuration could not be read ({type(e).__name__}: "
                      f"{e}); the model takes every block to move every step", stacklevel=3)
        return None


def _configs(space: Mapping[str, Iterable[Any]], constraints: Sequence[Callable[[dict], bool]]) -> list[dict]:
    names = list(space)
    values = [list(dict.fromkeys(_hashable(v) for v in space[n])) for n in names]
    out = []
    for combo in itertools.product(*values):
        c = {n: (list(v) if isinstance(v, tuple) else v) for n, v in zip(names, combo)}
        if all(pred(c) for pred in constraints):
            out.append(c)
    return out


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = done * width // max(total, 1)
    bar = f"{label}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
    if sys.stderr.isatty():
        print("\r" + bar, end="\n" if done == total else "", file=sys.stderr, flush=True)
    elif done == total or done * 10 // total != (done - 1) * 10 // total:
        print(bar, file=sys.stderr, flush=True)


def _cache_file(cache_dir: str, generation: str) -> str:
    return os.path.join(cache_dir, f"{generation}.json")


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def tune(fn: Callable, *args: Any, space: Mapping[str, Iterable[Any]], generation: str = "v6e",
         constraints: Sequence[Callable[[dict], bool]] = (), static: Mapping[str, Any] | None = None,
         workers: int = 2, cache_dir: str | None = None, refresh: bool = False, progress: bool = True,
         name: str | None = None, trips: Callable[[dict], Sequence[int]] | None = None) -> Tuned:
    """Tune `fn`'s parameters in `space` for `generation` (see the module docstring). `args` are arrays
    or `jax.ShapeDtypeStruct`s; `static` are further keyword arguments passed to every call (and part
    of the key). `trips(config)` gives the trip counts of the kernel's grid axes sized at run time (a
    Pallas grid sized by a traced value, e.g. megablox gmm's group tiles), in axis order; the model
    cannot rank a kernel with such an axis without them."""
    from . import libtpu
    static = dict(static or {})
    name = name or _name_of(fn)
    key = key_of(name, args, static)
    cache_dir = cache_dir if cache_dir is not None else os.environ.get(ENV_CACHE)
    space_text = json.dumps({k: [_jsonable(v) for v in vs] for k, vs in ((k, list(v)) for k, v in space.items())})
    if cache_dir and not refresh:
        entry = _read(_cache_file(cache_dir, generation)).get(key)
        if entry and entry.get("space") == space_text:
            return Tuned(key, generation, entry["best"], entry["cycles"], from_cache=True)
    configs = _configs(space, constraints)
    if not configs:
        raise ValueError(f"tune: the space of {name} is empty after its constraints: {space_text}")
    candidates, jobs = [], []
    for c in configs:
        try:
            hlo = _lower(fn, args, {**static, **c}, generation)
        except Exception as e:  # our checks' KernelError, Pallas's lowering errors: pruned
            first = next((l for l in str(e).splitlines() if l.strip()), type(e).__name__)
            candidates.append(Candidate(c, "pruned", reason=first))
            continue
        n = hlo.count("tpu_custom_call")
        if n != 1:
            candidates.append(Candidate(c, "pruned", reason=f"lowers to {n} tpu_custom_calls, not one"))
            continue
        jobs.append((c, hlo, _copy_pattern(hlo, name)))
    label = f"tune {name} for {generation}"
    if progress:
        print(f"{label}: compiling {len(jobs)} configurations ({len(candidates)} pruned)", file=sys.stderr)
    verdicts: list = []
    step = max(1, workers) * 4 if progress else max(1, len(jobs))  # rounds, for the progress bar
    for i in range(0, len(jobs), step):
        chunk = jobs[i:i + step]
        verdicts += libtpu.compile_many([{"stablehlo": h, "topology": generation,
                                           "trips": [int(t) for t in trips(c)] if trips else [],
                                           "copies": p}
                                          for c, h, p in chunk], workers=workers, llo_counts=False)
        if progress:
            _progress(len(verdicts), len(jobs), label)
    ranked = []
    for (c, _, p), v in zip(jobs, verdicts):
        if v.ok and v.estimate:
            ranked.append(Candidate(c, "ranked", cycles=v.estimate["cycles"], estimate=v.estimate,
                                    bundles=v.bundles, schedule=v.schedule, copies=p))
        else:
            why = v.error or v.estimate_error or "no schedule of the kernel"
            first = next((l for l in why.splitlines() if l.strip()), "")
            candidates.append(Candidate(c, "rejected", reason=first, schedule=v.schedule, copies=p))
    if not ranked:
        raise RuntimeError(f"tune: no configuration of {name} compiled for {generation}:\n"
                           + "\n".join(f"  {c.config}: {c.outcome}: {c.reason}" for c in candidates))
    ranked.sort(key=lambda c: (c.cycles or 0.0, json.dumps(c.config, sort_keys=True)))
    best = ranked[0]
    assert best.cycles is not None
    tuned = Tuned(key, generation, best.config, best.cycles, ranked + candidates, compiles=len(jobs))
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        path = _cache_file(cache_dir, generation)
        everything = _read(path)
        everything[key] = {"best": best.config, "cycles": best.cycles, "space": space_text,
                           "top": [{"config": c.config, "cycles": c.cycles} for c in ranked[:5]],
                           "compiles": len(jobs), "model": "bundles x steps vs DMA (docs/tune.md)"}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(everything, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    return tuned


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


_WARNED: set = set()


def tuned_defaults(kernel: Any, arrays: Sequence[Any], given: Mapping[str, Any], target: str | None) -> dict:
    """For our JAX op: the cached tuned values of the parameters the caller left out, when
    `$TPU_KERNEL_TUNE_CACHE` is set (else nothing); a key with no entry is warned about once."""
    cache_dir = os.environ.get(ENV_CACHE)
    if not cache_dir or getattr(_LOCAL, "active", False) or not getattr(kernel, "params", None):
        return {}
    missing = [p["name"] for p in kernel.params if p["name"] not in given]
    if not missing:
        return {}
    generation = target if target is not None and target in _topologies(kernel.library) else "v5e"
    try:
        key = key_of(_name_of(kernel), arrays, dict(given))
    except Exception:  # arguments without shape/dtype: nothing to key on
        return {}
    path = _cache_file(cache_dir, generation)
    entry = _read(path).get(key)
    if entry is None:
        if (key, generation) not in _WARNED:
            _WARNED.add((key, generation))
            warnings.warn(f"tpu_kernel: no tuned entry for {key} on {generation} in {path}: "
                          f"{', '.join(missing)} take the kernel's defaults (tpu_kernel.tune makes one)",
                          stacklevel=3)
        return {}
    return {k: v for k, v in entry["best"].items() if k in missing}

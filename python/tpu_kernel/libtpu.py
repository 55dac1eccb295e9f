"""Compile for TPU topologies with libtpu from Python, through tpu-kernel's Rust compiler
(`kernel_runtime::libtpu`): no TPU, no PJRT client, no jax in the compile path.

    import tpu_kernel.libtpu as lt
    v = lt.compile(stablehlo_text, "v6e")            # a generation (its smallest topology) or "v5e:2x2"
    v.ok, v.llo_total, v.bundles, v.used_vmem_bytes  # libtpu's verdict and counts
    vs = lt.compile_many([(hlo, "v5e"), (hlo, "tpu7x")], workers=2)   # in parallel worker processes

The StableHLO is any program that calls `tpu_custom_call` (ours: `Kernel.lower`; a Pallas kernel's:
`jax.jit(f).lower(...).as_text()` lowered for TPU). Compiles run in worker processes that load libtpu
once and stay alive for the life of this process; a worker that libtpu aborts is a verdict
(`aborted=True`, libtpu's last log lines in `error`) and is replaced. The library is libtpu's
`libtpu.so` from `$TPU_LIBRARY_PATH`, else the `libtpu` package of this Python environment.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Iterable, Sequence

from ._errors import LibraryError


@dataclasses.dataclass
class Compiled:
    """libtpu's verdict on one program for one topology."""
    topology: str
    ok: bool
    error: str | None = None
    aborted: bool = False
    compile_ms: float = 0.0
    llo_counts: dict | None = None
    llo_total: int | None = None
    bundles: int | None = None
    bundles_by_program: dict = dataclasses.field(default_factory=dict)
    used_vmem_bytes: int | None = None
    custom_calls: int = 0
    rust_locations: list = dataclasses.field(default_factory=list)
    #: the kernel's final schedule: bundles by loop depth, grid, pipeline DMA bytes per step
    schedule: dict | None = None
    #: the static cost model's estimate (docs/tune.md): cycles, seconds, steps, body, dma_step, ...
    estimate: dict | None = None
    #: why there is no estimate of a compiled kernel (a grid axis sized at run time with no `trips`)
    estimate_error: str | None = None

    def summary(self) -> str:
        if not self.ok:
            first = next((l for l in (self.error or "").splitlines() if l.strip()), "")
            return f"{self.topology}: {'ABORTED' if self.aborted else 'REJECTED'}: {first}"
        return (f"{self.topology}: ok, {self.llo_total} LLO ops, {self.bundles} scheduled bundles, "
                f"VMEM used {self.used_vmem_bytes}")


def _library_path() -> str:
    from .examples import library_path
    return library_path()


def library_file() -> str:
    """libtpu's shared library as this package finds it: `$TPU_LIBRARY_PATH`, else the `libtpu`
    package of this environment."""
    env = os.environ.get("TPU_LIBRARY_PATH")
    if env:
        return env
    try:
        import libtpu  # type: ignore[import-untyped]
    except ImportError:
        raise LibraryError("libtpu is not installed: `pip install libtpu` (or set TPU_LIBRARY_PATH to "
                           "libtpu.so)", path="libtpu") from None
    return os.path.join(os.path.dirname(libtpu.__file__), "libtpu.so")


def worker_command() -> list[str]:
    """The worker process: this Python, loading tpu-kernel's library with ctypes alone (no jax) and
    serving compiles from it (`libtpu_serve`)."""
    return [sys.executable, "-c",
            "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "lib.tpu_kernel_call.argtypes = [ctypes.c_char_p, ctypes.c_char_p]; "
            "lib.tpu_kernel_call(b'libtpu_serve', b'{}'); sys.exit(3)",
            _library_path()]


def _call(method: str, payload: dict) -> dict:
    """The examples library's answer to `method`; its refusal as a `LibraryError`."""
    from .examples import library
    answer = library.call(method, payload)
    if not answer.get("ok"):
        error = answer.get("error")
        raise LibraryError(f"{method}: {error.get('message') if isinstance(error, dict) else error}",
                           path=_library_path())
    return answer


def compile_many(programs: Iterable[tuple[str, str]] | Sequence[dict], *, workers: int = 1,
                 llo_counts: bool = True) -> list[Compiled]:
    """Compile each `(stablehlo, topology)` (or `{"stablehlo", "topology", "num_partitions", "trips",
    "copies"}`, `trips` the trip counts of the grid axes sized at run time and `copies` what the
    pipeline copies after the first step, for the estimate: see `estimate`) in
    parallel on up to `workers` worker processes; verdicts in the programs' order. Raises
    `LibraryError` when a worker cannot run at all (no libtpu, ...); libtpu's rejections and aborts
    are verdicts. `llo_counts=False` skips libtpu's Mosaic stage dumps (no `llo_counts`): for a large
    kernel they take longer than its compile, and the schedule does not need them."""
    jobs = []
    for p in programs:
        if isinstance(p, dict):
            jobs.append(p)
        else:
            hlo, topology = p
            jobs.append({"stablehlo": hlo, "topology": topology})
    env_library = os.environ.get("TPU_LIBRARY_PATH")
    if not env_library:
        os.environ["TPU_LIBRARY_PATH"] = library_file()
    answer = _call("libtpu_compile", {"jobs": jobs, "workers": int(workers), "worker": worker_command(),
                                      "llo": bool(llo_counts)})
    names = {f.name for f in dataclasses.fields(Compiled)}
    out = []
    for r in answer["results"]:
        if "ok" not in r:
            raise LibraryError(f"libtpu: {r.get('error')}", path=_library_path())
        out.append(Compiled(**{k: v for k, v in r.items() if k in names}))
    return out


def estimate(schedule: dict, generation: str, trips: Sequence[int] = (),
             copies: Sequence[Sequence[float]] | None = None) -> tuple[dict | None, str | None]:
    """The static cost model (docs/tune.md) on a stored schedule (a `Compiled.schedule`), with no
    compile: `(estimate, None)`, or `(None, why)` when the model cannot estimate it. `copies` is what
    the pipeline copies after the first step (`[[steps, share], ...]`, as `tune` stores it); None
    takes every block to move every step."""
    answer = _call("libtpu_estimate", {"schedule": schedule, "generation": generation,
                                       "trips": [int(t) for t in trips], "copies": copies})
    return answer.get("estimate"), answer.get("estimate_error")


def compile(stablehlo: str, topology: str, *, num_partitions: int = 1) -> Compiled:
    """Compile one StableHLO program for `topology` (`v5e`, `v6e`, `tpu7x`: the generation's smallest
    topology; or a topology such as `v5e:2x2`)."""
    return compile_many([{"stablehlo": stablehlo, "topology": topology,
                          "num_partitions": num_partitions}])[0]


__all__ = ["Compiled", "compile", "compile_many", "estimate", "library_file", "worker_command"]

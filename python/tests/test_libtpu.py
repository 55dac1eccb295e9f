"""libtpu from Rust (issue 25, item 1): `kernel_runtime::libtpu` (here through `tpu_kernel.libtpu`, its
C-ABI face; the Rust CLI's `--check` is the same code) against the Python path (`tpu_toolchain`,
jax's PJRT client) on the same StableHLO: the same verdicts, LLO op counts, scheduled bundles and VMEM
for every example × {v5e, v6e, tpu7x}; a libtpu abort is a verdict and its worker is replaced; and the
throughput of the worker pool (printed).
"""
import os
import time

import pytest

import tpu_kernel.libtpu as lt
import tpu_toolchain as tc
from conftest import GENERATIONS, Example, cargo_build_examples, compiled, example_names

# The stored twins are one-device programs (the SPMD examples' twins: test_ring_collectives.py).
SINGLE_DEVICE = ("test_pallas_twin_programs_are_current",)

_RUST = {}


def rust_verdicts():
    """Every example × generation through the Rust compiler, once per test process (2 workers)."""
    if not _RUST:
        cargo_build_examples()
        keys = [(n, g) for n in example_names() for g in GENERATIONS]
        hlos = {n: Example(n) for n in example_names()}
        jobs = [(hlos[n].stablehlo_for(g), g) for n, g in keys]
        t = time.perf_counter()
        verdicts = lt.compile_many(jobs, workers=2)
        _RUST["wall_s"] = time.perf_counter() - t
        _RUST.update(zip(keys, verdicts))
    return _RUST


def test_rust_compiler_agrees_with_the_python_path(example):
    """Same StableHLO, same libtpu: ok, the LLO op counts (op by op), the bundles of the custom call
    and the VMEM libtpu reserved are equal on every generation."""
    rust = rust_verdicts()
    for g in GENERATIONS:
        mine = rust[(example.name, g)]
        py = compiled("ours", example.name, g, lambda g=g: tc.compile_stablehlo(example.stablehlo_for(g), g))
        where = f"{example.name} on {g}: rust {mine.summary()} / python {py.summary()}"
        assert mine.ok == py.ok and mine.ok, where
        assert mine.topology == py.topology, where
        assert mine.llo_counts == py.llo_counts, where
        assert mine.llo_total == py.llo_total, where
        assert mine.bundles == py.bundles and mine.bundles is not None, where
        assert mine.bundles_by_program == py.bundles_by_program, where
        assert mine.used_vmem_bytes == py.used_vmem_bytes, where
        assert mine.custom_calls == py.n_custom_calls == 1, where


def test_worker_pool_throughput():
    """Compiles per second per core through the workers (printed; a benchmark figure, not a timed
    assertion): every example × generation on 2 workers, 2 cores."""
    rust = rust_verdicts()
    verdicts = [v for k, v in rust.items() if k != "wall_s"]
    assert all(v.ok for v in verdicts)
    n, wall = len(verdicts), rust["wall_s"]
    cores = min(2, os.cpu_count() or 1)
    in_libtpu = sum(v.compile_ms for v in verdicts) / 1e3
    print(f"\nlibtpu from Rust: {n} compiles in {wall:.1f} s on 2 workers ({n / wall:.2f} compiles/s, "
          f"{n / wall / cores:.2f} per core; {in_libtpu / n * 1e3:.0f} ms mean inside PJRT_Compile, "
          "worker start-up included in the wall time)")


def test_without_llo_counts_the_schedule_is_the_same():
    """`llo_counts=False` (what `tune` compiles with: no Mosaic stage dumps) gives the same verdict,
    bundles, schedule and estimate, and no LLO op counts."""
    jobs = [(Example(n).stablehlo_for("v6e"), "v6e") for n in ("matmul", "flash_attention")]
    full = lt.compile_many(jobs, workers=2)
    lean = lt.compile_many(jobs, workers=2, llo_counts=False)
    for f, l in zip(full, lean):
        assert f.ok and l.ok and f.llo_counts and l.llo_counts is None, (f.summary(), l.summary())
        assert (l.bundles, l.bundles_by_program, l.schedule, l.estimate) == \
            (f.bundles, f.bundles_by_program, f.schedule, f.estimate)


def test_a_stored_schedule_is_estimated_again_without_a_compile():
    """`tpu_kernel.libtpu.estimate` on a verdict's schedule gives the verdict's estimate (the model is
    one function of the schedule); an unknown generation is a clear error, not a crash."""
    from tpu_kernel import LibraryError
    [v] = lt.compile_many([(Example("matmul").stablehlo_for("v6e"), "v6e")], workers=1, llo_counts=False)
    assert v.ok and v.schedule and v.estimate, v.summary()
    est, why = lt.estimate(v.schedule, "v6e")
    assert (est, why) == (v.estimate, None)
    other, _ = lt.estimate(v.schedule, "v5e")  # v5e's HBM and clock: another figure
    assert other["cycles"] != est["cycles"] and other["body"] == est["body"], (other, est)
    with pytest.raises(LibraryError, match="v9z"):
        lt.estimate(v.schedule, "v9z")


def test_an_abort_is_a_verdict_and_the_worker_is_replaced():
    """tpu-inference's ragged paged attention traced for v6 (int16 mask arithmetic) and compiled for
    v5e makes libtpu abort the process (TOOLCHAIN.md): through the Rust compiler that is a verdict
    (`aborted`, libtpu's fatal line quoted), and the next compile on the same pool runs on a fresh
    worker."""
    import rpa_tpu_worker as rw
    import tpu_inference_rpa as tir
    mod = tir.kernel_module()
    with tir.tpu_generation(mod, 6):
        hlo = tc.lower_jax_for_tpu(lambda *x: mod.ragged_paged_attention(*x), rw.args(), "v6e")
    add = Example("add").stablehlo_for("v5e")
    cargo_build_examples()
    dead, after = lt.compile_many([(hlo, "v5e"), (add, "v5e")], workers=1)
    assert not dead.ok and dead.aborted, dead.summary()
    assert "aborted the worker process" in dead.error, dead.error
    assert "kVectorAddS16" in dead.error or "Check failed" in dead.error, dead.error
    assert after.ok and after.llo_total, after.summary()
    # the same program traced for v6 compiles for v6e
    ok = lt.compile(hlo, "v6e")
    assert ok.ok and ok.custom_calls == 2, ok.summary()


def test_rejections_carry_libtpu_text():
    """A program libtpu refuses is a verdict with its error text, not an exception."""
    bad = lt.compile("module { func.func @main() { nonsense.op } }", "v6e")
    assert not bad.ok and not bad.aborted and bad.error, bad
    with pytest.raises(Exception, match="topology"):
        lt.compile(Example("add").stablehlo_for("v5e"), "v9z:1x1")


def test_topology_names_resolve_like_the_python_path():
    """A generation resolves to the topology tpu_toolchain uses for it (the Target table's column)."""
    cargo_build_examples()
    hlo = Example("add").stablehlo_for("v5e")
    for g in ("v4", "v5e", "v5p", "v6e", "tpu7x", "v5e:2x2", "v6e:2x2"):
        v = lt.compile(hlo, g)
        assert v.ok and v.topology == tc.topology(g)[0], (g, v.summary())



def test_pallas_twin_programs_are_current(example):
    """tests/libtpu.rs compiles the Pallas twins from stored programs (tests/data/pallas_twins, written
    by scripts/pallas_twins.py) so the Rust test needs no Python: each stored program compiles, through
    the Rust path, to the LLO ops and bundles the live twin (pallas_kernels.py, compiled by jax) does."""
    import pallas_kernels
    from conftest import REPO
    fn, args = pallas_kernels.KERNELS[example.name]
    stored = []
    for g in GENERATIONS:
        path = REPO / "tests" / "data" / "pallas_twins" / f"{example.name}.{g}.mlir"
        assert path.is_file(), f"{path} is missing: run `.venv/bin/python scripts/pallas_twins.py {example.name}`"
        stored.append((path.read_text(), g))
    for (_, g), mine in zip(stored, lt.compile_many(stored, workers=2)):
        live = compiled("pallas", example.name, g, lambda g=g: tc.compile_jax(fn, args, g))
        assert mine.ok and live.ok, (mine.summary(), live.summary())
        assert (mine.llo_total, mine.bundles) == (live.llo_total, live.bundles), (
            f"{example.name} on {g}: the stored twin program gives {mine.summary()}, the live twin "
            f"{live.summary()}: rerun `.venv/bin/python scripts/pallas_twins.py {example.name}`")

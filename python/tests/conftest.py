"""Shared fixtures of the real-toolchain suite.

Every `examples/*.rs` is discovered here (a kernel added later is covered without touching the suite),
built once with cargo, and asked for its Mosaic text, StableHLO program and backend_config. libtpu
compiles are cached per (what, generation) for the session, and the parity table is printed at the end
of the run.
"""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Eight host CPU devices for the shard_map tests; XLA reads the flag once, when jax starts its CPU
# backend, so it must be in the environment before anything imports jax.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# python/ is appended, not prepended: it holds the suite's helpers (tpu_toolchain.py) but also the
# *source* of the tpu_kernel package, and the tests must import the installed package (with its
# cargo-built library), never the source tree.
sys.path.append(str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

import tpu_toolchain as tc  # noqa: E402  (sets the Mosaic dump directory before jax starts libtpu)

# The TPU generations every example is compiled for (built for each with `--target`), and the twins
# traced for: the three the examples must hold parity on (issue 20).
GENERATIONS = ["v5e", "v6e", "tpu7x"]
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))


# The examples that talk to other devices of a mesh (remote DMA, the barrier semaphore): they run per
# device inside `jax.shard_map`, so a test that calls an example alone, or compiles its Pallas twin for
# one device, leaves them out (its module lists them in SINGLE_DEVICE); test_ring_collectives.py
# holds them to their twins on sharded topologies instead.
SPMD_EXAMPLES = ("ring_all_gather", "ring_reduce_scatter", "all_gather_matmul")


def bench_module(name: str):
    """A script of `benches/` imported as a module (the tests that run a benchmark's pieces)."""
    import importlib
    if str(REPO / "benches") not in sys.path:
        sys.path.insert(0, str(REPO / "benches"))
    return importlib.import_module(name)


def example_names(include_spmd: bool = True):
    ex = REPO / "examples"
    names = [p.stem for p in ex.glob("*.rs")] + [p.parent.name for p in ex.glob("*/main.rs")]
    return sorted(n for n in names if include_spmd or n not in SPMD_EXAMPLES)


def pytest_generate_tests(metafunc):
    if "example" in metafunc.fixturenames:
        single = metafunc.function.__name__ in getattr(metafunc.module, "SINGLE_DEVICE", ())
        metafunc.parametrize("example", example_names(include_spmd=not single), indirect=True)
    own = any("generation" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize"))
    if "generation" in metafunc.fixturenames and not own:
        metafunc.parametrize("generation", GENERATIONS)


_built = {}


def cargo_build_examples():
    """`cargo build --examples` once per session (a no-op when up to date); a failure fails the tests."""
    if "ok" not in _built:
        p = subprocess.run(["cargo", "build", "--quiet", "--examples"], cwd=REPO, capture_output=True, text=True)
        if p.returncode != 0:
            pytest.fail(f"cargo build --examples failed:\n{p.stderr[-4000:]}", pytrace=False)
        _built["ok"] = True


class Example:
    """One example binary and what it emits (for the default target, or with `--target`)."""

    def __init__(self, name):
        self.name = name
        self.binary = TARGET_DIR / "debug" / "examples" / name
        self._emitted = {}

    def emit(self, kind: str, target: str | None = None) -> str:
        if (kind, target) not in self._emitted:
            args = [str(self.binary), "--emit", kind] + (["--target", target] if target else [])
            p = subprocess.run(args, capture_output=True, text=True)
            if p.returncode != 0:
                pytest.fail(f"{self.name} {' '.join(args[1:])} failed:\n{p.stderr}", pytrace=False)
            self._emitted[(kind, target)] = p.stdout
        return self._emitted[(kind, target)]

    def stablehlo_for(self, generation: str) -> str:
        """The StableHLO program of the kernel built for `generation`."""
        return self.emit("stablehlo", generation)

    @property
    def mosaic(self):
        return self.emit("mlir-generic")  # version-neutral: jaxlib parses any op in generic form

    @property
    def stablehlo(self):
        return self.emit("stablehlo")

    @property
    def config(self):
        return self.emit("config")


_examples = {}


@pytest.fixture
def example(request):
    cargo_build_examples()
    name = request.param
    if name not in _examples:
        _examples[name] = Example(name)
    return _examples[name]


# (kind, name, generation) -> tc.Compiled, kind in {"ours", "pallas", "xla"}
COMPILED = {}


def compiled(kind, name, generation, make):
    key = (kind, name, generation)
    if key not in COMPILED:
        COMPILED[key] = make()
    return COMPILED[key]


def pytest_terminal_summary(terminalreporter):
    # An SPMD example's rows are its sharded programs (generation `v5e:2x2`, ...), next to its twin's;
    # its one-device compiles have no twin to stand beside.
    rows = sorted({(n, g) for (k, n, g) in COMPILED if k == "ours" and (n not in SPMD_EXAMPLES or ":" in g)})
    if not rows:
        return
    tr = terminalreporter
    tr.section("Parity: ours vs Pallas (post-finalize-llo ops; total scheduled bundles of the custom call; "
               "libtpu %s)" % tc.VERSIONS["libtpu"])
    w = max(16, *(len(n) for n, _ in rows))
    tr.write_line(f"{'kernel':<{w}} {'gen':<11} {'LLO ours':>8} {'Pallas':>7} {'ratio':>6}  "
                  f"{'bundles ours':>12} {'Pallas':>7} {'ratio':>6}")

    def ratio(a, b):
        return f"{a / b:.3f}" if a is not None and b else "-"

    for n, g in rows:
        o, p = COMPILED.get(("ours", n, g)), COMPILED.get(("pallas", n, g))
        ol, ob = (o.llo_total, o.bundles) if o and o.ok else (None, None)
        pl_, pb = (p.llo_total, p.bundles) if p and p.ok else (None, None)
        tr.write_line(f"{n:<{w}} {g:<11} {str(ol):>8} {str(pl_):>7} {ratio(ol, pl_):>6}  "
                      f"{str(ob):>12} {str(pb):>7} {ratio(ob, pb):>6}")


# -------------------------------------------------------------- kernels as JAX ops (test_jax_*.py)

USER_CRATE_LIB = TARGET_DIR / "debug" / "libtpu_kernel_user_crate.so"


@pytest.fixture(scope="session")
def user_crate():
    """The test fixture crate `tests/user-crate` as a loaded `tpu_kernel.Library` (kernels with a
    required parameter and with a run-time error). Built by scripts/test.sh; absent is a failure."""
    import tpu_kernel
    if not USER_CRATE_LIB.is_file():
        pytest.fail(f"{USER_CRATE_LIB} is missing: build it with `cargo build -p tpu-kernel-user-crate` "
                    f"(scripts/test.sh does)", pytrace=False)
    return tpu_kernel.load(USER_CRATE_LIB)

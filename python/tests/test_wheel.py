"""`pip wheel .` gives a wheel holding the package, its `py.typed` and the examples library, which installs
into a fresh venv and passes the package's own smoke test (`python -m tpu_kernel`) there (issue 24,
item 6). Cheap by construction: the wheel's cargo build is the release build `pip install .` already
made in the same `target/` (a no-op), pip's build requirements come from its cache, and the fresh venv
installs only the wheel — its dependencies (jax, numpy, torch) are this venv's, appended to the fresh
venv's path by a `.pth` file, so the fresh venv's own copy of `tpu_kernel` is the one imported."""
import fcntl
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # One build per test session, shared by the xdist workers: `pip wheel .` builds in the repository's
    # `build/`, so two workers building at once collide there (seen in CI: "[Errno 17] File exists:
    # build/bdist.linux-x86_64/wheel/tpu_kernel-0.1.0.dist-info"). The first worker to take the lock
    # builds into the session's shared temp directory; the others find the wheel there.
    session = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # a worker's basetemp is popen-gwN inside the session's
        session = session.parent
    shared = session / "tpu_kernel_wheel"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = list(shared.glob("tpu_kernel-*.whl"))
        if not wheels:
            p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                                "--no-deps", str(REPO), "-w", str(shared)], capture_output=True, text=True, cwd=REPO)
            assert p.returncode == 0, p.stderr[-4000:]
            wheels = list(shared.glob("tpu_kernel-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_holds_the_package_its_types_and_the_examples_library(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "tpu_kernel/py.typed" in names
    assert any(n.startswith("tpu_kernel/libtpu_kernel_examples") and n.endswith(".so") for n in names), names
    assert {"tpu_kernel/__main__.py", "tpu_kernel/_jax_private.py", "tpu_kernel/torch/_ops.py"} <= set(names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: jax<0.13,>=0.12.0.1" in meta, [l for l in meta.splitlines() if "Requires" in l]


def test_the_wheel_installs_into_a_fresh_venv_and_passes_its_smoke_test(wheel, tmp_path):
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-4000:]
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    (fresh_site / "_deps_from_test_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_KERNEL_EXAMPLES_LIB", "PYTHONPATH")}
    p = subprocess.run([str(python), "-m", "tpu_kernel"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    lines = p.stdout.splitlines()
    assert lines[-1] == "ok", p.stdout
    assert f"from {fresh_site}/tpu_kernel/__init__.py" in lines[0], lines[0]
    assert f"examples library {fresh_site}/tpu_kernel/libtpu_kernel_examples" in lines[1], lines[1]
    assert any(l.startswith("torch ") and l.endswith(": ok") for l in lines), p.stdout

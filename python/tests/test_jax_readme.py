"""The README's "Kernels as JAX ops" example is true: its Rust is the user crate's code, and its Python
runs as pasted (from the repository root, in a fresh interpreter, as the demo runs it)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_example", REPO / "scripts" / "readme_example.py")
readme_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_example)


def test_readme_rust_is_the_user_crates_code():
    (rust,) = readme_example.blocks("rust")
    crate = (REPO / "tests/user-crate/src/lib.rs").read_text()
    assert rust.strip() in crate, "README's Rust example drifted from tests/user-crate/src/lib.rs"


def test_readme_python_runs_as_pasted(user_crate):
    (py,) = readme_example.blocks("python")
    assert len(py.strip().splitlines()) <= 15, "the README promises a ≤ 15-line example"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_example.py")], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "stablehlo.custom_call @tpu_custom_call" in p.stdout, p.stdout  # the TPU lowering


def test_readme_torch_example_runs_as_pasted():
    (py,) = readme_example.blocks("python", readme_example.TORCH)
    assert len(py.strip().splitlines()) <= 15, "the README promises a ≤ 15-line example"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_example.py"), readme_example.TORCH],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout.strip().splitlines()
    assert out[-2].endswith("(256, 512)"), out  # the Linear's weight gradient
    assert out[-1] == "Tensor (2, 128, 256)", out  # a torchax tensor out of the jitted program

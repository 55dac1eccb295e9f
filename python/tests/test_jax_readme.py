"""The README's "Kernels as JAX ops" example is true: its Rust is the user crate's code, and its Python
runs as pasted (from the repository root, in a fresh interpreter)."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _section_blocks(lang: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Kernels as JAX ops", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_rust_is_the_user_crates_code():
    (rust,) = _section_blocks("rust")
    crate = (REPO / "tests/user-crate/src/lib.rs").read_text()
    assert rust.strip() in crate, "README's Rust example drifted from tests/user-crate/src/lib.rs"


def test_readme_python_runs_as_pasted(user_crate):
    (py,) = _section_blocks("python")
    assert len(py.strip().splitlines()) <= 15, "the README promises a ≤ 15-line example"
    p = subprocess.run([sys.executable, "-c", py], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "stablehlo.custom_call @tpu_custom_call" in p.stdout, p.stdout  # the TPU lowering

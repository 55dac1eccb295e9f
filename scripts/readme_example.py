"""The examples of the README's "Kernels as JAX ops" and "Kernels in PyTorch (torchax)" sections:
`blocks(lang, section)` reads a section's code blocks (python/tests/test_jax_readme.py checks them),
and `readme_example.py [SECTION]` executes the section's Python block as written (the demo's last
steps). Run from the repository root with the venv's python after `pip install .` and
`cargo build -p tpu-kernel-user-crate`."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


JAX = "Kernels as JAX ops"
TORCH = "Kernels in PyTorch (torchax)"


def blocks(lang: str, section: str = JAX) -> list[str]:
    """The ```lang code blocks of a README section, in order."""
    text = README.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


if __name__ == "__main__":
    import sys
    section = sys.argv[1] if len(sys.argv) > 1 else JAX
    (code,) = blocks("python", section)
    print(code)
    exec(compile(code, f"README.md ({section})", "exec"))

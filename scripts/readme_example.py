"""The example of the README's "Kernels as JAX ops" section: `blocks(lang)` reads its code blocks
(python/tests/test_jax_readme.py checks them), and running this file executes the Python one as
written (the demo's last step). Run from the repository root with the venv's python after
`pip install .` and `cargo build -p tpu-kernel-user-crate`."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang: str) -> list[str]:
    """The ```lang code blocks of the section, in order."""
    section = README.read_text().split("## Kernels as JAX ops", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


if __name__ == "__main__":
    (code,) = blocks("python")
    print(code)
    exec(compile(code, "README.md (Kernels as JAX ops)", "exec"))

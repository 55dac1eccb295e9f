"""Run the Python example of the README's "Kernels as JAX ops" section as written (the demo's last
step; python/tests/test_jax_readme.py checks the same block). Run from the repository root with the
venv's python after `pip install .` and `cargo build -p tpu-kernel-user-crate`."""
import re
from pathlib import Path

readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
section = readme.split("## Kernels as JAX ops", 1)[1].split("\n## ", 1)[0]
(code,) = re.findall(r"```python\n(.*?)```", section, re.S)
print(code)
exec(compile(code, "README.md (Kernels as JAX ops)", "exec"))

"""Reverse-mode differentiation of kernels that declare backward kernels.

The library description's `grad` of a kernel is a list of entries
    {"inputs": ["x"], "kernel": "matmul_dx", "args": ["g", "y"], "params": {"block": "block"}}
meaning: call the exported kernel `matmul_dx` with the arrays named in `args` — forward inputs by
name, `out`/`out0..` (forward outputs), `g`/`g0..` (their cotangents) — and the static parameters
`params` (backward name -> forward name, values from the forward's canonical parameters as Rust
answered them); its outputs are, in order, the cotangents of the forward inputs listed in `inputs`.

A kernel may name a `fwd` kernel (`#[export(fwd = ..)]`): under differentiation it runs instead of the
forward (same arrays, same static parameters) and returns the forward's outputs followed by residuals
for the backward kernels — `outN` past the forward's own outputs (flash attention saves its softmax
statistics so). Evaluated without differentiation, the plain forward runs and nothing extra is written.

The forward is wrapped in `jax.custom_vjp` once per (kernel, static parameters, target), the static
parameters closed over (never differentiated); the backward kernels build for the forward's target.
The backward kernels are ordinary `Kernel` calls, so they are primitives too: they batch under vmap,
lower for CPU and TPU, and are cached like any kernel.
Forward inputs that no entry covers (e.g. integer operands) get a zero cotangent.
"""
from __future__ import annotations

import json
from typing import Any

import jax

from ._errors import KernelError


def _names(prefix: str, n: int) -> list[str]:
    return [prefix] if n == 1 else [f"{prefix}{i}" for i in range(n)]


def make_vjp(kernel: Any, params_json: str, target: str | None = None) -> Any:
    """The `jax.custom_vjp` function of `kernel` at `params_json` and `target`: takes the tuple of
    arrays, returns the tuple of outputs."""
    from . import _primitive
    library = kernel.library

    def forward(arrays):
        return tuple(_primitive.bind(library, kernel.name, params_json, arrays, target=target))

    f = jax.custom_vjp(forward)

    def fwd(arrays):
        if not kernel.fwd:
            outs = forward(arrays)
            return outs, (arrays, outs)
        saved = tuple(_primitive.bind(library, kernel.fwd, params_json, arrays, target=target))
        n = len(jax.eval_shape(forward, arrays))
        if len(saved) <= n:
            raise KernelError(f"{kernel.name}: its differentiation forward {kernel.fwd!r} returns {len(saved)} "
                              f"array(s), not {kernel.name}'s {n} output(s) followed by residuals",
                              kind="Grad", kernel=kernel.name)
        return saved[:n], (arrays, saved)

    def bwd(residuals, cotangents):
        arrays, outs = residuals
        forward_params = json.loads(params_json)  # Rust's canonical values
        env = dict(zip(kernel.inputs, arrays))
        env.update(zip(_names("out", len(outs)), outs))
        env.update(zip(_names("g", len(cotangents)), cotangents))
        grads: dict[str, object] = {}
        for entry in kernel.grad:
            back = library.kernels.get(entry["kernel"])
            if back is None:
                raise KernelError(f"{kernel.name}: its backward kernel {entry['kernel']!r} is not exported "
                                  f"by library {library.name!r}", kind="Grad", kernel=kernel.name)
            try:
                args = [env[a] for a in entry["args"]]
                params = {b: forward_params[f] for b, f in (entry.get("params") or {}).items()}
            except KeyError as e:
                raise KernelError(f"{kernel.name}: backward entry {entry!r} names {e.args[0]!r}, which is "
                                  f"neither an input, an output, a cotangent nor a forward parameter",
                                  kind="Grad", kernel=kernel.name) from None
            result = back(*args, target=target, **params)
            result = result if isinstance(result, tuple) else (result,)
            if len(result) != len(entry["inputs"]):
                raise KernelError(f"{kernel.name}: backward kernel {back.name!r} returns {len(result)} "
                                  f"array(s) for the cotangents of {entry['inputs']}", kind="Grad",
                                  kernel=kernel.name)
            for name, ct in zip(entry["inputs"], result):
                primal = env[name]
                if tuple(ct.shape) != tuple(primal.shape) or ct.dtype != primal.dtype:
                    raise KernelError(
                        f"{kernel.name}: backward kernel {back.name!r} gives the cotangent of {name!r} as "
                        f"{ct.dtype}{list(ct.shape)}, but {name!r} is {primal.dtype}{list(primal.shape)}",
                        kind="Grad", kernel=kernel.name)
                grads[name] = ct
        return (tuple(grads.get(name) for name in kernel.inputs),)

    f.defvjp(fwd, bwd)
    return f

"""tpu_kernel.torch: the kernels of a `tpu_kernel.Library` on torch tensors, through torchax.

    import torch, torchax
    import tpu_kernel.torch as tkt

    y = tkt.examples.matmul(x, w, block=(128, 128, 128))   # torch tensors in, a torch tensor out
    norm = tkt.RMSNorm(1024)                                # nn.Modules on our rmsnorm / matmul
    proj = tkt.Linear(1024, 4096)

Tensors may be torchax tensors (device `jax`, `torchax.default_env().to_xla(t)`), which stay torchax
tensors, or plain CPU tensors, which come back as plain CPU tensors. The call is the JAX op of
`tpu_kernel` applied to the tensors' jax views (`torchax.interop.jax_view` / `torch_view` for torchax
tensors; a dlpack copy for CPU ones), so the same op runs inside `torchax.interop.jax_jit` (traced
into the jitted program), on TPU as the `tpu_custom_call`, and on CPU through XLA FFI.

Gradients: when a kernel declares backward kernels (the examples' `matmul`, `rmsnorm`) and an input
requires grad, the call is a `torch.autograd.Function` whose backward is `jax.vjp` of the op, i.e.
the kernel's `jax.custom_vjp`, i.e. the backward kernels written in Rust. `loss.backward()` reaches
them. A kernel without backward kernels raises a `KernelError` naming it when asked for a gradient.

Static parameters are keyword-only, as in `tpu_kernel`: `op(*tensors, block=(...))`.

int4: torch has no int4 tensor torchax carries (torchax maps no torch dtype to jax's `int4` and maps
jax `int4` arrays to `torch.int8`), so int4 data crosses as **int8 tensors holding -8..7, one value
per element** — torchax's convention, not a packed uint8 one. An int4 *result* comes back as such an
int8 tensor; an int4 *argument* is an int8 tensor wrapped in `int4(t)` (values checked, then cast to
jax's int4 for the call). A `torch.int4` tensor is refused naming the argument.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
import torch
import torchax
from torchax import interop
from torchax.ops import mappings

from .._errors import KernelError
from .._library import Kernel, Library

__all__ = ["Linear", "RMSNorm", "int4", "op", "ops"]


class int4:  # noqa: N801 (named as the dtype it stands for)
    """An int8 tensor (CPU or torchax) holding int4 values -8..7, passed to a kernel's int4 parameter:
    `op(kernel)(int4(t))`. Checked when the call is made: int8, values in range (not checkable while
    traced inside `jax_jit`)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _unwrap(tensors: Sequence[Any]) -> tuple[list, set]:
    """The tensors with `int4(..)` wrappers removed, and the positions that were wrapped."""
    return ([t.tensor if isinstance(t, int4) else t for t in tensors],
            {i for i, t in enumerate(tensors) if isinstance(t, int4)})


def _as_int4(a, i: int, kernel: str):
    """jax array `a` (argument `i`, an int8 tensor wrapped in `int4`) as jax's int4, its range checked
    when its values are known."""
    if a.dtype == jax.numpy.int4:  # already jax's int4 (a jax array handed through torchax)
        return a
    if a.dtype != jax.numpy.int8:
        raise KernelError(f"{kernel}(): argument {i} is wrapped in int4(..) but holds {a.dtype}; int4 data "
                          f"crosses as an int8 tensor of values -8..7", argument=str(i), kernel=kernel)
    if not isinstance(a, jax.core.Tracer):
        lo, hi = int(a.min()), int(a.max())
        if lo < -8 or hi > 7:
            raise KernelError(f"{kernel}(): argument {i} (int4) holds {lo if lo < -8 else hi}, outside int4's "
                              f"-8..7", argument=str(i), kernel=kernel)
    return a.astype(jax.numpy.int4)


def _is_torchax(t: Any) -> bool:
    return isinstance(t, (torchax.tensor.Tensor, torchax.tensor.View))


def _to_jax(tensors: Sequence[torch.Tensor], kernel: str) -> list:
    tensors, wrapped = _unwrap(tensors)
    out = []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"{kernel}(): argument {i} is a {type(t).__name__}, expected a torch tensor "
                              f"(a torchax tensor or a CPU tensor)", argument=str(i), kernel=kernel)
        _refuse_torch_int4(t, i, kernel)
        if _is_torchax(t):
            out.append(interop.jax_view(t))
        elif t.device.type != "cpu":
            raise KernelError(f"{kernel}(): argument {i} is on device {t.device}; pass CPU tensors or "
                              f"torchax tensors (torchax.default_env().to_xla(t))", argument=str(i),
                              kernel=kernel)
        else:
            out.append(_cpu_to_jax(t))
    return [_as_int4(a, i, kernel) if i in wrapped else a for i, a in enumerate(out)]


def _refuse_torch_int4(t: torch.Tensor, i: int, kernel: str) -> None:
    if t.dtype == getattr(torch, "int4", None):
        raise KernelError(f"{kernel}(): argument {i} is a torch.int4 tensor, which torchax cannot carry (it "
                          f"maps no torch dtype to jax's int4); pass int4 data as an int8 tensor of values "
                          f"-8..7 wrapped in tpu_kernel.torch.int4(t)", argument=str(i), kernel=kernel)


def _cpu_to_jax(t: torch.Tensor):
    """A copy (the caller may change its tensor while jax still reads it: dispatch is asynchronous)."""
    t = t.detach().contiguous()
    try:
        return jax.numpy.array(jax.dlpack.from_dlpack(t), copy=True)
    except (TypeError, RuntimeError, BufferError):
        return jax.numpy.array(mappings.t2j(t), copy=True)


def _jax_to_cpu(a) -> torch.Tensor:
    """A copy (jax arrays are immutable; the torch tensor given out may be written to)."""
    try:
        return torch.from_dlpack(a).clone()
    except (TypeError, RuntimeError, BufferError):  # e.g. an array sharded over several devices
        host = np.array(jax.device_get(a))  # gathered, writable
        if host.dtype == jax.numpy.int4:  # torchax's convention: one int8 per int4 value
            return torch.from_numpy(host.astype(np.int8))
        if host.dtype == jax.numpy.bfloat16:
            return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(host)


def _to_torch(value: Any, torchax_out: bool):
    """A jax result as torch: torchax tensors when the call had torchax inputs, else CPU tensors."""
    if torchax_out:
        return interop.torch_view(value)
    return jax.tree.map(_jax_to_cpu, value)


class _KernelGrad(torch.autograd.Function):
    """One differentiable kernel call: forward runs `jax.vjp` of the op, backward its vjp function."""

    @staticmethod
    def forward(ctx, kernel: Kernel, params: dict, torchax_out: bool, *tensors):
        xs = _to_jax(tensors, kernel.name)
        outs, vjp = jax.vjp(lambda *a: kernel(*a, **params), *xs)
        ctx.vjp, ctx.torchax_out, ctx.single = vjp, torchax_out, not isinstance(outs, tuple)
        ctx.kernel = kernel.name
        return _to_torch(outs, torchax_out)

    @staticmethod
    def backward(ctx, *grads):
        cts = _to_jax(grads, ctx.kernel)
        in_grads = ctx.vjp(cts[0] if ctx.single else tuple(cts))
        return (None, None, None, *(_to_torch(g, ctx.torchax_out) for g in in_grads))


def op(kernel: Kernel) -> Callable:
    """The torch-facing callable of one kernel: `f(*tensors, **static_params)` → torch tensor(s)."""

    def call(*tensors: torch.Tensor, **params: Any):
        kernel._check_arity(tensors)
        kernel.canonical_params(params)  # unknown / missing / mistyped static parameters fail here (Rust's verdict)
        raw, wrapped = _unwrap(tensors)
        kinds = {_is_torchax(t) for t in raw if isinstance(t, torch.Tensor)}
        if len(kinds) > 1:
            raise KernelError(f"{kernel.name}(): mixes torchax tensors and plain CPU tensors; move them all "
                              f"with torchax.default_env().to_xla(t) or keep them all on the CPU",
                              kernel=kernel.name)
        torchax_out = kinds == {True}
        wants_grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in raw)
        if wants_grad:
            if not kernel.grad:
                raise KernelError(f"{kernel.name}(): an input requires grad but the kernel declares no "
                                  f"backward kernels (Rust: #[export(grad(...))])", kernel=kernel.name)
            return _KernelGrad.apply(kernel, params, torchax_out, *tensors)
        if torchax_out:
            for i, t in enumerate(raw):
                _refuse_torch_int4(t, i, kernel.name)

            def call_with_int4(*a):
                out = kernel(*(_as_int4(x, i, kernel.name) if i in wrapped else x
                               for i, x in enumerate(a)), **params)
                # int4 results as int8 (torchax would label them torch.int8 over a jax int4 array,
                # which its `.cpu()` cannot convert).
                return jax.tree.map(lambda r: r.astype(jax.numpy.int8) if r.dtype == jax.numpy.int4 else r,
                                    out)
            return interop.call_jax(call_with_int4, *raw)
        return _to_torch(kernel(*_to_jax(tensors, kernel.name), **params), False)

    call.__name__ = call.__qualname__ = kernel.name
    call.__doc__ = kernel.__doc__
    call.__signature__ = kernel.__signature__
    call.kernel = kernel
    return call


class _Ops:
    """A library's kernels as torch ops, by attribute (`ops(lib).matmul`)."""

    def __init__(self, library: Library):
        self.library = library
        self._ops = {name: op(k) for name, k in library.kernels.items()}

    def __getattr__(self, name: str):
        try:
            return self.__dict__["_ops"][name]
        except KeyError:
            raise AttributeError(f"library {self.library.name!r} has no kernel {name!r}; it has: "
                                 f"{', '.join(sorted(self._ops))}") from None

    def __dir__(self):
        return sorted(self._ops)


def ops(library: Library) -> _Ops:
    """Every kernel of `library` as a torch op."""
    return _Ops(library)


def _examples():
    from . import examples
    return examples


def _shard_map(layer, key, fn, in_specs, out_specs):
    """`fn` (jax arrays per shard → per-shard result) as a jitted `jax.shard_map` over the layer's
    mesh, made once per layer and key (jit places the inputs as `in_specs` say)."""
    cache = layer.__dict__.setdefault("_sharded_fns", {})
    if key not in cache:
        cache[key] = jax.jit(jax.shard_map(fn, mesh=layer.mesh, in_specs=in_specs, out_specs=out_specs))
    return cache[key]


def _check_sharded_input(layer, x):
    if not _is_torchax(x):
        raise KernelError(f"{type(layer).__name__} with a mesh takes torchax tensors (placed on the mesh's "
                          f"devices), got a {type(x).__name__} on {getattr(x, 'device', '?')}")


class RMSNorm(torch.nn.Module):
    """RMSNorm on the `rmsnorm` kernel: `x * rsqrt(mean(x², -1) + eps) * weight`, x bf16 `[..., dim]`
    (rows a multiple of `block_rows`), weight f32 `[dim]` (initialized to ones). Differentiable in x
    and weight through the Rust backward kernel.

    With `mesh` (a `jax.sharding.Mesh`), the kernel runs per shard inside `jax.shard_map`: rows split
    over `data_axis`, the weight replicated (torchax tensors only; forward only)."""

    def __init__(self, dim: int, eps: float = 1e-6, block_rows: int = 16, *, mesh=None, data_axis: str = "x"):
        super().__init__()
        self.dim, self.eps, self.block_rows = dim, eps, block_rows
        self.mesh, self.data_axis = mesh, data_axis
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.dim)
        w = self.weight.reshape(1, self.dim)
        params = dict(eps=self.eps, block_rows=self.block_rows)
        if self.mesh is None:
            y = _examples().rmsnorm(rows, w, **params)
        else:
            from jax.sharding import PartitionSpec as P
            _check_sharded_input(self, x)
            k = _examples().library.kernels["rmsnorm"]
            f = _shard_map(self, "rmsnorm", lambda xs, ws: k(xs, ws, **params),
                           (P(self.data_axis, None), P(None, None)), P(self.data_axis, None))
            y = interop.call_jax(f, rows, w)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        sharded = f", mesh axes {self.mesh.axis_names}, rows over {self.data_axis!r}" if self.mesh else ""
        return f"{self.dim}, eps={self.eps}, block_rows={self.block_rows}{sharded}"


class Linear(torch.nn.Module):
    """`y = x @ weight` on the `matmul` kernel (bf16 in and out, f32 accumulation), weight bf16
    `[in_features, out_features]` — the layout the kernel multiplies (jax's, not torch.nn.Linear's
    `[out, in]`). No bias. Differentiable in x and weight through the Rust backward kernels.

    With `mesh` and `parallel`, the kernel runs per shard inside `jax.shard_map` (torchax tensors only;
    forward only), rows split over `axes[0]` and, Megatron-style, over `axes[1]`:
    - `parallel="column"`: weight `P(None, axes[1])`, x `P(axes[0], None)`, y `P(axes[0], axes[1])`,
      no collective;
    - `parallel="row"`: weight `P(axes[1], None)`, x `P(axes[0], axes[1])`, per-shard partial products
      summed with `psum` over `axes[1]` (in f32), y `P(axes[0], None)`.
    Place the weight accordingly (`weight.apply_jax_(jax.device_put, NamedSharding(mesh, spec))`);
    jit reshards whatever is not."""

    def __init__(self, in_features: int, out_features: int, block: tuple = (128, 128, 128), *,
                 mesh=None, parallel: str | None = None, axes: tuple = ("x", "y")):
        super().__init__()
        if (mesh is None) != (parallel is None) or parallel not in (None, "column", "row"):
            raise ValueError("Linear: give both mesh and parallel ('column' or 'row'), or neither")
        self.in_features, self.out_features, self.block = in_features, out_features, tuple(block)
        self.mesh, self.parallel, self.axes = mesh, parallel, tuple(axes)
        w = torch.empty(in_features, out_features, dtype=torch.float32)
        torch.nn.init.kaiming_uniform_(w.T, a=5 ** 0.5)
        self.weight = torch.nn.Parameter(w.to(torch.bfloat16))

    def weight_spec(self):
        """The weight's PartitionSpec under this layer's `parallel` mode."""
        from jax.sharding import PartitionSpec as P
        return P(None, self.axes[1]) if self.parallel == "column" else P(self.axes[1], None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.mesh is None:
            y = _examples().matmul(rows, self.weight, block=self.block)
        else:
            from jax.sharding import PartitionSpec as P
            _check_sharded_input(self, x)
            k = _examples().library.kernels["matmul"]
            d, m = self.axes
            if self.parallel == "column":
                f = _shard_map(self, "column", lambda xs, ws: k(xs, ws, block=self.block),
                               (P(d, None), P(None, m)), P(d, m))
            else:
                def row(xs, ws):
                    part = k(xs, ws, block=self.block).astype(jax.numpy.float32)
                    return jax.lax.psum(part, m).astype(jax.numpy.bfloat16)
                f = _shard_map(self, "row", row, (P(d, m), P(m, None)), P(d, None))
            y = interop.call_jax(f, rows, self.weight)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        sharded = f", {self.parallel}-parallel over mesh axes {self.axes}" if self.mesh else ""
        return f"{self.in_features}, {self.out_features}, block={self.block}{sharded}"

"""tpu_kernel.torch: the kernels of a `tpu_kernel.Library` on torch tensors, through torchax.

    import torch, torchax
    import tpu_kernel.torch as tkt

    y = tkt.examples.matmul(x, w, block=(128, 128, 128))   # torch tensors in, a torch tensor out
    norm = tkt.RMSNorm(1024)                                # nn.Modules on our rmsnorm / matmul
    proj = tkt.Linear(1024, 4096)

Every kernel of every loaded library is a `torch.library` custom op, `torch.ops.tpu_kernel_{lib}.{name}`
(defined when the library is loaded, or when this package is imported for libraries loaded before;
see `_ops`): fake tensors get Rust's output shapes, `torch.compile(fullgraph=True)` and
`torch.export` capture the op as one graph node, `torch.library.opcheck` passes. `op(kernel)` (and
`tpu_kernel.torch.examples.<name>`, `ops(lib).<name>`) is the Python face of that op: the JAX
signature, one tensor or a tuple back, the call's mistakes as `KernelError`s naming the argument.

Tensors may be torchax tensors (device `jax`, `torchax.default_env().to_xla(t)`), which stay torchax
tensors, or plain CPU tensors, which come back as plain CPU tensors. The op is the JAX op of
`tpu_kernel` applied to the tensors' jax arrays (torchax tensors' own, through a
`register_torch_dispatch` rule; a numpy copy of CPU ones), so the same op runs inside
`torchax.interop.jax_jit` (traced into the jitted program), on TPU as the `tpu_custom_call`, and on
CPU through XLA FFI.

Gradients: the op's autograd formula is the export's grad rules — the backward kernels, which are ops
of the same namespace (`matmul_dx`, `matmul_dw`, `rmsnorm_bwd`, flash attention's `dkv`/`dq`), so
`loss.backward()` reaches the Rust backward kernels, in eager mode and in a compiled backward graph. A
kernel without backward kernels raises a `KernelError` naming it when asked for a gradient.

Layers: `RMSNorm`, `Linear` and `Attention` run the examples' `rmsnorm`, `matmul` and
`flash_attention` by default, or the op given as `kernel=` (any library's op with the same call).

Static parameters are keyword-only, as in `tpu_kernel`: `op(*tensors, block=(...))`.

int4: torch has no int4 tensor torchax carries (torchax maps no torch dtype to jax's `int4` and maps
jax `int4` arrays to `torch.int8`), so int4 data crosses as **int8 tensors holding -8..7, one value
per element** — torchax's convention, not a packed uint8 one. An int4 *result* comes back as such an
int8 tensor; an int4 *argument* is an int8 tensor wrapped in `int4(t)` (values checked, then cast to
jax's int4 for the call; such a call runs the JAX op directly, outside the `torch.library` op, whose
schema carries no int4). A `torch.int4` tensor is refused naming the argument.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, cast

import jax
import numpy as np
import torch
import torchax
from torchax import interop
from torchax.ops import mappings

from .._errors import KernelError
from .._library import Kernel, Library
from . import _compat, _ops

_compat.fix_torchax_accelerator()

__all__ = ["Attention", "Linear", "RMSNorm", "TorchOp", "int4", "op", "ops"]


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


def _as_int4(a: Any, i: int, kernel: str) -> Any:
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


def _int8_if_int4(a: Any) -> Any:
    """An int4 result as int8 (torchax labels jax int4 arrays torch.int8, which its `.cpu()` cannot
    convert; torch has no int4 tensor to give back)."""
    return a.astype(jax.numpy.int8) if a.dtype == jax.numpy.int4 else a


def _refuse_torch_int4(t: Any, i: int, kernel: str) -> None:
    if isinstance(t, torch.Tensor) and t.dtype == getattr(torch, "int4", None):
        raise KernelError(f"{kernel}(): argument {i} is a torch.int4 tensor, which torchax cannot carry (it "
                          f"maps no torch dtype to jax's int4); pass int4 data as an int8 tensor of values "
                          f"-8..7 wrapped in tpu_kernel.torch.int4(t)", argument=str(i), kernel=kernel)


def _int4_call(kernel: Kernel, tensors: Sequence[Any], params: dict[str, Any], target: str | None) -> Any:
    """A call with `int4(..)` arguments: the JAX op on the tensors' jax arrays, the wrapped ones as
    jax's int4, int4 results as int8 tensors."""
    raw, wrapped = _unwrap(tensors)
    torchax_env = _check_call(kernel, raw, params)
    if target is not None:
        params = dict(params, target=target)

    def run(*arrays: Any) -> Any:
        out = kernel(*(_as_int4(a, i, kernel.name) if i in wrapped else a for i, a in enumerate(arrays)),
                     **params)
        return jax.tree.map(_int8_if_int4, out)
    if torchax_env is not None:
        return interop.call_jax(run, *raw)
    out = run(*(_cpu_to_jax(t) for t in raw))
    return jax.tree.map(_jax_to_cpu, out)


class TorchOp(Protocol):
    """What `op()` returns: the torch-facing callable of one kernel, with its `tpu_kernel.Kernel` and
    its `torch.library` op (`torch.ops.tpu_kernel_{lib}.{name}.default`)."""

    kernel: Kernel
    op: torch._ops.OpOverload

    def __call__(self, *tensors: torch.Tensor, target: str | None = None, **params: Any) -> Any: ...


def _is_torchax(t: Any) -> bool:
    return isinstance(t, (torchax.tensor.Tensor, torchax.tensor.View))


def _cpu_to_host(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of a CPU tensor, for jax (the caller may change its tensor while jax still reads
    it: dispatch is asynchronous); `jax.jit` takes it as an argument in its C++ fast path. Dtypes numpy
    has no type for (bfloat16, the float8s) travel as same-width integers, viewed as ml_dtypes' type of
    the same name."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    try:
        host = t.numpy()
    except TypeError:
        host = t.view(_SAME_WIDTH_INT[t.element_size()]).numpy().view(np.dtype(str(t.dtype).removeprefix("torch.")))
    return host.copy()


def _cpu_to_jax(t: torch.Tensor) -> Any:
    """A jax array holding a copy of a CPU tensor."""
    return jax.device_put(_cpu_to_host(t))


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _jax_to_cpu(a: Any) -> torch.Tensor:
    """A copy (jax arrays are immutable; the torch tensor given out may be written to), through numpy:
    `np.asarray` of a CPU array is a view (a sharded array is gathered), the cheapest way out for numpy's
    own dtypes. ml_dtypes' (bfloat16, the float8s), which torch.from_numpy refuses, go through dlpack, or
    — for an array dlpack cannot export — as same-width integers viewed as torch's type of that name."""
    a = _int8_if_int4(a)
    dtype = np.dtype(a.dtype)
    via = _VIA_INT.get(dtype)
    if via is None:
        try:
            return torch.from_numpy(np.array(a, copy=True))
        except TypeError:
            via = _VIA_INT[dtype] = (np.dtype(f"int{8 * dtype.itemsize}"), getattr(torch, dtype.name))
    try:
        return torch.from_dlpack(a).clone()
    except (TypeError, RuntimeError, BufferError):  # e.g. an array sharded over several devices
        return torch.from_numpy(np.asarray(a).view(via[0]).copy()).view(via[1])


_VIA_INT: dict[np.dtype, tuple[np.dtype, torch.dtype]] = {}  # ml_dtypes' dtype -> (same-width int, torch's)


def op(kernel: Kernel) -> TorchOp:
    """The torch-facing callable of one kernel: `f(*tensors, **static_params)` → torch tensor(s).

    It calls the kernel's `torch.library` op (`f.op`, i.e. `torch.ops.tpu_kernel_{lib}.{name}.default`;
    see `_ops`) and returns one tensor or a tuple, as the JAX op does. Outside `torch.compile` /
    `torch.export` tracing it first checks the call in Python (arity, Rust's verdict on the static
    parameters, tensor kinds), so a mistake is a `KernelError` naming the argument before torch's
    dispatcher sees it; under tracing the op's fake implementation asks Rust the same."""
    ops_ = _ops.register(kernel.library)
    tk = ops_[kernel.name]
    overload = tk.op
    fwd = ops_.get(kernel.fwd) if kernel.fwd else None

    def call(*tensors: torch.Tensor, target: str | None = None, **params: Any) -> Any:
        if any(isinstance(t, int4) for t in tensors):
            return _int4_call(kernel, tensors, params, target)
        kwargs = tk.op_kwargs(params)
        if target is not None:
            kwargs["target"] = target
        if torch.compiler.is_compiling():
            outs = overload(*tensors, **kwargs)
        else:
            torchax_env = _check_call(kernel, tensors, params)
            target_op, own = overload, None
            if fwd is not None and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                # the differentiation forward: the outputs and the residuals the backward kernels read
                target_op, own = fwd.op, fwd.own_outputs(tensors, kwargs)
            if torchax_env is not None and not torchax_env.enabled:
                with torchax_env:
                    outs = target_op(*tensors, **kwargs)
            else:
                outs = target_op(*tensors, **kwargs)
            outs = outs[:own] if own is not None else outs
        if tk.mutated:  # the op wrote these inputs and returns nothing else
            outs = [tensors[i] for i in tk.mutated]
        return outs[0] if len(outs) == 1 else tuple(outs)

    call.__name__ = call.__qualname__ = kernel.name
    call.__doc__ = kernel.__doc__
    call.__signature__ = kernel.__signature__  # type: ignore[attr-defined]
    call.kernel = kernel  # type: ignore[attr-defined]
    call.op = overload  # type: ignore[attr-defined]
    return cast(TorchOp, call)


def _check_call(kernel: Kernel, tensors: Sequence[Any], params: dict[str, Any]) -> Any:
    """The eager call's checks; the torchax environment of its tensors (None for CPU tensors)."""
    kernel._check_arity(tensors)
    kernel.canonical_params(params)  # unknown / missing / mistyped static parameters fail here (Rust's verdict)
    for i, t in enumerate(tensors):
        _refuse_torch_int4(t, i, kernel.name)
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"{kernel.name}(): argument {i} ({kernel.inputs[i]}) is a {type(t).__name__}, "
                              f"expected a torch tensor (a torchax tensor or a CPU tensor)",
                              argument=kernel.inputs[i], kernel=kernel.name)
        if not _is_torchax(t) and t.device.type != "cpu":
            raise KernelError(f"{kernel.name}(): argument {i} ({kernel.inputs[i]}) is on device {t.device}; "
                              f"pass CPU tensors or torchax tensors (torchax.default_env().to_xla(t))",
                              argument=kernel.inputs[i], kernel=kernel.name)
    kinds = {_is_torchax(t) for t in tensors}
    if len(kinds) > 1:
        raise KernelError(f"{kernel.name}(): mixes torchax tensors and plain CPU tensors; move them all "
                          f"with torchax.default_env().to_xla(t) or keep them all on the CPU",
                          kernel=kernel.name)
    if torch.is_grad_enabled() and not kernel.grad and any(t.requires_grad for t in tensors):
        raise KernelError(f"{kernel.name}(): an input requires grad but the kernel declares no "
                          f"backward kernels (Rust: #[export(grad(...))])", kernel=kernel.name)
    if kinds == {True}:
        return getattr(tensors[0], "_env", None) or torchax.default_env()
    return None


class _Ops:
    """A library's kernels as torch ops, by attribute (`ops(lib).matmul`)."""

    def __init__(self, library: Library):
        self.library = library
        self._ops = {name: op(k) for name, k in library.kernels.items()}

    def __getattr__(self, name: str) -> Callable[..., Any]:
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


# Every library loaded, now or later, gets its torch ops (`torch.ops.tpu_kernel_{lib}.{name}`).
_ops.on_load()


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

    `kernel` is the op to run (any loaded library's torch op taking `(x [rows, dim], w [1, dim], *,
    eps, block_rows)`, e.g. `tkt.ops(lib).rmsnorm`); by default the examples' `rmsnorm`.

    With `mesh` (a `jax.sharding.Mesh`), the kernel runs per shard inside `jax.shard_map`: rows split
    over `data_axis`, the weight replicated (torchax tensors only; forward only)."""

    def __init__(self, dim: int, eps: float = 1e-6, block_rows: int = 16, *, mesh: Any = None,
                 data_axis: str = "x", kernel: TorchOp | Kernel | None = None):
        super().__init__()
        self.kernel = _layer_kernel(kernel, "rmsnorm", "kernel")
        self.dim, self.eps, self.block_rows = dim, eps, block_rows
        self.mesh, self.data_axis = mesh, data_axis
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.dim)
        w = self.weight.reshape(1, self.dim)
        params: dict[str, Any] = dict(eps=self.eps, block_rows=self.block_rows)
        if self.mesh is None:
            y = self.kernel(rows, w, **params)
        else:
            from jax.sharding import PartitionSpec as P
            _check_sharded_input(self, x)
            k = self.kernel.kernel
            f = _shard_map(self, "rmsnorm", lambda xs, ws: k(xs, ws, **params),
                           (P(self.data_axis, None), P(None, None)), P(self.data_axis, None))
            y = interop.call_jax(f, rows, w)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        sharded = f", mesh axes {self.mesh.axis_names}, rows over {self.data_axis!r}" if self.mesh else ""
        return f"{self.dim}, eps={self.eps}, block_rows={self.block_rows}, kernel={_kernel_name(self.kernel)}{sharded}"


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
    jit reshards whatever is not.

    `kernel` is the op to run (any loaded library's torch op taking `(x [m, k], w [k, n], *, block)`);
    by default the examples' `matmul`."""

    def __init__(self, in_features: int, out_features: int, block: tuple[int, ...] = (128, 128, 128), *,
                 mesh: Any = None, parallel: str | None = None, axes: tuple[str, str] = ("x", "y"),
                 kernel: TorchOp | Kernel | None = None):
        super().__init__()
        self.kernel = _layer_kernel(kernel, "matmul", "kernel")
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
            y = self.kernel(rows, self.weight, block=self.block)
        else:
            from jax.sharding import PartitionSpec as P
            _check_sharded_input(self, x)
            k = self.kernel.kernel
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
        return (f"{self.in_features}, {self.out_features}, block={self.block}, "
                f"kernel={_kernel_name(self.kernel)}{sharded}")


class Attention(torch.nn.Module):
    """Scaled dot-product attention on the `flash_attention` kernel: `forward(q, k, v)` with q, k, v
    bf16 `[batch, heads, seq, head_dim]` (as `torch.nn.functional.scaled_dot_product_attention` takes
    them; head_dim 128, seq a multiple of the blocks) → bf16 `[batch, heads, seq, head_dim]`, softmax
    scale `1/sqrt(head_dim)`, causal or not. Differentiable in q, k and v through the Rust dK/dV and dQ
    kernels. No parameters.

    `kernel` is the op to run (any loaded library's torch op taking `(q, k, v [batch*heads, seq,
    head_dim], *, causal, block)`); by default the examples' `flash_attention`."""

    def __init__(self, causal: bool = False, block: tuple[int, int] = (128, 128), *,
                 kernel: TorchOp | Kernel | None = None):
        super().__init__()
        self.causal, self.block = bool(causal), tuple(block)
        self.kernel = _layer_kernel(kernel, "flash_attention", "kernel")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 4:
                raise KernelError(f"Attention: {name} must be [batch, heads, seq, head_dim], got shape "
                                  f"{tuple(t.shape)}", argument=name)
        batch, heads, seq, dim = q.shape
        flat = [t.reshape(-1, t.shape[2], t.shape[3]) for t in (q, k, v)]
        o = self.kernel(*flat, causal=self.causal, block=self.block)
        return o.reshape(batch, heads, seq, dim)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, block={self.block}, kernel={_kernel_name(self.kernel)}"


def _layer_kernel(kernel: TorchOp | Kernel | None, default: str, argument: str) -> TorchOp:
    """A layer's kernel: a torch op of `op()` / `ops()` (or a `tpu_kernel.Kernel`, made one), by
    default the examples' `default`."""
    if kernel is None:
        return getattr(_examples(), default)
    if isinstance(kernel, Kernel):
        return op(kernel)
    if not callable(kernel) or not isinstance(getattr(kernel, "kernel", None), Kernel):
        raise KernelError(f"{argument}={kernel!r:.80} is not a tpu_kernel torch op; pass one of "
                          f"tpu_kernel.torch.ops(library) (e.g. tpu_kernel.torch.examples.{default}) or a "
                          f"tpu_kernel.Kernel", argument=argument)
    return kernel


def _kernel_name(kernel: TorchOp) -> str:
    k = kernel.kernel
    return f"{k.library.name}.{k.name}"

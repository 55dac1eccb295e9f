"""The one jax primitive behind every exported kernel: `tpu_kernel`.

Parameters (all hashable, so jaxprs and jax's caches can key on them):
    library  the `Library` object (identity-hashed; one per loaded file);
    kernel   the exported kernel's name;
    params   the static parameters as JSON text in Rust's canonical form (see `Kernel.canonical_params`):
             one primitive per meaning, however the caller spelled the values;
    batch    vmap levels, outermost first: ((size, (is input i batched, ...)), ...);
    target   the TPU generation the call names (`target="v6e"`, or a jax device kind), or None;
    mesh     inside `jax.shard_map`, the mesh's axes with their sizes (((name, size), ...); None
             outside): the mesh a kernel that talks to other devices is traced against (its
             `axis_index`, `axis_size` and remote device ids), as Pallas reads the axis environment.

The target (what Rust builds the kernel for: its VMEM limits, the block sizes a launch function picks
for it) is the call's when it names one; else, as Pallas finds the generation, the device kind of the
abstract mesh in scope (`jax.sharding.use_abstract_mesh`), then — when lowering — of the devices the
program is lowered for (a cross-lowering through `jax.experimental.topologies`, a shard_map's mesh),
then of the default device when it is a TPU; else the library's default (v5e).

Rules:
- abstract eval: the output shapes/dtypes of Rust's "build" answer (so every shape, dtype, tiling and
  parameter check is Rust's, and its KernelError surfaces at trace time with the Rust source line),
  for the target known at trace time;
- impl: compile-and-run the single primitive with jit (eager calls behave like jitted ones);
- CPU lowering: an XLA FFI custom call to the library's handler, whose one attribute `request` is the
  build answer's `ffi_request`: the handler rebuilds (cached) from it plus the buffer shapes, so an
  exported program runs wherever the library is loaded;
- TPU lowering: `stablehlo.custom_call @tpu_custom_call` with the "lower" answer's backend_config and
  `kernel_name` for the generation lowered for, exactly as jax lowers a Pallas kernel (api_version 1,
  row-major layouts, pure);
- batching: Pallas's rule — each vmap level becomes a new leading grid axis, and a squeezed leading
  block dimension on every batched input and every output (Rust does the rewriting from `batch`);
- JVP: none; differentiable kernels are wrapped in `jax.custom_vjp` (see `_grad`), and
  differentiating any other kernel is a KernelError naming it.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

# Private jax names (the ones jax's own tpu_custom_call lowering uses), gathered and version-checked.
from . import _jax_private as _private
from jaxlib.mlir import ir

from ._errors import KernelError

tpu_kernel_p = Primitive("tpu_kernel")
tpu_kernel_p.multiple_results = True


def bind(library: Any, kernel: str, params: str, arrays: Sequence[Any], batch: tuple = (),
         target: str | None = None) -> Any:
    """Bind the primitive (the list of outputs)."""
    return tpu_kernel_p.bind(*arrays, library=library, kernel=kernel, params=params, batch=batch,
                             target=target, mesh=manual_mesh())


def manual_mesh() -> tuple | None:
    """The mesh of the `jax.shard_map` being traced (every axis, major to minor, with its size), or
    None outside one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or not mesh.manual_axes:
        return None
    return tuple((str(n), int(s)) for n, s in zip(mesh.axis_names, mesh.axis_sizes))


# -- the target -------------------------------------------------------------------------------------

def _tpu_kind(device: Any) -> str | None:
    """A device's (or abstract device's) kind when it is a TPU."""
    if device is None or getattr(device, "platform", None) != "tpu":
        return None
    return getattr(device, "device_kind", None)


def _abstract_mesh_kind() -> str | None:
    mesh = jax.sharding.get_abstract_mesh()
    return _tpu_kind(getattr(mesh, "abstract_device", None)) if mesh is not None else None


def _default_device_kind() -> str | None:
    """The default device's kind when it is a TPU (Pallas's fallback, `pxla.get_default_device()`)."""
    try:
        return _tpu_kind(_private.get_default_device())
    except RuntimeError:  # no backend at all
        return None


def _lowering_devices_kind(ctx: Any) -> str | None:
    """The kind of the devices a program is lowered for: a shard_map's mesh, the jit's device
    assignment, else the devices of the client it is lowered with (a cross-lowering for a
    `jax.experimental.topologies` topology lowers with that topology's compile-only client)."""
    axis_context = ctx.module_context.axis_context
    kind = None
    if isinstance(axis_context, _private.SPMDAxisContext):
        kind = _tpu_kind(next(iter(axis_context.mesh.devices.flat), None))
    elif isinstance(axis_context, _private.ShardingContext):
        mesh = axis_context.abstract_mesh
        kind = (_tpu_kind(mesh.abstract_device) if mesh is not None else None) or \
            _tpu_kind((axis_context.device_assignment or (None,))[0])
    backend = ctx.module_context.backend  # the attribute: get_backend() would start a TPU client
    if kind is None and backend is not None and getattr(backend, "platform", None) == "tpu":
        kind = _tpu_kind(next(iter(backend.devices()), None))
    return kind


def trace_target(target: str | None) -> str | None:
    """The target as known while tracing: the call's, the abstract mesh's, a TPU default device's, or
    None (the library's default)."""
    return target or _abstract_mesh_kind() or _default_device_kind()


def _lowering_target(ctx: Any, target: str | None) -> str | None:
    """The target of a TPU lowering: as `trace_target`, with the devices lowered for before the
    default device."""
    return target or _abstract_mesh_kind() or _lowering_devices_kind(ctx) or _default_device_kind()


def _abstract_eval(*avals, library, kernel, params, batch, target, mesh):
    answer = library.request("build", kernel, avals, params, batch, trace_target(target), mesh)
    return [jax.core.ShapedArray(tuple(o["shape"]), library.dtypes.numpy(o["dtype"])) for o in answer["outputs"]]


tpu_kernel_p.def_abstract_eval(_abstract_eval)
tpu_kernel_p.def_impl(partial(_private.apply_primitive, tpu_kernel_p))


# -- CPU: the library's XLA FFI handler runs the interpreter on XLA's buffers ------------------------

class _Named:
    name: str

    def __init__(self, name: str):
        self.name = name


def _kernel_location(ctx: Any, kernel_name: str) -> ir.Location:
    """The op's location as jax makes it for a primitive (`name_stack/<name>` over the user's frame),
    with the Rust kernel's name in place of the primitive's: XLA names the HLO instruction after it,
    so profiler events (XProf; CPU thunks and TPU ops alike) carry the kernel's name."""
    return _private.source_info_to_location(ctx.module_context, _Named(kernel_name), ctx.name_stack,
                                         ctx.traceback)


def _aliases(answer: dict) -> dict[int, int] | None:
    """The kernel's `input_output_aliases` as XLA's operand -> result map (None when there are none)."""
    pairs = answer.get("input_output_aliases") or []
    return {int(i): int(o) for i, o in pairs} or None


def _cpu_lowering(ctx, *operands, library, kernel, params, batch, target, mesh):
    # The interpreter runs the kernel as built for the named target (else the default): no TPU here.
    answer = library.request("build", kernel, ctx.avals_in, params, batch, target, mesh)
    rule = jax.ffi.ffi_lowering(library.ffi_target, operand_output_aliases=_aliases(answer))
    request = answer["ffi_request"]
    if mesh is not None:
        request = _with_mesh_devices(request, ctx, kernel)
    with _kernel_location(ctx, answer["kernel_name"]):
        return rule(ctx, *operands, request=request)


def _with_mesh_devices(request: str, ctx: Any, kernel: str) -> str:
    """The FFI request with the ids of the shard_map mesh's devices in mesh order: each device's call
    finds its position in the mesh from them (a kernel that talks across devices runs its devices
    together, `interpret_spmd` style)."""
    import json
    axis_context = ctx.module_context.axis_context
    if not isinstance(axis_context, _private.SPMDAxisContext):
        raise KernelError(f"{kernel}: called with a mesh but lowered outside jax.shard_map", kernel=kernel)
    ids = [int(d.id) for d in axis_context.mesh.devices.flat]
    return json.dumps({**json.loads(request), "mesh_devices": ids}, separators=(",", ":"))


mlir.register_lowering(tpu_kernel_p, _cpu_lowering, platform="cpu")


# -- TPU: the Mosaic kernel as a tpu_custom_call, as Pallas emits it ---------------------------------

def _row_major(avals):
    return [tuple(range(a.ndim - 1, -1, -1)) for a in avals]


def _check_not_auto_partitioned(kernel: str, ctx: Any) -> None:
    """A Mosaic kernel sees whole per-device arrays; XLA cannot split it across devices by itself.
    Same rule (and advice) as jax's lowering of Pallas kernels."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, _private.SPMDAxisContext):
        manual = axis_context.manual_axes | set(axis_context.mesh.manual_axes)
        if axis_context.manual_axes and manual != frozenset(axis_context.mesh.axis_names):
            raise KernelError(f"{kernel}: a TPU kernel cannot be partitioned automatically over the mesh "
                              f"axes {sorted(set(axis_context.mesh.axis_names) - manual)}; call it inside a "
                              f"jax.shard_map that is manual over every mesh axis", kernel=kernel)
    elif isinstance(axis_context, _private.ShardingContext) and axis_context.num_devices != 1:
        raise KernelError(f"{kernel}: a TPU kernel cannot be partitioned automatically over "
                          f"{axis_context.num_devices} devices; call it inside jax.shard_map", kernel=kernel)


def _tpu_lowering(ctx, *operands, library, kernel, params, batch, target, mesh):
    _check_not_auto_partitioned(kernel, ctx)
    answer = library.request("lower", kernel, ctx.avals_in, params, batch, _lowering_target(ctx, target),
                             mesh)
    result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    with _kernel_location(ctx, answer["kernel_name"]):
        call = _custom_call(operands, result_types, ctx, answer)
    return call.results


def _custom_call(operands, result_types, ctx, answer):
    return _private.custom_call(
        "tpu_custom_call",
        result_types=result_types,
        operands=list(operands),
        backend_config=answer["backend_config"],
        api_version=1,
        has_side_effect=False,
        operand_layouts=_row_major(ctx.avals_in),
        result_layouts=_row_major(ctx.avals_out),
        operand_output_aliases=_aliases(answer),
        extra_attributes={"kernel_name": ir.StringAttr.get(answer["kernel_name"])},
    )


mlir.register_lowering(tpu_kernel_p, _tpu_lowering, platform="tpu")


# -- vmap ------------------------------------------------------------------------------------------

_NOT_MAPPED = None  # how jax marks an operand without a batch axis (batching.not_mapped)

def _batching_rule(axis_data, args, dims, *, library, kernel, params, batch, target, mesh):
    if all(d is _NOT_MAPPED for d in dims):
        outs = tpu_kernel_p.bind(*args, library=library, kernel=kernel, params=params, batch=batch,
                                 target=target, mesh=mesh)
        return outs, [_NOT_MAPPED] * len(outs)
    # The batch axis of every batched operand goes first (that is where the new grid axis reads it);
    # unbatched operands stay as they are and are marked so in this level.
    moved = [a if d is _NOT_MAPPED else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    level = (int(axis_data.size), tuple(d is not _NOT_MAPPED for d in dims))
    outs = tpu_kernel_p.bind(*moved, library=library, kernel=kernel, params=params, batch=(level,) + batch,
                             target=target, mesh=mesh)
    return outs, [0] * len(outs)


batching.fancy_primitive_batchers[tpu_kernel_p] = _batching_rule


# -- autodiff --------------------------------------------------------------------------------------

def _no_jvp(primals, tangents, *, library, kernel, params, batch, target, mesh):
    spec = library.kernels.get(kernel)
    why = ("it declares no backward kernels (grad: null in the library description)"
           if spec is None or not spec.grad else
           "a kernel with backward kernels is differentiable in reverse mode only (jax.grad/jax.vjp), "
           "through its jax.custom_vjp")
    raise KernelError(f"cannot differentiate kernel {kernel!r} of library {library.name!r}: {why}",
                      kind="Grad", kernel=kernel)


ad.primitive_jvps[tpu_kernel_p] = _no_jvp

"""Every kernel of a loaded library as a `torch.library` custom op: `torch.ops.tpu_kernel_{lib}.{name}`.

One op per exported kernel, defined when the library is loaded (for libraries loaded before
`tpu_kernel.torch` was imported: when it is imported). Its schema comes from the library description:

    tpu_kernel_examples::matmul(Tensor x, Tensor y, *, int[] block=[128, 128, 128], str? target=None) -> Tensor[]

- arrays are the positional tensors; static parameters keyword-only, typed from their Rust types
  (integers `int`, floats `float`, `bool`, `String` `str`, homogeneous tuples/arrays/Vecs `int[]`,
  `float[]`, `bool[]`; any other type is a `str` holding the value as JSON) with the Rust defaults;
  `target` names the TPU generation to build for, as in `tpu_kernel`;
- the result is a list of tensors (`Tensor[]`): how many outputs a kernel has is decided by its launch
  function when it is built, so the description cannot say it before a call; the Python wrappers
  (`tpu_kernel.torch.op`) return one tensor or a tuple, as the JAX ops do.

Registrations:
- fake (FakeTensor, meta, torch.compile, torch.export): output shapes and dtypes are Rust's "build"
  answer for the input shapes and dtypes (cached; the kernel is never run), so every shape, dtype and
  parameter check is Rust's and its `KernelError` names the argument at trace time;
- CPU: the JAX op on a dlpack copy of the tensors, i.e. the XLA FFI call into the library;
- torchax tensors: a `torch.library.register_torch_dispatch` rule for `torchax.tensor.Tensor`, its
  `View` and torchax's dispatch mode applies the JAX op to the tensors' jax arrays (traced into `jax_jit`
  programs, the `tpu_custom_call` on TPU);
- autograd: the export's grad rules (`#[export(grad(..))]`): the backward kernels are ops of the
  same namespace, called on the saved inputs, outputs and cotangents. A kernel's `fwd` kernel
  (flash attention's `flash_attention_fwd`: its outputs, then residuals) is differentiable by the
  same rules; the Python wrapper runs it instead of the kernel when an input requires grad, as jax's
  custom_vjp does. Differentiating the kernel's own op (`torch.ops` directly, or under tracing, where
  the wrapper calls the plain op) recomputes the residuals with the `fwd` op in the backward pass. A
  kernel without grad rules raises a `KernelError` naming it when differentiated.

A kernel whose export declares the inputs it writes (`#[export(mutates(x))]`, the library
description's `mutates`) becomes an op that mutates them (schema `Tensor(a!)`, returning nothing: the
outputs aliasing those inputs are written into them, `copy_` on CPU). Any other kernel's `input_output_aliases` stay functional (XLA copies the aliased input, as under
jax): the library description does not say which kernels alias before they are built, and an op's
mutations must be declared when it is defined.
"""
from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np
import torch
import torchax
from torchax import interop

from .. import _primitive
from .._errors import KernelError, LibraryError
from .._library import Kernel, Library

_INT = {"u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize"}
_FLOAT = {"f32", "f64"}
_SCALARS = {**{t: "int" for t in _INT}, **{t: "float" for t in _FLOAT}, "bool": "bool", "String": "str"}


def _split_tuple(inner: str) -> list[str]:
    """The element types of a Rust tuple type's inside, split at top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def schema_type(rust_type: str) -> str | None:
    """The torch schema type of a static parameter's Rust type, or None (passed as JSON text)."""
    t = rust_type.replace(" ", "")
    if t in _SCALARS:
        return _SCALARS[t]
    optional = re.fullmatch(r"Option<(.+)>", t)
    if optional:  # Python's None or a value: the inner type, optional
        inner = schema_type(optional.group(1))
        return None if inner is None or inner.endswith("?") else f"{inner}?"
    elements: list[str] = []
    m = re.fullmatch(r"\[(.+);\d+\]", t) or re.fullmatch(r"Vec<(.+)>", t)
    if m:
        elements = [m.group(1)]
    elif t.startswith("(") and t.endswith(")"):
        elements = _split_tuple(t[1:-1])
    kinds = {_SCALARS.get(e) for e in elements}
    if len(kinds) == 1 and (kind := kinds.pop()) in ("int", "float", "bool"):
        return f"{kind}[]"
    return None


def _default_text(value: Any, typ: str) -> str:
    """A default value in schema syntax."""
    if typ.endswith("?"):
        return "None" if value is None else _default_text(value, typ[:-1])
    if typ == "bool":
        return "True" if value else "False"
    if typ == "float":
        return repr(float(value))
    if typ == "int":
        return str(int(value))
    if typ.endswith("[]"):
        return "[" + ", ".join(_default_text(v, typ[:-2]) for v in value) + "]"
    return json.dumps(value)  # str (a String, or another type as JSON text)


class TorchKernel:
    """One kernel's op: its schema, the conversion of the op's static arguments back to the values
    the JAX op takes, and the OpOverload."""

    def __init__(self, namespace: str, kernel: Kernel):
        self.kernel = kernel
        self.namespace = namespace
        self.qualname = f"{namespace}::{kernel.name}"
        self.json_params: set[str] = set()  # parameters whose type the schema has no name for
        self._jitted: dict[tuple[str, str | None], Any] = {}
        #: The op this kernel is the differentiation forward of (`#[export(fwd = ..)]` of that one):
        #: its grad rules are this op's, over this op's outputs (the forward's, then residuals).
        self.differentiates: TorchKernel | None = None
        #: inputs the kernel's outputs alias, written by the op (`Tensor(a!)` in the schema)
        self.mutated = [kernel.inputs.index(n) for n in kernel.mutates]
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        args = [f"Tensor({next(letters)}!) {name}" if i in self.mutated else f"Tensor {name}"
                for i, name in enumerate(kernel.inputs)]
        kwargs: list[tuple[bool, str]] = []
        for p in kernel.params:
            typ = schema_type(p.get("type", ""))
            if typ is None:
                self.json_params.add(p["name"])
                typ = "str"
            default = f"={_default_text(p['default'], typ)}" if "default" in p else ""
            kwargs.append((default != "", f"{typ} {p['name']}{default}"))
        # Required keyword-only parameters first (schema syntax wants no default after a default).
        keywords = [text for has_default, text in sorted(kwargs, key=lambda k: k[0])]
        keywords.append("str? target=None")
        # An op that writes inputs returns nothing (torch functionalizes mutable custom ops only with
        # fixed returns; a kernel's output count is its launch's): its results are the inputs it wrote.
        returns = "()" if self.mutated else "Tensor[]"
        self.schema = f"({', '.join(args + ['*'] + keywords)}) -> {returns}"

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(getattr(torch.ops, self.namespace), self.kernel.name).default

    def op_kwargs(self, params: dict[str, Any]) -> dict[str, Any]:
        """The user's static parameters as the op's keyword arguments (JSON text where the schema
        has no type for one)."""
        return {k: (json.dumps(v) if k in self.json_params else v) for k, v in params.items()}

    def jax_params(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The op's keyword arguments back as the JAX op's static parameters, and the target."""
        params = dict(kwargs)
        target = params.pop("target", None)
        for k in self.json_params & set(params):
            params[k] = json.loads(params[k])
        return params, target

    # -- implementations -------------------------------------------------------------------------

    def run_jax(self, arrays: Sequence[Any], kwargs: dict[str, Any], *, jit: bool = False) -> list:
        """The JAX op (not differentiated: autograd is torch's) on jax arrays: the list of outputs.
        `jit`: through a `jax.jit` of the primitive made once per static parameters and target (jax's
        C++ fast path: less per-call time than binding the primitive eagerly)."""
        params, target = self.jax_params(kwargs)
        params_json = self.kernel.canonical_params(params)
        if not jit:
            return list(_primitive.bind(self.kernel.library, self.kernel.name, params_json, list(arrays),
                                        target=target))
        f = self._jitted.get((params_json, target))
        if f is None:
            library, name = self.kernel.library, self.kernel.name
            f = self._jitted[(params_json, target)] = jax.jit(
                lambda *a: _primitive.bind(library, name, params_json, a, target=target))
        return list(f(*arrays))

    def cpu(self, *tensors: torch.Tensor, **kwargs: Any) -> list[torch.Tensor] | None:
        from . import _cpu_to_host, _jax_to_cpu
        arrays = [_cpu_to_host(t) for t in tensors]
        outs = [_jax_to_cpu(a) for a in self.run_jax(arrays, kwargs, jit=True)]
        if not self.mutated:
            return outs
        for i, o in self.aliased(tensors, kwargs):
            tensors[i].copy_(outs[o])
        return None

    def aliased(self, tensors: Sequence[torch.Tensor], kwargs: dict[str, Any]) -> list[tuple[int, int]]:
        """(input, output) pairs of the built kernel's `input_output_aliases`: the inputs the op
        writes, with the output each receives. A kernel writing inputs may have no other output (its
        op returns nothing)."""
        if not self.mutated:
            return []
        params, target = self.jax_params(kwargs)
        answer = self.kernel.build(*self.avals(tensors), target=target, **params)
        pairs = [(int(i), int(o)) for i, o in answer.get("input_output_aliases") or []]
        if len(answer["outputs"]) != len(pairs):
            raise KernelError(f"{self.kernel.name}(): writes {len(pairs)} input(s) (mutates) but has "
                              f"{len(answer['outputs'])} outputs; as a torch op a kernel that writes its "
                              f"inputs returns nothing else", kernel=self.kernel.name)
        return pairs

    def avals(self, tensors: Sequence[torch.Tensor]) -> list:
        """The tensors' shapes and dtypes as jax sees them (a dynamic size is specialized)."""
        return [jax.ShapeDtypeStruct(tuple(int(d) for d in t.shape),
                                     numpy_dtype(self.kernel.library, t.dtype, self.kernel, i))
                for i, t in enumerate(tensors)]

    def fake(self, *tensors: torch.Tensor, **kwargs: Any) -> list[torch.Tensor] | None:
        if self.mutated:
            self.aliased(tensors, kwargs)  # Rust's verdict on the call, and the output check
            return None
        params, target = self.jax_params(kwargs)
        answer = self.kernel.build(*self.avals(tensors), target=target, **params)
        like = tensors[0]
        return [like.new_empty(tuple(o["shape"]), dtype=torch_dtype(self.kernel.library, o["dtype"]))
                for o in answer["outputs"]]

    def own_outputs(self, tensors: Sequence[torch.Tensor], kwargs: dict[str, Any]) -> int:
        """How many outputs the kernel this one is the differentiation forward of has (the rest of
        this one's outputs are residuals)."""
        assert self.differentiates is not None
        params, target = self.jax_params(kwargs)
        return len(self.differentiates.kernel.build(*self.avals(tensors), target=target, **params)["outputs"])

    def torchax(self, _mode_or_cls: Any, _func: Any, _types: Any, args: tuple, kwargs: dict | None) -> list | None:
        """The JAX op on torchax tensors' jax arrays; torchax tensors out."""
        arrays = [t.jax() for t in args]  # torchax Tensors and Views alike
        from . import _int8_if_int4
        outs = self.run_jax(arrays, kwargs or {})
        for i, o in self.aliased(args, kwargs or {}):
            target = args[i]
            if not isinstance(target, torchax.tensor.Tensor):
                raise KernelError(f"{self.kernel.name}(): writes its input {self.kernel.inputs[i]}, which "
                                  f"is a torchax View; pass a torchax tensor", kernel=self.kernel.name,
                                  argument=self.kernel.inputs[i])
            target._elem = outs[o]  # the input's new contents (torchax tensors hold a jax array)
        if self.mutated:
            return None
        return [interop.torch_view(_int8_if_int4(a)) for a in outs]

    # -- autograd --------------------------------------------------------------------------------

    def setup_context(self, ctx: Any, inputs: tuple, keyword_only_inputs: dict, output: list) -> None:
        ctx.save_for_backward(*inputs, *output)
        ctx.n_inputs, ctx.kwargs = len(inputs), dict(keyword_only_inputs)

    def backward(self, ctx: Any, grads: list) -> tuple:
        k = (self.differentiates or self).kernel
        if not k.grad:
            raise KernelError(f"{k.name}(): differentiated, but the kernel declares no backward kernels "
                              f"(Rust: #[export(grad(...))])", kind="Grad", kernel=k.name)
        saved = ctx.saved_tensors
        inputs, outs = list(saved[:ctx.n_inputs]), list(saved[ctx.n_inputs:])
        params, target = self.jax_params(ctx.kwargs)
        forward_params = json.loads(k.canonical_params(params))  # Rust's canonical values
        if self.differentiates is not None:  # this op's outputs: the forward's, then residuals
            grads = list(grads[:self.own_outputs(inputs, ctx.kwargs)])
        elif k.fwd:  # residuals: the differentiation forward again (torch saw the plain forward's outputs)
            outs = list(getattr(getattr(torch.ops, self.namespace), k.fwd).default(
                *inputs, **self.op_kwargs(params), target=target))
        grads = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs)]
        env: dict[str, Any] = dict(zip(k.inputs, inputs))
        env.update(zip(_names("out", len(outs)), outs))
        env.update(zip(_names("g", len(grads)), grads))
        result: dict[str, torch.Tensor] = {}
        for entry in k.grad:
            back = _BY_KERNEL[id(k.library.kernels[entry["kernel"]])]
            args = [env[a] for a in entry["args"]]
            bparams = {b: forward_params[f] for b, f in (entry.get("params") or {}).items()}
            cts = back.op(*args, **back.op_kwargs(bparams), target=target)
            result.update(zip(entry["inputs"], cts))
        return tuple(result.get(name) for name in k.inputs)


def _names(prefix: str, n: int) -> list[str]:
    return [prefix] if n == 1 else [f"{prefix}{i}" for i in range(n)]


def torch_dtype(library: Library, abi_name: str) -> torch.dtype:
    return getattr(torch, library.dtypes.torch[abi_name])


def numpy_dtype(library: Library, dtype: torch.dtype, kernel: Kernel, index: int) -> np.dtype:
    """The numpy dtype of a torch dtype, through the library's dtype table; an unsupported one is a
    KernelError naming the argument."""
    name = str(dtype).removeprefix("torch.")
    for abi, torch_name in library.dtypes.torch.items():
        if torch_name == name:
            return library.dtypes.numpy(abi)
    argument = kernel.inputs[index] if index < len(kernel.inputs) else str(index)
    raise KernelError(f"{kernel.name}(): {argument} has dtype {dtype}, which tpu_kernel kernels cannot take "
                      f"(supported: {', '.join(library.dtypes.torch.values())})", kind="DType",
                      argument=argument, kernel=kernel.name)


def namespace(library: Library) -> str:
    """The torch.ops namespace of a library: `tpu_kernel_{name}` (non-identifier characters as `_`)."""
    return "tpu_kernel_" + re.sub(r"\W", "_", library.name)


_LIBS: dict[int, tuple[torch.library.Library, dict[str, TorchKernel]]] = {}
_BY_KERNEL: dict[int, TorchKernel] = {}
_LOCK = threading.Lock()


def _torchax_classes() -> list[type]:
    return [torchax.tensor.Tensor, torchax.tensor.View, torchax.tensor.XLADispatchMode]


def register(library: Library) -> dict[str, TorchKernel]:
    """Define every kernel of `library` as a torch op (once per library; again returns the same)."""
    with _LOCK:
        if id(library) in _LIBS:
            return _LIBS[id(library)][1]
        ns = namespace(library)
        lib = torch.library.Library(ns, "DEF")
        ops: dict[str, TorchKernel] = {}
        for name, kernel in library.kernels.items():
            tk = ops[name] = TorchKernel(ns, kernel)
            try:
                lib.define(f"{name}{tk.schema}")
            except RuntimeError as e:
                raise LibraryError(f"{library.path}: kernel {name} cannot be defined as the torch op "
                                   f"{tk.qualname}{tk.schema}: {e}", path=library.path) from None
            lib.impl(name, tk.cpu, "CPU")
            torch.library.register_fake(tk.qualname, tk.fake, lib=lib)
            if not tk.mutated:  # torch differentiates no op that writes its inputs
                torch.library.register_autograd(tk.qualname, tk.backward, setup_context=tk.setup_context,
                                                lib=lib)
            for cls in _torchax_classes():
                torch.library.register_torch_dispatch(tk.qualname, cls, tk.torchax, lib=lib)
            _BY_KERNEL[id(kernel)] = tk
        for tk in ops.values():
            if tk.kernel.fwd in ops:
                ops[tk.kernel.fwd].differentiates = tk
        _LIBS[id(library)] = (lib, ops)
        return ops


def registered(library: Library) -> dict[str, TorchKernel]:
    return register(library)


def on_load(hook_target: Callable[[Library], Any] = register) -> None:
    """Register every library already loaded, and every library loaded from now on."""
    from .. import _library
    if hook_target not in _library.ON_LOAD:
        _library.ON_LOAD.append(hook_target)
    for lib in list(_library._LOADED.values()):
        hook_target(lib)

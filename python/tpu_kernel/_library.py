"""Loading a kernel library (a Rust cdylib speaking the tpu_kernel C ABI) and calling into it.

The C ABI (version 5) is five symbols:

    uint32_t       tpu_kernel_abi_version(void);
    const char*    tpu_kernel_library_json(void);          // owned by the library
    char*          tpu_kernel_call(const char* method, const char* request_json);
    void           tpu_kernel_free(char* s);               // frees what tpu_kernel_call returned
    XLA_FFI_Error* tpu_kernel_ffi(XLA_FFI_CallFrame*);     // the CPU implementation, an XLA FFI handler

Everything but the FFI handler speaks JSON text, so the boundary has no structs whose layout could
drift between the Rust and the Python side; the version number guards the meaning of the JSON. The
methods of `tpu_kernel_call`: "canonical", "build", "lower" (a kernel's static parameters, outputs and
backend_config), "host" (a host function: plain Rust the library exports beside its kernels, which a
wrapper calls with `Library.host` instead of re-implementing it), "stats", "ffi_layout".

A `Library` is loaded once per real path per process (`load()` returns the same object again) and
registers its FFI handler with XLA once: XLA's registry is process-wide and keyed by target name.
Each exported kernel is a `Kernel` callable (`lib.matmul(x, y, block=(128, 128, 128))`).

Static parameters are sent to Rust as the caller wrote them (JSON text) and Rust answers their
canonical form ("canonical": defaults filled in, each value read as its Rust type and written back,
so `eps=1` and `eps=1.0` are one form); Python never normalizes a value itself. That answer is the
`params` of the primitive and of every cache key, and it is cached per kernel by the raw JSON text,
so a repeat call does not cross the ABI.

Build and lower answers are cached in Python per (method, kernel, input shapes and dtypes, canonical
static parameters, vmap levels, TPU target): tracing the same signature again — another `jax.jit` of
a new function, a second lowering for another platform — never calls into Rust. Errors are not
cached (they are cheap, and a retry should ask again).
"""
from __future__ import annotations

import ctypes
import inspect
import json
import math
import os
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ._errors import AbiVersionError, KernelError, LibraryError

#: The C ABI version this package speaks; a library reporting another one is refused by `load()`.
ABI_VERSION = 5

_SYMBOLS = ("tpu_kernel_abi_version", "tpu_kernel_library_json", "tpu_kernel_call", "tpu_kernel_free",
            "tpu_kernel_ffi")

class DTypes:
    """The dtype map of one library: numpy/jax dtype names <-> the ABI's dtype names, read from the
    library's own dtype table (`"dtypes"` in its description: Rust's `for_each_dtype!`), so the package
    keeps no dtype list of its own. bfloat16 is ml_dtypes' (what jax uses)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]):
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
        self.to_abi: dict[str, str] = {r["numpy"]: r["name"] for r in rows}
        self.to_numpy: dict[str, np.dtype] = {r["name"]: np.dtype(r["numpy"]) for r in rows}
        self.torch: dict[str, str] = {r["name"]: r["torch"] for r in rows}

    def abi(self, dtype: Any, *, kernel: str, argument: str) -> str:
        """The ABI name of a numpy/jax dtype; a dtype the library has no row for is a KernelError naming
        the operand (Rust never sees it, so Python must say it)."""
        name = np.dtype(dtype).name
        try:
            return self.to_abi[name]
        except KeyError:
            raise KernelError(
                f"{kernel}: {argument} has dtype {name}, which tpu_kernel kernels cannot take "
                f"(supported: {', '.join(self.to_abi)})", kind="DType", argument=argument,
                kernel=kernel) from None

    def numpy(self, abi_name: str) -> np.dtype:
        """The numpy dtype of an ABI dtype name (`"bf16"` -> ml_dtypes' bfloat16)."""
        try:
            return self.to_numpy[abi_name]
        except KeyError:
            raise LibraryError(f"the library answered an unknown dtype {abi_name!r}") from None


def _scalar_json(v: Any) -> Any:
    """`json`'s `default` hook: a numpy scalar is the Python number it holds; nothing else is JSON."""
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not a JSON value")


def _nonfinite_as_text(v: Any) -> Any:
    """NaN and the infinities as the strings Rust's float parameters read ("nan", "inf", "-inf"): JSON
    has no such numbers, and Rust writes them back the same way, so they pass exactly."""
    if isinstance(v, (float, np.floating)) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, Mapping):
        return {k: _nonfinite_as_text(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_nonfinite_as_text(x) for x in v]
    return v


# One encoder for every call (json.dumps with options builds a new one each time).
_PARAMS_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_scalar_json)


def _refuse_unless_json(value: Any, *, kernel: str, name: str) -> None:
    """Static parameters go to Rust as the JSON of the values given (Rust alone decides what they
    mean); this names the parameter whose value JSON cannot carry, and why: a tracer or an array (not
    static: it could not key a cache or be compiled into a kernel), a NaN or an infinity, an object."""
    def encode(v: Any) -> Any:
        if isinstance(v, np.generic):
            return v.item()
        import jax
        if isinstance(v, jax.core.Tracer):
            raise KernelError(
                f"{kernel}: parameter {name} is a traced value ({v.aval}); static parameters must be "
                f"Python values at trace time — under jax.jit, bind them with functools.partial or mark "
                f"them static (jax.jit(f, static_argnames=...)) instead of passing them as jit arguments",
                argument=name, kernel=kernel)
        raise KernelError(
            f"{kernel}: parameter {name}={value!r:.80} is not a static value; static parameters are "
            f"Python ints, floats, bools, strings and tuples of them (arrays are passed positionally)",
            argument=name, kernel=kernel)

    try:
        json.dumps(value, allow_nan=False, default=encode)
    except (ValueError, TypeError) as e:  # a NaN or an infinity (allow_nan=False), a cycle, a bad key
        raise KernelError(f"{kernel}: parameter {name}={value!r:.80} cannot be sent to the library as "
                          f"JSON ({e}); static parameters are finite numbers, bools, strings and tuples "
                          f"of them", argument=name, kernel=kernel) from None


def _display(value: Any) -> Any:
    """JSON lists back as tuples, as a Python user writes block shapes."""
    return tuple(_display(v) for v in value) if isinstance(value, list) else value


class Kernel:
    """One exported kernel as a Python callable: arrays positionally, static parameters by keyword
    (defaults from the library), results as a jax array (or a tuple for several outputs).

    Works under `jax.jit`, `jax.vmap`, `jax.grad` (when the kernel declares backward kernels),
    `jax.shard_map` and `jax.export`; see the package docstring.
    """

    def __init__(self, library: "Library", spec: dict):
        self.library = library
        self.spec = spec
        self.name: str = spec["name"]
        self.inputs: list[str] = list(spec["inputs"])
        self.params: list[dict] = list(spec.get("params") or [])
        self.grad: list[dict] | None = spec.get("grad")
        self.fwd: str | None = spec.get("fwd")  # run instead under differentiation, residuals appended
        #: the array parameters the kernel's outputs alias (`#[export(mutates(x))]`): torch ops write them
        self.mutates: list[str] = list(spec.get("mutates") or [])
        self.__name__ = self.__qualname__ = self.name
        self.__doc__ = spec.get("doc") or f"The `{self.name}` kernel of library {library.name!r}."
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in self.inputs]
            + [inspect.Parameter(p["name"], inspect.Parameter.KEYWORD_ONLY,
                                 default=_display(p["default"]) if "default" in p else inspect.Parameter.empty)
               for p in self.params]
            + [inspect.Parameter("target", inspect.Parameter.KEYWORD_ONLY, default=None)])
        self._vjp_cache: dict[tuple[str, str | None], Any] = {}
        self._canonical: dict[str, str] = {}  # raw JSON text of the given parameters -> Rust's canonical text

    def __repr__(self) -> str:
        return f"<tpu_kernel {self.library.name}.{self.name}{self.__signature__}>"

    # -- arguments ---------------------------------------------------------------------------------

    def _argument_error(self, text: str, argument: str | None = None) -> KernelError:
        """A call mistake caught in Python, pointing at the kernel's export in Rust (the library
        description's `location`, when it has one) as Rust's own errors do."""
        loc = self.spec.get("location")
        return KernelError(f"{loc}: {text}" if loc else text, message=text, location=loc,
                           argument=argument, kernel=self.name)

    def _check_arity(self, arrays: Sequence[Any]) -> None:
        if len(arrays) != len(self.inputs):
            raise self._argument_error(
                f"{self.name}() takes {len(self.inputs)} array argument(s) ({', '.join(self.inputs)}), "
                f"got {len(arrays)}; static parameters are keyword-only "
                f"({', '.join(p['name'] for p in self.params) or 'none'})")

    def canonical_params(self, given: Mapping[str, Any]) -> str:
        """The static parameters as the JSON text the primitive carries: Rust's canonical form of the
        values given (every declared parameter, defaults filled in, each value as its Rust type
        writes it). An unknown or missing parameter, or a value of the wrong type, is Rust's
        `KernelError` naming the parameter. Asked once per spelling: the answer is cached by the raw
        JSON text of `given`."""
        try:
            raw = _PARAMS_JSON.encode(_nonfinite_as_text(given))
        except (ValueError, TypeError):  # not JSON: say which parameter, and why
            for k, v in given.items():
                _refuse_unless_json(v, kernel=self.name, name=k)
            raise
        canonical = self._canonical.get(raw)
        if canonical is None:
            answer = self.library._checked_text(
                "canonical", f'{{"kernel":{json.dumps(self.name)},"params":{raw}}}', self.name)
            canonical = self._canonical[raw] = json.dumps(answer["params"], separators=(",", ":"))
        return canonical

    # -- calling -----------------------------------------------------------------------------------

    def __call__(self, *arrays: Any, target: str | None = None, **params: Any) -> Any:
        """`target` (a TPU generation, `"v6e"`, or a jax device kind) builds the kernel for it; by
        default the TPU lowering takes the generation of the devices it lowers for (see `_primitive`)."""
        from . import _primitive, _tune
        self._check_arity(arrays)
        params = {**_tune.tuned_defaults(self, arrays, params, target), **params}
        params_json = self.canonical_params(params)
        if self.grad:
            outs = self._differentiable(params_json, target)(tuple(arrays))
        else:
            outs = _primitive.bind(self.library, self.name, params_json, arrays, target=target)
        outs = tuple(outs)
        return outs[0] if len(outs) == 1 else outs

    def _differentiable(self, params_json: str, target: str | None = None) -> Any:
        """The `jax.custom_vjp` function of this kernel at these static parameters and target (made
        once)."""
        f = self._vjp_cache.get((params_json, target))
        if f is None:
            from . import _grad
            f = self._vjp_cache[(params_json, target)] = _grad.make_vjp(self, params_json, target)
        return f

    def _avals(self, arrays: Sequence[Any]) -> list:
        """Shapes and dtypes of the arguments, as jax would see them (Python scalars, lists and numpy
        arrays included)."""
        import jax
        self._check_arity(arrays)
        return [a if hasattr(a, "shape") and hasattr(a, "dtype") else jax.typeof(a) for a in arrays]

    def build(self, *arrays: Any, target: str | None = None, **params: Any) -> dict:
        """Rust's "build" answer for these arguments (arrays or `jax.ShapeDtypeStruct`s): output
        shapes/dtypes, `kernel_name`, canonical `params`, `target`, `ffi_request`, `cost_estimate`.
        Cached."""
        from . import _primitive
        return self.library.request("build", self.name, self._avals(arrays), self.canonical_params(params), (),
                                    target, _primitive.manual_mesh())

    def lower(self, *arrays: Any, target: str | None = None, **params: Any) -> dict:
        """Rust's "lower" answer: the build answer plus the `tpu_custom_call` `backend_config`. Cached."""
        from . import _primitive
        return self.library.request("lower", self.name, self._avals(arrays), self.canonical_params(params), (),
                                    target, _primitive.manual_mesh())


class Library:
    """A loaded kernel library. Kernels are attributes (`lib.matmul`) and items (`lib["matmul"]`);
    `lib.kernels` maps every name to its `Kernel`. Use `load()` to get one."""

    def __init__(self, path: str, cdll: ctypes.CDLL, description: dict):
        self.path = path
        self._cdll = cdll
        self.description = description
        self.name: str = description["library"]
        self.ffi_target: str = description["ffi_target"]
        self.dtypes = DTypes(description["dtypes"])
        #: The TPU generations the library builds for (name, libtpu topology, jax device kinds), and
        #: the one it builds for when none is named.
        self.targets: list[dict] = list(description.get("targets") or [])
        self.default_target: str | None = description.get("default_target")
        self.abi_version: int = description.get("abi_version", ABI_VERSION)
        self._lock = threading.Lock()
        self._cache: dict[tuple, dict] = {}
        self.rust_calls = 0  # every call into tpu_kernel_call, cached or not (for tests of the cache)
        self.kernels: dict[str, Kernel] = {k["name"]: Kernel(self, k) for k in description["kernels"]}

    def __repr__(self) -> str:
        return f"<tpu_kernel.Library {self.name!r} from {self.path}>"

    # Identity semantics: one object per loaded library, so it can be a (hashable) primitive parameter.
    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("kernels")
        if kernels is not None and name in kernels:
            return kernels[name]
        raise AttributeError(f"library {self.__dict__.get('name', '?')!r} has no kernel or attribute {name!r}"
                             + (f"; its kernels: {', '.join(kernels)}" if kernels else ""))

    def __getitem__(self, name: str) -> Kernel:
        return self.kernels[name]

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.kernels))

    # -- the C ABI -------------------------------------------------------------------------------

    def call(self, method: str, request: dict) -> dict:
        """One `tpu_kernel_call(method, request)`: the parsed JSON answer, successful or not (no
        cache, no raising on `ok: false`): the raw protocol, for tools and tests."""
        return self._call_text(method, json.dumps(request, separators=(",", ":")))

    def _call_text(self, method: str, request: str) -> dict:
        raw = self._cdll.tpu_kernel_call(method.encode(), request.encode())
        if not raw:
            raise LibraryError(f"{self.path}: tpu_kernel_call({method!r}) returned NULL", path=self.path)
        self.rust_calls += 1
        try:
            text = ctypes.string_at(raw).decode("utf-8")
        finally:
            self._cdll.tpu_kernel_free(raw)
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise LibraryError(f"{self.path}: tpu_kernel_call({method!r}) answered non-JSON text "
                               f"({e}): {text[:200]!r}", path=self.path) from None

    def _checked(self, method: str, request: dict, kernel: str | None = None) -> dict:
        return self._checked_text(method, json.dumps(request, separators=(",", ":")), kernel)

    def _checked_text(self, method: str, request: str, kernel: str | None = None) -> dict:
        answer = self._call_text(method, request)
        if not answer.get("ok"):
            error = answer.get("error")
            if not isinstance(error, dict):
                raise LibraryError(f"{self.path}: malformed failure answer to {method!r}: {answer!r:.300}",
                                   path=self.path)
            raise KernelError.from_rust(error, kernel=kernel)
        return answer

    def request(self, method: str, kernel: str, arrays: Sequence[Any], params_json: str,
                batch: tuple, target: str | None = None, mesh: tuple | None = None) -> dict:
        """The cached "build"/"lower" answer for a kernel signature. `arrays` may be arrays, tracers,
        avals or ShapeDtypeStructs: only `.shape` and `.dtype` are read. `target` (a generation's name
        or a jax device kind; None: the library's default) is what the kernel is built for; `mesh`
        (((axis, size), ...) inside a `jax.shard_map`, else None) the mesh it runs over."""
        shapes = tuple(tuple(int(d) for d in a.shape) for a in arrays)
        dtypes = tuple(self.dtypes.abi(a.dtype, kernel=kernel, argument=f"input {i}")
                       for i, a in enumerate(arrays))
        key = (method, kernel, shapes, dtypes, params_json, batch, target, mesh)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        req = {"kernel": kernel,
               "inputs": [{"shape": list(s), "dtype": d} for s, d in zip(shapes, dtypes)],
               "params": json.loads(params_json),
               "batch": [[size, list(flags)] for size, flags in batch]}
        if target is not None:
            req["target"] = target
        if mesh is not None:
            req["mesh"] = [[name, size] for name, size in mesh]
        answer = self._checked(method, req, kernel)
        with self._lock:
            self._cache[key] = answer
        return answer

    def host(self, function: str, *args: Any) -> Any:
        """Call the library's host function `function` (`export_library!(.., host = [..])`) on `args`
        — JSON values: numbers, bools, strings, lists; numpy scalars and arrays are sent as the numbers
        and (nested) lists they hold — and return its result as JSON data (tuples and Vecs as lists).
        Rust checks the arguments against the function's types; a mistake is its `KernelError`."""
        def encode(v: Any) -> Any:
            if isinstance(v, (np.generic, np.ndarray)):
                return v.tolist()
            raise TypeError(f"{type(v).__name__} is not a JSON value")

        try:
            request = json.dumps({"function": function, "args": args}, separators=(",", ":"),
                                 allow_nan=False, default=encode)
        except (ValueError, TypeError) as e:
            raise KernelError(f"host function {function}: arguments {args!r:.120} cannot be sent to the "
                              f"library as JSON ({e})", kind="Argument") from None
        return self._checked_text("host", request)["result"]

    def stats(self) -> dict:
        """Rust's counters of cache misses: `{"builds", "lowerings", "ffi_builds"}`."""
        answer = self._checked("stats", {})
        return {k: v for k, v in answer.items() if k != "ok"}

    def export_safety_checks(self) -> list:
        """What `jax.export.export(..., disabled_checks=...)` needs for programs using this library.

        jax.export refuses custom calls outside its list of targets with a stability guarantee;
        `tpu_custom_call` is on it, our CPU FFI target is not. The exported program stays usable in
        any process that has loaded (and so registered) this library before calling it:

            exp = jax.export.export(jax.jit(f), platforms=["cpu", "tpu"],
                                    disabled_checks=lib.export_safety_checks())(*args)
        """
        import jax
        return [jax.export.DisabledSafetyCheck.custom_call(self.ffi_target)]


_LOADED: dict[str, Library] = {}
#: Called with every newly loaded `Library` (`tpu_kernel.torch` adds the one defining its torch ops),
#: so a package that never imports torch never pays for it.
ON_LOAD: list[Callable[[Library], Any]] = []
_FFI_TARGETS: dict[str, str] = {}  # ffi target -> path of the library that registered it
_LOAD_LOCK = threading.Lock()


def _symbols(cdll: ctypes.CDLL, path: str) -> None:
    missing = [s for s in _SYMBOLS if not hasattr(cdll, s)]
    if missing:
        raise LibraryError(
            f"{path}: not a tpu_kernel library: missing symbol(s) {', '.join(missing)} "
            f"(a kernel library exports {', '.join(_SYMBOLS)})", path=path)
    cdll.tpu_kernel_library_json.restype = ctypes.c_char_p
    cdll.tpu_kernel_library_json.argtypes = []
    cdll.tpu_kernel_call.restype = ctypes.c_void_p  # not c_char_p: we must free the very pointer
    cdll.tpu_kernel_call.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    cdll.tpu_kernel_free.restype = None
    cdll.tpu_kernel_free.argtypes = [ctypes.c_void_p]


def _register_ffi(lib: Library) -> None:
    """Register the library's FFI handler for XLA:CPU under its target name, once per process."""
    import jax
    owner = _FFI_TARGETS.get(lib.ffi_target)
    if owner is not None:
        if owner != lib.path:
            raise LibraryError(
                f"{lib.path}: FFI target {lib.ffi_target!r} is already registered in this process by "
                f"{owner}; XLA's registry is process-wide, so two libraries cannot share a target name",
                path=lib.path)
        return
    jax.ffi.register_ffi_target(lib.ffi_target, jax.ffi.pycapsule(lib._cdll.tpu_kernel_ffi),
                                platform="cpu", api_version=1)
    _FFI_TARGETS[lib.ffi_target] = lib.path


def _check_elf(path: str) -> None:
    """Refuse a file the system loader would crash on (SIGBUS on a truncated library: it maps pages
    past the end of the file) or could not load: an ELF shared object whose headers, program headers,
    loaded segments and section headers all lie within the file."""
    import struct

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(64)

        def refuse(why: str) -> LibraryError:
            return LibraryError(f"{path}: not a loadable shared library ({why}); rebuild it with cargo",
                                path=path)

        if len(head) < 64 or head[:4] != b"\x7fELF":
            raise refuse("no ELF header")
        if head[4] != 2 or head[5] != 1:
            raise refuse("not a 64-bit little-endian ELF file")
        e_type, = struct.unpack_from("<H", head, 16)
        if e_type != 3:  # ET_DYN
            raise refuse(f"ELF type {e_type}, not a shared object")
        phoff, shoff = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
            raise refuse(f"truncated: its headers reach past its {size} bytes")
        f.seek(phoff)
        table = f.read(phnum * phentsize)
        for i in range(phnum):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD
                raise refuse(f"truncated: segment {i} ends at byte {p_offset + p_filesz} of {size}")


def load(path: str | os.PathLike) -> Library:
    """Load a kernel library (a cdylib built from a crate exporting tpu_kernel kernels).

    Checks `tpu_kernel_abi_version()` before calling anything else (`AbiVersionError` on a mismatch),
    checks the other symbols (`LibraryError`), reads the library description, and registers the CPU
    FFI handler with XLA. Loading the same file again returns the same `Library`.
    """
    path = os.path.realpath(os.fspath(path))
    with _LOAD_LOCK:
        if path in _LOADED:
            return _LOADED[path]
        if not os.path.isfile(path):
            raise LibraryError(f"{path}: no such file (a tpu_kernel library is a .so built by cargo)", path=path)
        _check_elf(path)
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryError(f"{path}: cannot be loaded: {e}", path=path) from None
        if not hasattr(cdll, "tpu_kernel_abi_version"):
            raise LibraryError(f"{path}: not a tpu_kernel library: no tpu_kernel_abi_version symbol", path=path)
        cdll.tpu_kernel_abi_version.restype = ctypes.c_uint32
        cdll.tpu_kernel_abi_version.argtypes = []
        found = int(cdll.tpu_kernel_abi_version())
        if found != ABI_VERSION:
            raise AbiVersionError(path, found, ABI_VERSION)
        _symbols(cdll, path)
        raw = cdll.tpu_kernel_library_json()
        try:
            description: Any = json.loads(raw.decode("utf-8")) if raw else None
            if isinstance(description, dict) and description.get("problems"):
                raise LibraryError(f"{path}: the library reports problems:\n  "
                                   + "\n  ".join(map(str, description["problems"])), path=path)
            for key in ("library", "ffi_target", "kernels"):
                description[key]  # noqa: B018  (presence check)
        except (ValueError, TypeError, KeyError) as e:
            raise LibraryError(f"{path}: tpu_kernel_library_json() is not a library description ({e!r})",
                               path=path) from None
        if description.get("abi_version", ABI_VERSION) != ABI_VERSION:
            raise AbiVersionError(path, description["abi_version"], ABI_VERSION)
        rows = description.get("dtypes")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and {"name", "numpy", "torch"} <= set(r)
                                                 for r in rows):
            raise LibraryError(f"{path}: the library description has no dtype table (\"dtypes\")", path=path)
        lib = Library(path, cdll, description)
        _register_ffi(lib)
        _LOADED[path] = lib
        for hook in ON_LOAD:
            hook(lib)
        return lib

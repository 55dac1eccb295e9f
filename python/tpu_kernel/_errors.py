"""The exceptions of `tpu_kernel`.

A Rust `KernelError` crosses the library boundary as JSON (`{"kind", "message", "location", "argument",
"text"}`) and becomes a `KernelError` here whose `str()` is the Rust `text`: the same words, and the
`file.rs:line:col` of the Rust line that caused it, that a Rust user sees. Mistakes that Python sees
before asking Rust (a wrong number of arrays, a static parameter JSON cannot carry — a tracer, an
array) are `KernelError`s too, with kind `"Argument"`, located at the kernel's export in Rust (from
the library description), so one `except tpu_kernel.KernelError` covers every misuse of a kernel.
"""
from __future__ import annotations


class KernelError(Exception):
    """A kernel could not be built, lowered or called with these arguments.

    Attributes:
        kind: the Rust error kind (`"Shape"`, `"DType"`, `"Tiling"`, `"Param"`, ...), or `"Argument"`
            for a call mistake caught in Python, `"Abi"`/`"Library"` for a library that cannot be used.
        message: the message alone, without the location.
        location: `"path/file.rs:line:col"` of the Rust line responsible, or None.
        argument: which operand or parameter is at fault (`"input 0"`, `"block"`), or None.
        kernel: the exported kernel's name when known.
    """

    def __init__(self, text: str, *, kind: str = "Argument", message: str | None = None,
                 location: str | None = None, argument: str | None = None, kernel: str | None = None):
        super().__init__(text)
        self.text = text
        self.kind = kind
        self.message = message if message is not None else text
        self.location = location
        self.argument = argument
        self.kernel = kernel

    def __str__(self) -> str:
        return self.text

    @classmethod
    def from_rust(cls, error: dict, kernel: str | None = None) -> "KernelError":
        """The error object of a failed Rust response (`{"ok": false, "error": {...}}`)."""
        message = str(error.get("message", ""))
        location = error.get("location")
        text = error.get("text") or (f"{message} (at {location})" if location else message)
        return cls(text, kind=str(error.get("kind", "Rust")), message=message, location=location,
                   argument=error.get("argument"), kernel=kernel)


class LibraryError(KernelError):
    """A shared library is not a usable tpu_kernel library (cannot be loaded, lacks a symbol, answers
    something that is not the documented JSON)."""

    def __init__(self, text: str, *, path: str | None = None):
        super().__init__(text, kind="Library")
        self.path = path


class AbiVersionError(LibraryError):
    """The library was built for another version of the C ABI than this package speaks.

    Raised by `load()` after calling only `tpu_kernel_abi_version()`: nothing else is called in a library
    whose ABI is not ours, since its other symbols may take different arguments.
    """

    def __init__(self, path: str, found: int, expected: int):
        super().__init__(
            f"{path}: built for tpu_kernel C ABI version {found}, but this tpu_kernel Python package "
            f"speaks ABI version {expected}; rebuild the library against a tpu-kernel crate of the same "
            f"release as the Python package (or install the matching package)", path=path)
        self.kind = "Abi"
        self.found = found
        self.expected = expected

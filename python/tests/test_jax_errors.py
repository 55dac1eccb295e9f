"""Bad input at the Python/Rust boundary: each mistake is a Python exception carrying the Rust message
(and, where Rust has one, the Rust source line), never a crash. One test per kind of mistake."""
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpu_kernel
import tpu_kernel.examples as ex
from conftest import REPO

f32, bf16 = jnp.float32, jnp.bfloat16
LOCATION = re.compile(r"([\w./-]+\.rs):(\d+):(\d+)")


def rust_error(excinfo, kind=None):
    """The KernelError raised, checked to carry the Rust text: its message, and a location naming a
    real line of a real .rs file of this repository."""
    e = excinfo.value
    assert isinstance(e, tpu_kernel.KernelError)
    assert str(e) == e.text and e.message and e.message in str(e)
    if kind is not None:
        assert e.kind == kind, (e.kind, str(e))
    assert e.location, f"no Rust location in: {e}"
    m = LOCATION.fullmatch(e.location)
    assert m, e.location
    assert e.location in str(e)
    path = REPO / m.group(1)
    assert path.is_file(), f"{path} (from {e.location}) does not exist"
    assert int(m.group(2)) <= len(path.read_text().splitlines())
    return e


def test_wrong_rank():
    with pytest.raises(tpu_kernel.KernelError) as e:
        jax.jit(ex.softmax)(jnp.zeros((8, 16, 128), f32))
    e = rust_error(e)
    assert "rank" in e.message.lower() or "dimension" in e.message.lower(), e.message


def test_wrong_dtype():
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.matmul(jnp.zeros((128, 128), f32), jnp.zeros((128, 128), f32))
    e = rust_error(e)
    assert "bf16" in str(e) and "f32" in str(e)


def test_wrong_shape():
    with pytest.raises(tpu_kernel.KernelError) as e:
        jax.jit(ex.matmul)(jnp.zeros((256, 384), bf16), jnp.zeros((512, 256), bf16))
    e = rust_error(e)
    assert "384" in str(e) and "512" in str(e)


def test_grid_that_does_not_divide():
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.softmax(jnp.zeros((1000, 128), f32), block_rows=16)
    e = rust_error(e)
    assert "1000" in str(e) and "16" in str(e)
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.matmul(jnp.zeros((500, 128), bf16), jnp.zeros((128, 128), bf16))
    assert "500" in str(rust_error(e))


def test_missing_static_parameter(user_crate):
    x = jnp.ones((8, 128), f32)
    with pytest.raises(tpu_kernel.KernelError) as e:
        user_crate.scale(x)
    e = rust_error(e, kind="Signature")  # Rust's verdict on the parameters, located at the export
    assert "`scale`" in e.message and "`factor`" in e.message and "f32" in e.message
    assert e.argument == "factor" and e.location == user_crate.kernels["scale"].spec["location"]
    # a build request without it is refused too, naming the parameter
    answer = user_crate.call("build", {"kernel": "scale", "inputs": [{"shape": [8, 128], "dtype": "f32"}],
                                       "params": {}, "batch": []})
    assert answer["ok"] is False and "factor" in answer["error"]["text"], answer
    # and with the parameter it works
    np.testing.assert_allclose(np.asarray(user_crate.scale(x, factor=2.5)), 2.5 * np.ones((8, 128)))


def test_wrong_static_parameter_type():
    x, y = jnp.zeros((128, 128), bf16), jnp.zeros((128, 128), bf16)
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.matmul(x, y, block=(128, 128))
    msg = str(e.value)
    assert "block" in msg and "3" in msg and "2" in msg, msg
    assert e.value.kind != "Argument"  # Rust's verdict, not a Python pre-check
    with pytest.raises(tpu_kernel.KernelError, match="block_rows"):
        ex.softmax(jnp.zeros((8, 128), f32), block_rows="eight")


def test_library_built_for_another_abi_version(tmp_path):
    src = tmp_path / "abi999.c"
    src.write_text(textwrap.dedent("""
        #include <stdint.h>
        #include <stdlib.h>
        uint32_t tpu_kernel_abi_version(void) { return 999; }
        /* Called only if the loader ignored the version: then the test sees the abort. */
        const char* tpu_kernel_library_json(void) { abort(); }
    """))
    so = tmp_path / "libabi999.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(tpu_kernel.AbiVersionError) as e:
        tpu_kernel.load(so)
    msg = str(e.value)
    assert "999" in msg and str(tpu_kernel.ABI_VERSION) in msg and str(so) in msg
    assert isinstance(e.value, tpu_kernel.KernelError) and e.value.found == 999


def test_library_missing_symbols(tmp_path):
    src = tmp_path / "partial.c"
    src.write_text(f"unsigned tpu_kernel_abi_version(void) {{ return {tpu_kernel.ABI_VERSION}; }}\n")
    so = tmp_path / "libpartial.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(tpu_kernel.LibraryError) as e:
        tpu_kernel.load(so)
    assert "tpu_kernel_call" in str(e.value) and "tpu_kernel_ffi" in str(e.value)
    with pytest.raises(tpu_kernel.LibraryError, match="no such file"):
        tpu_kernel.load(tmp_path / "absent.so")


def test_library_whose_exports_do_not_fit_together(tmp_path):
    """A library whose description reports problems (e.g. a gradient rule naming a kernel it does not
    export, found by Rust's `Library::new`) is refused at load with those problems."""
    src = tmp_path / "problems.c"
    src.write_text(textwrap.dedent(r"""
        #include <stdint.h>
        #include <stdlib.h>
        uint32_t tpu_kernel_abi_version(void) { return ABI; }
        const char* tpu_kernel_library_json(void) {
            return "{\"abi_version\": ABI, \"library\": \"p\", \"ffi_target\": \"tpu_kernel_p\", "
                   "\"kernels\": [], \"problems\": [\"src/lib.rs:3:8: the gradient of kernel `f` "
                   "calls `f_bwd`, which this library does not export (list it in export_library!)\"]}";
        }
        char* tpu_kernel_call(const char* m, const char* r) { abort(); }
        void tpu_kernel_free(char* s) { abort(); }
        void* tpu_kernel_ffi(void* frame) { abort(); }
    """).replace("ABI", str(tpu_kernel.ABI_VERSION)))
    so = tmp_path / "libproblems.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(tpu_kernel.LibraryError) as e:
        tpu_kernel.load(so)
    assert "calls `f_bwd`, which this library does not export" in str(e.value) and str(so) in str(e.value)


def test_a_kernel_listed_by_a_used_name_is_exported(user_crate):
    """`use elsewhere::negate;` then `export_library!(.., [negate, ..])`: the export is found through the
    imported name (it used to fail at a hidden `__tpu_kernel_export_negate`)."""
    x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
    np.testing.assert_array_equal(np.asarray(user_crate.negate(x)), -x)


def test_a_truncated_or_foreign_file_is_refused_before_the_loader_maps_it(tmp_path):
    """A truncated library used to die with SIGBUS inside the system loader (it maps pages past the
    end of the file): `load` checks the ELF headers and segments first. Each load runs in a child
    process, so a miss would show as a signal there, not take this test process down."""
    import tpu_kernel.examples as ex

    data = open(ex.library.path, "rb").read()
    cases = {f"cut{k}": data[: len(data) * k // 10] for k in (1, 5, 9)}
    cases["cut_tail"] = data[:-64]
    cases["text"] = b"not a library\n" * 8
    cases["empty"] = b""
    script = textwrap.dedent("""
        import sys, tpu_kernel
        try:
            tpu_kernel.load(sys.argv[1])
            print("LOADED")
        except tpu_kernel.LibraryError as e:
            print("REFUSED", e)
    """)
    for name, content in cases.items():
        so = tmp_path / f"lib{name}.so"
        so.write_bytes(content)
        r = subprocess.run([sys.executable, "-c", script, str(so)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert r.stdout.startswith("REFUSED") and "not a loadable shared library" in r.stdout, (name, r.stdout)


def test_error_inside_the_ffi_handler_at_run_time(user_crate):
    # bad_rows reads rows past its block with a dynamic slice: fine for 8 rows, out of bounds from 16
    f = jax.jit(lambda x: user_crate.bad_rows(x))
    jax.block_until_ready(f(jnp.ones((8, 128), f32)))
    x = jnp.ones((16, 128), f32)
    f.lower(x)  # traces and lowers fine: the bad access only happens when the kernel runs
    with pytest.raises(Exception) as e:
        jax.block_until_ready(f(x))
    assert isinstance(e.value, jax.errors.JaxRuntimeError), type(e.value)
    msg = str(e.value)
    m = LOCATION.search(msg)
    assert m and (REPO / m.group(1)).is_file(), msg
    assert "bounds" in msg.lower(), msg
    # the process is fine afterwards: XLA reported the error, nothing aborted
    np.testing.assert_allclose(np.asarray(user_crate.scale(x, factor=3.0)), 3.0 * np.ones((16, 128)))

"""The installed `tpu_kernel` package: where it comes from, the examples' public surface, the library
description, argument mistakes Python catches before Rust is asked, and the examples' host helper
`group_metadata` (Rust's, over the library ABI)."""
import inspect
import json
import os
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpu_kernel
import tpu_kernel.examples as ex
from conftest import REPO, example_names

f32, bf16 = jnp.float32, jnp.bfloat16


def test_the_installed_package_is_imported_not_the_source_tree():
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    platsite = Path(sysconfig.get_paths()["platlib"]).resolve()
    here = Path(tpu_kernel.__file__).resolve()
    assert site in here.parents or platsite in here.parents, \
        f"tpu_kernel imported from {here}, not from {site}: run `pip install .` (scripts/test.sh does)"
    assert REPO / "python" not in here.parents
    # ... and the examples library is the one shipped inside it (unless overridden on purpose).
    lib = Path(ex.library.path)
    if ex.ENV_VAR not in os.environ:
        assert lib.parent == here.parent, lib
        assert lib.name.startswith("libtpu_kernel_examples"), lib.name


def test_every_example_is_exported_with_its_pallas_surface():
    names = set(ex.__all__)
    missing = set(example_names()) - names
    assert not missing, f"examples/ kernels not exported by the examples library: {sorted(missing)}"
    assert set(ex.__all__) == set(ex.library.kernels) | set(ex.WRAPPERS)
    for name in set(ex.__all__) - set(ex.WRAPPERS):
        assert getattr(ex, name) is ex.library.kernels[name]
    for name, kernel in ex.WRAPPERS.items():  # a Python function over the kernel its example builds
        assert callable(getattr(ex, name)) and kernel in ex.library.kernels

    def surface(kernel):
        sig = inspect.signature(kernel)
        params = [(p.name, p.kind, p.default) for p in sig.parameters.values()]
        # every kernel ends with the TPU generation to build for (None: the device's, see _primitive)
        assert params[-1] == ("target", inspect.Parameter.KEYWORD_ONLY, None), params
        return params[:-1]

    P, K = inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY
    assert surface(ex.matmul) == [("x", P, inspect.Parameter.empty), ("y", P, inspect.Parameter.empty),
                                  ("block", K, (128, 128, 128))]
    assert surface(ex.softmax) == [("x", P, inspect.Parameter.empty), ("block_rows", K, 8)]
    assert surface(ex.add) == [("x", P, inspect.Parameter.empty), ("y", P, inspect.Parameter.empty),
                               ("block", K, (256, 256))]
    rms = dict((n, d) for n, _, d in surface(ex.rmsnorm))
    assert list(rms) == ["x", "w", "eps", "block_rows"]
    assert rms["block_rows"] == 16 and rms["eps"] == pytest.approx(1e-6, rel=1e-6)
    assert ex.matmul.__doc__ and "matmul" in repr(ex.matmul)


def test_library_description_follows_the_abi():
    d = ex.library.description
    assert d["abi_version"] == tpu_kernel.ABI_VERSION == 5
    assert d["library"] == "examples" and d["ffi_target"] == "tpu_kernel_examples"
    # The dtype map is the library's (Rust's dtype table), not the package's.
    assert {r["name"]: r["numpy"] for r in d["dtypes"]}["bf16"] == "bfloat16"
    assert ex.library.dtypes.to_abi == {r["numpy"]: r["name"] for r in d["dtypes"]}
    kernels = {k["name"]: k for k in d["kernels"]}
    for k in kernels.values():
        assert isinstance(k["inputs"], list) and k["inputs"], k
        for p in k["params"]:
            assert set(p) <= {"name", "type", "default"} and "type" in p, p
        for entry in k["grad"] or []:
            back = kernels[entry["kernel"]]  # the backward kernel is exported too
            assert len(entry["args"]) == len(back["inputs"]), entry
            assert set(entry["params"]) <= {p["name"] for p in back["params"]}
            assert set(entry["params"].values()) <= {p["name"] for p in k["params"]}
    # matmul and rmsnorm are differentiable in every input, each input covered exactly once
    for name in ("matmul", "rmsnorm"):
        covered = [i for e in kernels[name]["grad"] for i in e["inputs"]]
        assert sorted(covered) == sorted(kernels[name]["inputs"]), covered
    assert kernels["softmax"]["grad"] is None
    assert d["host"] == [{"name": "group_metadata", "args": ["Vec<i32>", "usize", "usize"]},
                         {"name": "rpa_default_block_sizes",
                          "args": ["String", "String", "String", "[usize; 3]", "[usize; 3]"]}]


def test_load_returns_one_library_per_file_and_registers_ffi_once():
    again = tpu_kernel.load(ex.library.path)
    assert again is ex.library
    assert ex.library.stats().keys() >= {"builds", "lowerings", "ffi_builds"}


def test_export_safety_checks_name_the_ffi_target():
    checks = ex.library.export_safety_checks()
    assert checks == [jax.export.DisabledSafetyCheck.custom_call("tpu_kernel_examples")]


def _x(shape, dtype=f32):
    return jnp.zeros(shape, dtype)


def test_wrong_number_of_arrays_names_kernel_and_inputs():
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.matmul(_x((128, 128), bf16))
    msg = str(e.value)
    assert "matmul()" in msg and "2 array" in msg and "x, y" in msg and "got 1" in msg
    assert e.value.kind == "Argument" and e.value.kernel == "matmul"


def test_unknown_keyword_names_it_and_lists_the_real_ones():
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.softmax(_x((8, 128)), block_row=8)
    msg = str(e.value)  # Rust's message, at the kernel's export
    assert "`block_row`" in msg and "`softmax`" in msg and "block_rows: usize" in msg, msg
    assert e.value.argument == "block_row" and e.value.location == ex.softmax.spec["location"]


def test_static_parameter_must_be_static():
    with pytest.raises(tpu_kernel.KernelError, match="block_rows.*not a static value"):
        ex.softmax(_x((8, 128)), block_rows=jnp.int32(8))


def test_a_static_parameter_json_cannot_carry_is_named_before_rust_is_asked():
    # (NaN and the infinities can: they travel as "nan"/"inf"/"-inf", test_jax_hostile_calls.py.)
    calls = ex.library.rust_calls
    with pytest.raises(tpu_kernel.KernelError, match="block=.*not a static value"):
        ex.add(_x((256, 256)), _x((256, 256)), block=(256, object()))
    assert ex.library.rust_calls == calls


def test_static_parameter_passed_as_a_jit_argument_says_how_to_fix_it():
    with pytest.raises(tpu_kernel.KernelError) as e:
        jax.jit(ex.softmax)(_x((8, 128)), block_rows=8)  # jit traces keyword arguments too
    assert "block_rows" in str(e.value) and "static_argnames" in str(e.value)
    out = jax.jit(ex.softmax, static_argnames="block_rows")(_x((8, 128)), block_rows=8)
    assert out.shape == (8, 128)


def test_build_and_lower_answers_for_plain_arguments():
    info = ex.add.build(np.zeros((256, 256), np.float32), np.zeros((256, 256), np.float32))
    assert info["outputs"] == [{"shape": [256, 256], "dtype": "f32"}]
    assert info["params"] == {"block": [256, 256]} and info["kernel_name"] and info["ffi_request"]
    lower = ex.add.lower(jax.ShapeDtypeStruct((256, 256), f32), jax.ShapeDtypeStruct((256, 256), f32))
    assert "custom_call_config" in json.loads(lower["backend_config"])


def test_unsupported_dtype_is_named_before_rust_is_asked():
    with pytest.raises(tpu_kernel.KernelError) as e:
        ex.softmax(np.zeros((8, 128), np.int16))  # (float16 is a row of the table now: Rust answers)
    assert "int16" in str(e.value) and "input 0" in str(e.value) and e.value.kind == "DType"


def test_kernels_are_attributes_and_items():
    assert ex.library["softmax"] is ex.library.softmax is ex.softmax
    assert "softmax" in dir(ex.library)
    with pytest.raises(AttributeError, match="no kernel or attribute 'nope'"):
        ex.library.nope  # noqa: B018


def test_numpy_inputs_work_like_jax_arrays():
    x = np.random.default_rng(0).uniform(-1, 1, (16, 128)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(ex.softmax(x)), np.asarray(jax.nn.softmax(x, axis=-1)),
                               rtol=2e-6, atol=1e-7)


# -- group_metadata: the examples library's host function ------------------------------------------

def group_metadata_reference(sizes, m, tm):
    """Plain Python from the definition: each non-empty group visits the tiles its rows touch, in
    order; `m // tm + G - 1` visits, the unused ones repeating the last."""
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    group_ids, m_tiles = [], []
    for g in range(len(sizes)):
        start, end = offsets[g], offsets[g + 1]
        for tile in range(start // tm, -(-end // tm)) if end > start else ():
            group_ids.append(g)
            m_tiles.append(tile)
    while len(group_ids) < m // tm + len(sizes) - 1:
        group_ids.append(group_ids[-1] if group_ids else 0)
        m_tiles.append(m_tiles[-1] if m_tiles else 0)
    return offsets, group_ids, m_tiles


def random_sizes(rng, groups, m):
    """`groups` sizes summing to `m`, cut at random rows: empty groups and boundaries inside tiles."""
    cuts = np.sort(rng.integers(0, m + 1, groups - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int32)
    if groups > 2:  # one empty group at least
        sizes[0] += sizes[1]
        sizes[1] = 0
    return sizes


def test_group_metadata_matches_a_plain_python_reference():
    import tpu_kernel.torch.examples as tex
    import torch
    rng = np.random.default_rng(11)
    cases = [(np.array([100, 0, 290, 122], np.int32), 512, 128), (np.zeros(3, np.int32), 0, 128),
             (np.array([512], np.int32), 512, 128), (np.array([0, 0, 512, 0], np.int32), 512, 128)]
    cases += [(random_sizes(rng, int(rng.integers(1, 9)), m), m, tm)
              for tm in (8, 128) for m in (tm, 4 * tm, 37 * tm) for _ in range(6)]
    jitted = jax.jit(ex.group_metadata, static_argnums=(1, 2))
    for sizes, m, tm in cases:
        want = [np.asarray(a, np.int32) for a in group_metadata_reference(sizes.tolist(), m, tm)]
        for got in (ex.group_metadata(sizes, m, tm), ex.group_metadata(sizes.tolist(), m, tm),
                    jitted(jnp.asarray(sizes), m, tm),  # traced sizes: through jax.pure_callback
                    tex.group_metadata(torch.from_numpy(sizes), m, tm)):
            assert len(got) == 3
            for g, w in zip(got, want):
                assert np.asarray(g).dtype == np.int32 and np.array_equal(np.asarray(g), w), (sizes, m, tm, got)
        assert all(isinstance(a, torch.Tensor) for a in tex.group_metadata(sizes, m, tm))
    # the default tile is 128 rows
    assert [a.tolist() for a in ex.group_metadata([100, 0, 290, 122], 512)] == \
        list(group_metadata_reference([100, 0, 290, 122], 512, 128))


def test_group_metadata_under_vmap_is_per_example():
    sizes = jnp.array([[100, 0, 290, 122], [0, 512, 0, 0]], jnp.int32)
    got = jax.vmap(lambda s: ex.group_metadata(s, 512))(sizes)
    for i in range(2):
        want = group_metadata_reference(sizes[i].tolist(), 512, 128)
        assert [a[i].tolist() for a in got] == list(want)


def test_group_metadata_mistakes_are_rusts_errors():
    for sizes, m, tm, message in [([100, 27], 128, 128, "sum to 127, not m = 128"),
                                  ([100, -1, 29], 128, 128, "group 1 has a negative size -1"),
                                  ([50, 50], 100, 8, "not a multiple of the row tile"),
                                  ([], 0, 128, "at least one group"),
                                  ([1.5, 126.5], 128, 128, "expected an integer")]:
        with pytest.raises(tpu_kernel.KernelError, match=message) as e:
            ex.group_metadata(sizes, m, tm)
        assert e.value.kind in ("Shape", "Signature"), e.value.kind
    # a traced call checks m and tm when it is traced
    with pytest.raises(tpu_kernel.KernelError, match="not a multiple"):
        jax.jit(ex.group_metadata, static_argnums=(1, 2))(jnp.array([50, 50], jnp.int32), 100, 8)


# -- private jax names and the supported jax range (issue 24, item 6)

def test_every_private_jax_name_resolves_in_this_jax():
    from tpu_kernel import _jax_private as private
    import importlib
    assert private.NAMES, "the list of private names is empty"
    for module, name in private.NAMES:
        assert getattr(private, name) is getattr(importlib.import_module(module), name), (module, name)


def test_no_other_module_imports_private_jax():
    package = Path(tpu_kernel.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) >= 10
    for path in sources:
        if path.name == "_jax_private.py":
            continue
        text = path.read_text()
        assert "import jax._src" not in text and "from jax._src" not in text, f"{path}: import it in _jax_private.py"


def test_an_unsupported_jax_fails_loudly_at_import():
    import subprocess
    import sys
    for version in ("0.13.0", "0.11.2"):
        code = f"import jax; jax.__version__ = {version!r}; import tpu_kernel"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "TPU_KERNEL_ALLOW_ANY_JAX"})
        assert p.returncode != 0
        assert f"tpu_kernel supports jax >= 0.12.0, < 0.13.0 (it uses private jax APIs that move between " \
               f"releases); this is jax {version}" in p.stderr, p.stderr[-2000:]
    from tpu_kernel import _jax_private as private
    private.check_version(jax.__version__)
    private.check_version("0.12.9")
    with pytest.raises(ImportError, match="TPU_KERNEL_ALLOW_ANY_JAX"):
        private.check_version("1.0")


def test_the_package_metadata_bounds_jax_as_the_module_does_and_ships_py_typed():
    from importlib.metadata import requires
    from tpu_kernel import _jax_private as private
    low, high = (".".join(map(str, v)) for v in private.SUPPORTED)
    reqs = {r.split(">")[0].split("<")[0].strip(): r for r in requires("tpu-kernel")}
    for dist in ("jax", "jaxlib"):
        assert f"<{high[:-2]}" in reqs[dist] and ">=0.12" in reqs[dist], reqs[dist]
    assert (Path(tpu_kernel.__file__).parent / "py.typed").is_file()

"""The narrow dtypes of the dtype table at the JAX and torch boundaries and in libtpu (issue 20 item 7).

- Our 8-bit float conversions (Rust's `dtype/float8.rs`, run by the interpreter behind the XLA FFI
  call) are ml_dtypes' and XLA's bit for bit: every f32 rounding edge into float8_e4m3fn/e5m2, and
  every one of the 256 patterns out of them (to f32 and bf16).
- An fp8-weight matmul and an fp8 × fp8 dot under jax.jit on CPU equal jnp's, bit for bit, on inputs
  whose products and sums are exact.
- libtpu: every launch of these kernels our build() accepts compiles for v4/v5e/v5p/v6e/tpu7x; what
  we refuse (any f16 kernel; fp8 matmuls on v4) libtpu refuses in jax's own Pallas twin
  (`probe_dtypes.py`'s kernels).
- torch: float8 tensors in and out; int4 has no torch dtype.
"""
import ml_dtypes
import numpy as np
import jax
import jax.numpy as jnp
import pytest

import tpu_kernel
import tpu_toolchain as tc
import probe_dtypes

F8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
GENERATIONS = list(tc.GENERATION_TOPOLOGIES)  # v4, v5e, v5p, v6e, tpu7x


def rounding_edges() -> np.ndarray:
    """f32 inputs at every rounding decision of both formats: each 8-bit value, the midpoints between
    neighbours (ties), one f32 ulp either side of both, overflow, NaN, infinities, signed zeros,
    subnormal ties; padded to 8-row blocks of 128."""
    vals = []
    for t in F8.values():
        v = np.arange(256, dtype=np.uint8).view(t).astype(np.float32)
        v = v[np.isfinite(v)]
        v = np.unique(v)
        mids = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
        for x in (v, mids):
            vals += [x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))]
    vals.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 464, 465, 480, 1e6, 61440,
                          57344 * 1.0625, 1e-30, -1e-30, 2.0 ** -10, 2.0 ** -17], np.float32))
    x = np.concatenate(vals).astype(np.float32)
    n = -(-x.size // 1024) * 1024
    return np.concatenate([x, np.full(n - x.size, 0.5, np.float32)]).reshape(-1, 128)


@pytest.mark.parametrize("name", list(F8))
def test_quantizing_matches_ml_dtypes_and_xla_bit_for_bit(user_crate, name):
    x = rounding_edges()
    ours = np.asarray(user_crate.quantize(x, e5m2=name == "float8_e5m2"))
    assert ours.dtype == F8[name]
    ml = x.astype(F8[name])
    xla = np.asarray(jax.jit(lambda a: a.astype(jnp.dtype(name)))(x))
    np.testing.assert_array_equal(ours.view(np.uint8), ml.view(np.uint8))
    np.testing.assert_array_equal(ours.view(np.uint8), xla.view(np.uint8))


@pytest.mark.parametrize("name", list(F8))
def test_every_pattern_dequantizes_as_ml_dtypes_and_xla(user_crate, name):
    q = np.tile(np.arange(256, dtype=np.uint8), 32).reshape(64, 128).view(F8[name])
    f, b = user_crate.dequantize(q)
    f, b = np.asarray(f), np.asarray(b)
    for want in (q.astype(np.float32), np.asarray(jax.jit(lambda a: a.astype(jnp.float32))(q))):
        np.testing.assert_array_equal(f.view(np.uint32), want.view(np.uint32))
    for want in (q.astype(ml_dtypes.bfloat16), np.asarray(jax.jit(lambda a: a.astype(jnp.bfloat16))(q))):
        np.testing.assert_array_equal(b.view(np.uint16), want.view(np.uint16))


def exact_operands(m, k, n):
    x = ((np.arange(m * k) * 5 % 9 - 4) / 4).astype(np.float32).reshape(m, k)
    w = ((np.arange(k * n) * 3 % 7 - 3) / 2).astype(np.float32).reshape(k, n)
    return x, w


def test_fp8_weight_matmul_under_jit_equals_jnp(user_crate):
    x, w = exact_operands(256, 256, 128)
    xb, wq = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.float8_e4m3fn)
    scale = (0.5 + (np.arange(128) % 4) * 0.25).astype(np.float32).reshape(1, 128)
    ours = jax.jit(user_crate.fp8_weight_matmul)(xb, wq, scale)
    want = jnp.dot(xb, wq.astype(jnp.bfloat16), preferred_element_type=jnp.float32) * scale
    np.testing.assert_array_equal(np.asarray(ours).view(np.uint32), np.asarray(want).view(np.uint32))


@pytest.mark.parametrize("name", list(F8))
def test_fp8_dot_under_jit_equals_jnp(user_crate, name):
    x, w = exact_operands(128, 256, 128)
    xq, wq = x.astype(F8[name]), w.astype(F8[name])
    ours = jax.jit(user_crate.fp8_dot)(xq, wq)
    want = jnp.dot(xq, wq, preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(ours).view(np.uint32), np.asarray(want).view(np.uint32))


def test_f16_is_refused_naming_the_dtype_the_op_and_the_generation(user_crate):
    x = np.ones((8, 128), np.float16)
    for g in GENERATIONS:
        with pytest.raises(tpu_kernel.KernelError) as e:
            user_crate.f16_to_f32.build(x, target=g)
        assert f"{g} does not compile f16 values (`load" in str(e.value), str(e.value)
    with pytest.raises(tpu_kernel.KernelError, match="does not compile f16"):
        jax.jit(user_crate.f16_to_f32)(x)


# ----------------------------------------------------------------------------------------- libtpu

def _ours(g):
    """Every narrow-dtype launch of the user crate: (name, fn, args)."""
    s = jax.ShapeDtypeStruct
    x, xb = s((256, 128), jnp.float32), s((256, 256), jnp.bfloat16)
    out = []
    for name in F8:
        q = s((256, 128), jnp.dtype(name))
        out.append((f"quantize {name}", lambda a, e=name == "float8_e5m2": user_crate_ref[0].quantize(
            a, e5m2=e, target=g), [x]))
        out.append((f"dequantize {name}", lambda a: user_crate_ref[0].dequantize(a, target=g), [q]))
        out.append((f"fp8_dot {name}", lambda a, b: user_crate_ref[0].fp8_dot(a, b, target=g),
                    [s((128, 256), jnp.dtype(name)), s((256, 128), jnp.dtype(name))]))
    out.append(("fp8_weight_matmul", lambda a, b, c: user_crate_ref[0].fp8_weight_matmul(a, b, c, target=g),
                [xb, s((256, 128), jnp.float8_e4m3fn), s((1, 128), jnp.float32)]))
    return out


user_crate_ref = [None]


@pytest.mark.parametrize("g", GENERATIONS)
def test_what_we_build_libtpu_compiles_and_what_we_refuse_it_refuses(user_crate, g):
    user_crate_ref[0] = user_crate
    compiled, refused = [], []
    for name, fn, args in _ours(g):
        kernel = getattr(user_crate, name.split()[0])
        try:
            kernel.build(*args, **({"e5m2": name.endswith("e5m2")} if name.startswith("quantize") else {}),
                         target=g)
        except tpu_kernel.KernelError as e:
            assert name.startswith("fp8_dot") and g == "v4", f"{g} {name}: {e}"
            assert f"v4 does not multiply {name.split()[1]} blocks" in str(e), str(e)
            # libtpu refuses jax's own Pallas twin there.
            fn2, args2 = probe_dtypes._case(name.split()[1], "dot")
            r = tc.compile_jax(fn2, args2, g)
            assert not r.ok and "Unsupported matmul RHS type" in r.error, r.error
            refused.append(name)
            continue
        r = tc.compile_jax(fn, args, g)
        assert r.ok, f"{g} {name}: {tc.first_line(r.error)}"
        compiled.append(name)
    assert len(compiled) == (5 if g == "v4" else 7), compiled
    # f16: we refuse every kernel (above); libtpu refuses Pallas's f16 copy and casts on this generation.
    for op in ("copy", "to_f32", "from_f32"):
        fn, args = probe_dtypes._case("f16", op)
        r = tc.compile_jax(fn, args, g)
        assert not r.ok, f"libtpu now compiles an f16 {op} on {g}: update the Target table"


# ----------------------------------------------------------------------------------------- torch

def test_float8_torch_tensors_cross_the_boundary(user_crate):
    torch = pytest.importorskip("torch")
    import tpu_kernel.torch as tkt
    q = np.tile(np.arange(256, dtype=np.uint8), 4).reshape(8, 128)
    for name in F8:
        t = torch.from_numpy(q.copy()).view(getattr(torch, name))
        f, b = tkt.op(user_crate.dequantize)(t)
        want = q.view(F8[name]).astype(np.float32)
        np.testing.assert_array_equal(f.numpy().view(np.uint32), want.view(np.uint32))
        assert b.dtype == torch.bfloat16
        back = tkt.op(user_crate.quantize)(f, e5m2=name == "float8_e5m2")
        assert back.dtype == getattr(torch, name)
        keep = ~np.isnan(want)
        np.testing.assert_array_equal(back.view(torch.uint8).numpy()[keep], q[keep])
    assert user_crate.dtypes.torch["f16"] == "float16"

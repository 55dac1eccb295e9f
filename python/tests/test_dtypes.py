"""The narrow dtypes of the dtype table at the JAX and torch boundaries and in libtpu (issue 20 item 7).

- Our 8-bit float conversions (Rust's `dtype/float8.rs`, run by the interpreter behind the XLA FFI
  call) are ml_dtypes' and XLA's bit for bit: every f32 rounding edge into float8_e4m3fn/e5m2, and
  every one of the 256 patterns out of them (to f32 and bf16).
- An fp8-weight matmul and an fp8 × fp8 dot under jax.jit on CPU equal jnp's, bit for bit, on inputs
  whose products and sums are exact.
- libtpu: every launch of these kernels our build() accepts compiles for v4/v5e/v5p/v6e/tpu7x; what
  we refuse (any f16 kernel; fp8 matmuls on v4) libtpu refuses in jax's own Pallas twin
  (`probe_dtypes.py`'s kernels).
- torch: float8 tensors in and out; int4 crosses as int8 tensors of -8..7 (torchax's mapping), a
  torch.int4 tensor is refused naming the argument.
- int4: every value and cast against ml_dtypes and XLA through the packed S4 boundary (odd element
  counts too), int4 dots, every int4 launch compiled by libtpu per generation, and the rank-1 tiling
  rule (ours refuses what libtpu refuses; the hint compiles).
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


# ------------------------------------------------------------------------------------------ int4
# XLA lays an S4 buffer out packed two per byte for a custom call on CPU (element 2i in the low
# nibble of byte i, measured: `dtype/int4.rs`); the FFI handler unpacks and packs. Odd element
# counts and blocks of a whole odd-shaped array exercise the half-used last byte.

I4 = ml_dtypes.int4


def int4_values(shape):
    return (np.arange(np.prod(shape)) * 7 % 16 - 8).astype(np.int8).reshape(shape)


@pytest.mark.parametrize("shape", [(64, 128), (3, 131), (1, 129)])
def test_every_int4_value_widens_as_ml_dtypes_and_xla(user_crate, shape):
    v = int4_values(shape)
    q = v.astype(I4)
    f, b, i, j, c = (np.asarray(o) for o in jax.jit(user_crate.from_int4)(q))
    assert c.dtype == I4 and f.dtype == np.float32 and j.dtype == np.int8
    np.testing.assert_array_equal(c.astype(np.int8), v)  # an int4 output through the packed boundary
    for ours, dt in ((f, jnp.float32), (b, jnp.bfloat16), (i, jnp.int32), (j, jnp.int8)):
        xla = np.asarray(jax.jit(lambda a, dt=dt: a.astype(dt))(q))
        ml = q.astype(xla.dtype)
        assert ours.dtype == xla.dtype
        width = {4: np.uint32, 2: np.uint16, 1: np.uint8}[xla.dtype.itemsize]
        np.testing.assert_array_equal(ours.view(width), xla.view(width))
        np.testing.assert_array_equal(ours.view(width), ml.view(width))
    assert set(v.reshape(-1).tolist()) == set(range(-8, 8)) or v.size < 16


def test_narrowing_to_int4_matches_xla(user_crate):
    ks = np.arange(-10, 11, dtype=np.float32)
    f = np.concatenate([ks, ks + 0.5, ks - 0.5, ks + 0.999, np.nextafter(ks, np.float32(np.inf)),
                        np.array([np.nan, -np.nan, np.inf, -np.inf, 1e30, -1e30, -0.0, 7.9999, -8.9999],
                                 np.float32)])
    f = np.concatenate([f, np.full(-f.size % 128, 0.25, np.float32)]).reshape(-1, 128)
    direct, via_bf16 = (np.asarray(o) for o in jax.jit(user_crate.to_int4)(f))
    want = np.asarray(jax.jit(lambda a: a.astype(jnp.int4))(f))
    want_b = np.asarray(jax.jit(lambda a: a.astype(jnp.bfloat16).astype(jnp.int4))(f))
    np.testing.assert_array_equal(direct.astype(np.int8), want.astype(np.int8))
    np.testing.assert_array_equal(via_bf16.astype(np.int8), want_b.astype(np.int8))
    n = np.concatenate([np.arange(-300, 300, dtype=np.int32),
                        np.array([2**31 - 1, -2**31, 8, 15, 16, -9, -16, -17], np.int32)])
    n = np.concatenate([n, np.zeros(-n.size % 128, np.int32)]).reshape(-1, 128)
    direct, via_i8 = (np.asarray(o) for o in jax.jit(user_crate.to_int4)(n))
    want = np.asarray(jax.jit(lambda a: a.astype(jnp.int4))(n))
    want_8 = np.asarray(jax.jit(lambda a: a.astype(jnp.int8).astype(jnp.int4))(n))
    np.testing.assert_array_equal(direct.astype(np.int8), want.astype(np.int8))  # wraps
    np.testing.assert_array_equal(via_i8.astype(np.int8), want_8.astype(np.int8))
    assert direct.astype(np.int8).reshape(-1)[300 + 9] == -7  # 9 wraps


def test_int4_dots_under_jit_equal_jnp(user_crate):
    x = int4_values((128, 256)).astype(I4)
    w = (np.arange(256 * 128) * 3 % 16 - 8).astype(np.int8).reshape(256, 128).astype(I4)
    ours = np.asarray(jax.jit(user_crate.int4_dot)(x, w))
    # (XLA:CPU cannot multiply int4 directly: "does not support custom element sizes on non-sub-byte
    # types" after its operand upcaster; jnp's dot of the int8 widenings is the same product.)
    want = np.asarray(jax.jit(lambda a, b: jnp.dot(a.astype(jnp.int8), b.astype(jnp.int8),
                                                   preferred_element_type=jnp.int32))(x, w))
    np.testing.assert_array_equal(ours, want)
    np.testing.assert_array_equal(ours, x.astype(np.int32) @ w.astype(np.int32))
    xb, _ = exact_operands(256, 256, 128)
    xb = xb.astype(ml_dtypes.bfloat16)
    scale = (0.5 + (np.arange(128) % 4) * 0.25).astype(np.float32).reshape(1, 128)
    ours = np.asarray(jax.jit(user_crate.int4_weight_matmul)(xb, w, scale))
    want = np.asarray(jnp.dot(xb, w.astype(jnp.bfloat16), preferred_element_type=jnp.float32) * scale)
    np.testing.assert_array_equal(ours.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("g", GENERATIONS)
def test_int4_launches_compile_in_libtpu_and_what_we_refuse_it_refuses(user_crate, g):
    s = jax.ShapeDtypeStruct
    q, f, n = s((256, 128), jnp.int4), s((256, 128), jnp.float32), s((256, 128), jnp.int32)
    cases = [("to_int4 f32", user_crate.to_int4, [f]), ("to_int4 i32", user_crate.to_int4, [n]),
             ("from_int4", user_crate.from_int4, [q]),
             ("int4_weight_matmul", user_crate.int4_weight_matmul,
              [s((256, 256), jnp.bfloat16), s((256, 128), jnp.int4), s((1, 128), jnp.float32)]),
             ("int4_dot", user_crate.int4_dot, [s((128, 256), jnp.int4), s((256, 128), jnp.int4)])]
    compiled = []
    for name, kernel, args in cases:
        try:
            kernel.build(*args, target=g)
        except tpu_kernel.KernelError as e:
            assert name == "int4_dot" and g == "v4", f"{g} {name}: {e}"
            assert "v4 does not multiply int4 blocks" in str(e), str(e)
            fn2, args2 = probe_dtypes._case("int4", "dot")
            r = tc.compile_jax(fn2, args2, g)
            assert not r.ok and "Unsupported matmul RHS type" in r.error, r.error
            continue
        r = tc.compile_jax(lambda *a, k=kernel: k(*a, target=g), args, g)
        assert r.ok, f"{g} {name}: {tc.first_line(r.error)}"
        compiled.append(name)
    assert len(compiled) == (4 if g == "v4" else 5), compiled
    # int4 arithmetic: refused by libtpu (ours is a type error: `i4` is not `Numeric`).
    fn, args = probe_dtypes._case("int4", "add")
    r = tc.compile_jax(fn, args, g)
    assert not r.ok and "got 'i4'" in r.error, tc.first_line(r.error)


@pytest.mark.parametrize("g", GENERATIONS)
def test_rank1_int4_tiling_is_libtpus(user_crate, g):
    s = jax.ShapeDtypeStruct
    # Ours accepts 1024-element blocks of a 3000-long array (a padded edge block): libtpu compiles them.
    user_crate.int4_copy_1d.build(s((3000,), jnp.int4), block=1024, target=g)
    r = tc.compile_jax(lambda a: user_crate.int4_copy_1d(a, block=1024, target=g), [s((3000,), jnp.int4)], g)
    assert r.ok, tc.first_line(r.error)
    # Ours refuses a whole 2000-long block, as libtpu refuses Pallas's; the hint (1024) is the case above.
    with pytest.raises(tpu_kernel.KernelError) as e:
        user_crate.int4_copy_1d.build(s((2000,), jnp.int4), block=2000, target=g)
    assert "multiple of 1024" in str(e.value) and "try 1024" in str(e.value), str(e.value)
    fn, args = probe_dtypes._tile_case("int4", "tile:2000:2000")
    r = tc.compile_jax(fn, args, g)
    assert not r.ok and "subelement masking" in r.error, tc.first_line(r.error)


def test_rank1_int4_runs_through_the_packed_boundary(user_crate):
    v = (np.arange(3001) * 5 % 16 - 8).astype(np.int8)  # odd: the last byte half used
    out = np.asarray(jax.jit(lambda a: user_crate.int4_copy_1d(a, block=1024))(v.astype(I4)))
    np.testing.assert_array_equal(out.astype(np.int8), v)


def test_int4_crosses_torch_as_int8_and_torch_int4_is_refused(user_crate):
    """torchax maps jax int4 to torch.int8 and no torch dtype to int4: int4 data crosses as int8
    tensors of -8..7 (arguments wrapped in `tkt.int4`), both for CPU and torchax tensors."""
    torch = pytest.importorskip("torch")
    import torchax
    import tpu_kernel.torch as tkt
    assert user_crate.dtypes.torch["int4"] == "int8" and user_crate.dtypes.to_abi["int4"] == "int4"
    v = int4_values((8, 128))
    x = torch.from_numpy(v.copy())
    f, b, i, j, c = tkt.op(user_crate.from_int4)(tkt.int4(x))
    assert c.dtype == torch.int8 and torch.equal(c, x) and torch.equal(i, x.to(torch.int32))
    q, _ = tkt.op(user_crate.to_int4)(torch.from_numpy(v.astype(np.float32) * 2))
    assert q.dtype == torch.int8
    np.testing.assert_array_equal(q.numpy(), np.clip(v * 2, -8, 7))
    for bad, msg in ((torch.full((8, 128), 9, dtype=torch.int8), "holds 9, outside int4's -8..7"),
                     (x.to(torch.int32), "holds int32"),
                     (torch.empty((8, 128), dtype=torch.int4), "is a torch.int4 tensor")):
        with pytest.raises(tpu_kernel.KernelError, match=msg) as e:
            tkt.op(user_crate.from_int4)(bad if bad.dtype == torch.int4 else tkt.int4(bad))
        assert e.value.argument == "0"
    env = torchax.default_env()
    with env:
        out = tkt.op(user_crate.from_int4)(tkt.int4(env.to_xla(x)))
        assert isinstance(out[4], torchax.tensor.Tensor) and out[4].jax().dtype == jnp.int8
        assert torch.equal(out[4].cpu(), x)
        with pytest.raises(tpu_kernel.KernelError, match="outside int4"):
            tkt.op(user_crate.from_int4)(tkt.int4(env.to_xla(torch.full((8, 128), -9, dtype=torch.int8))))


@pytest.mark.parametrize("g", GENERATIONS)
def test_int4_dma_windows_compile_in_libtpu(user_crate, g):
    """16-row int4 windows DMA'd from HBM (at run-time row offsets) into VMEM: libtpu compiles them."""
    s = jax.ShapeDtypeStruct((64, 256), jnp.int4)
    r = tc.compile_jax(lambda a: user_crate.int4_dma_rows(a, target=g), [s], g)
    assert r.ok, tc.first_line(r.error)


def test_int4_dma_windows_run_through_the_packed_boundary(user_crate):
    v = int4_values((64, 256))
    out = np.asarray(jax.jit(user_crate.int4_dma_rows)(v.astype(I4)))
    np.testing.assert_array_equal(out.astype(np.int8), v)


def test_int4_and_unsigned_casts_and_constants_match_xla_and_compile(user_crate):
    v = int4_values((16, 128))
    u = (np.arange(16 * 128) * 37 % 256).astype(np.uint8).reshape(16, 128)
    a, b, c, k = (np.asarray(o) for o in jax.jit(user_crate.int4_unsigned)(v.astype(I4), u))
    np.testing.assert_array_equal(a, np.asarray(jax.jit(lambda x: x.astype(jnp.uint8))(v.astype(I4))))
    np.testing.assert_array_equal(b, np.asarray(jax.jit(lambda x: x.astype(jnp.uint32))(v.astype(I4))))
    np.testing.assert_array_equal(c.astype(np.int8),
                                  np.asarray(jax.jit(lambda x: x.astype(jnp.int4))(u)).astype(np.int8))
    assert (k.astype(np.int8) == -3).all()
    s = jax.ShapeDtypeStruct
    for g in GENERATIONS:
        r = tc.compile_jax(lambda x, y, g=g: user_crate.int4_unsigned(x, y, target=g),
                           [s((16, 128), jnp.int4), s((16, 128), jnp.uint8)], g)
        assert r.ok, f"{g}: {tc.first_line(r.error)}"

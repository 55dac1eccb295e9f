"""Ref views and value bitcasts (issue 21 item 4) through the real toolchain: the kernels of
`tests/ref_views.rs` (exported by its ignored test `export_view_kernels` per generation) compile with
libtpu for v5e, v6e and tpu7x with LLO ops and scheduled bundles <= their Pallas twins' (the same
`ref.bitcast`, `ref.reshape`, `.at[i].reshape` and `pltpu.bitcast`), and Pallas's own meaning of a
bitcast (`interpret=True`) is the formula the Rust tests hold our interpreter to: consecutive rows
packed into one element, the lowest bits first."""
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpu_toolchain as tc
from conftest import REPO, compiled

S = jax.ShapeDtypeStruct
f32, bf16, u32, i32 = jnp.float32, jnp.bfloat16, jnp.uint32, jnp.int32


def _bitcast(x_ref, o_ref, n_ref, m_ref):
    o_ref[...] = x_ref.bitcast(u32)[...]
    w = pltpu.bitcast(x_ref[...], u32) + jnp.uint32(0x00010001)
    n_ref.bitcast(u32)[...] = w
    m_ref[...] = pltpu.bitcast(w, bf16)


def bitcast_twin(interpret=False):
    def f(x):
        blk = lambda r: pl.BlockSpec((r, 128), lambda i: (i, 0))
        return pl.pallas_call(
            _bitcast, grid=(2,), in_specs=[blk(16)], out_specs=[blk(8), blk(16), blk(16)],
            out_shape=[S((16, 128), u32), S((32, 128), bf16), S((32, 128), bf16)],
            interpret=interpret, name="bitcast_twin")(x)
    return f, [S((32, 128), bf16)]


def _reshape(x_ref, o_ref, s_ref):
    s_ref.at[1].reshape(2, 8, 128)[...] = x_ref[0:2]
    s_ref.at[0].reshape(2, 8, 128)[...] = x_ref[2:4]
    o_ref[...] = s_ref.reshape(32, 128)[...] + x_ref.reshape(32, 128)[...] * 2.0


def reshape_twin():
    def f(x):
        return pl.pallas_call(
            _reshape, grid=(2,), in_specs=[pl.BlockSpec((4, 8, 128), lambda i: (i, 0, 0))],
            out_specs=pl.BlockSpec((32, 128), lambda i: (i, 0)), out_shape=S((64, 128), f32),
            scratch_shapes=[pltpu.VMEM((2, 16, 128), f32)], name="reshape_twin")(x)
    return f, [S((8, 8, 128), f32)]


def _pages(idx_ref, x_hbm, o_ref, buf, sem):
    rows = x_hbm.reshape(64 * 8, 128)
    c = pltpu.make_async_copy(rows.at[pl.ds(idx_ref[0], 16)], buf, sem.at[0])
    c.start()
    c.wait()
    o_ref[...] = buf[...]


def pages_twin():
    def f(idx, x):
        return pl.pallas_call(
            _pages, out_shape=S((16, 128), f32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((16, 128), lambda i, idx: (0, 0)),
                scratch_shapes=[pltpu.VMEM((16, 128), f32), pltpu.SemaphoreType.DMA((1,))]),
            name="pages_twin")(idx, x)
    return f, [S((1,), i32), S((64, 8, 128), f32)]


def _as_ref(x_ref, o_ref):
    slot = x_ref.at[1]
    o_ref.at[0][...] = slot[...] * 2.0
    o_ref.at[1][pl.ds(8, 8)] = slot[pl.ds(0, 8)]
    o_ref.at[1][pl.ds(0, 8)] = x_ref.at[0][pl.ds(8, 8)]


def as_ref_twin():
    def f(x):
        spec = pl.BlockSpec((2, 16, 128), lambda: (0, 0, 0))
        return pl.pallas_call(_as_ref, in_specs=[spec], out_specs=spec, out_shape=S((2, 16, 128), f32),
                              name="as_ref_twin")(x)
    return f, [S((2, 16, 128), f32)]


TWINS = {"bitcast": bitcast_twin, "reshape": reshape_twin, "pages": pages_twin, "as_ref": as_ref_twin}

_exported = {}


def ours(name, generation, tmp_path_factory):
    if generation not in _exported:
        out = tmp_path_factory.mktemp(f"views_{generation}")
        env = dict(os.environ, TPU_KERNEL_VIEWS_OUT=str(out), TPU_KERNEL_VIEWS_TARGET=generation)
        p = subprocess.run(["cargo", "test", "--quiet", "--test", "ref_views", "--", "--ignored", "--exact",
                            "export_view_kernels"], cwd=REPO, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        _exported[generation] = out
    return (_exported[generation] / f"{name}.stablehlo.mlir").read_text()


@pytest.mark.parametrize("name", sorted(TWINS))
def test_compiles_with_pallas_parity(name, generation, tmp_path_factory):
    hlo = ours(name, generation, tmp_path_factory)
    fn, args = TWINS[name]()
    mine = compiled("ours", f"views:{name}", generation, lambda: tc.compile_stablehlo(hlo, generation))
    theirs = compiled("pallas", f"views:{name}", generation, lambda: tc.compile_jax(fn, args, generation))
    assert mine.ok, f"libtpu rejected {name} for {generation}:\n{mine.error}"
    assert theirs.ok, theirs.error
    [call] = tc.tpu_custom_calls(hlo)
    [pcall] = tc.tpu_custom_calls(tc.lower_jax_for_tpu(fn, args))
    assert (call["operand_types"], call["result_types"]) == (pcall["operand_types"], pcall["result_types"])
    body = tc.deserialize_body(tc.b64_body(call["config"]))
    pbody = tc.deserialize_body(tc.b64_body(pcall["config"]))
    # The same view ops as Pallas (Pallas repeats a ref's views at each use, e.g. at a copy's wait).
    for op in ("tpu.memref_bitcast", "tpu.memref_reshape", "tpu.bitcast"):
        assert 0 < body.count(op) <= pbody.count(op) or body.count(op) == pbody.count(op) == 0, \
            (op, body, pbody)
    print(f"{name} {generation}: LLO ours {mine.llo_total} / Pallas {theirs.llo_total}; "
          f"bundles ours {mine.bundles} / Pallas {theirs.bundles}")
    assert mine.llo_total <= theirs.llo_total, (mine.llo_counts, theirs.llo_counts)
    assert mine.bundles is not None and theirs.bundles is not None
    assert mine.bundles <= theirs.bundles


def _pack(x16):
    """bf16 bits [rows, 128] (uint16) -> uint32 [rows / 2, 128]: row 2r low, row 2r + 1 high."""
    lo = x16[0::2].astype(np.uint32)
    hi = x16[1::2].astype(np.uint32)
    return lo | (hi << 16)


def test_pallas_bitcast_packs_rows_lowest_bits_first():
    """Pallas's interpret mode runs the bitcast twin: its ref view, its value bitcast and its write
    through a view give the packing `tests/ref_views.rs` checks our interpreter against."""
    x = ((np.arange(32 * 128) * 0.37 - 11.0) * np.where(np.arange(32 * 128) % 3 == 0, -1.0, 1.0))
    x = jnp.asarray(x.reshape(32, 128), dtype=bf16)
    fn, _ = bitcast_twin(interpret=True)
    o, n, m = fn(x)
    x16 = np.asarray(x).view(np.uint16)
    packed = np.concatenate([_pack(x16[:16]), _pack(x16[16:])])
    np.testing.assert_array_equal(np.asarray(o), packed)
    bumped = packed + np.uint32(0x00010001)
    unpacked = np.empty((32, 128), np.uint16)
    unpacked[0::2] = (bumped & 0xFFFF).astype(np.uint16).reshape(16, 128)
    unpacked[1::2] = (bumped >> 16).astype(np.uint16).reshape(16, 128)
    np.testing.assert_array_equal(np.asarray(m).view(np.uint16), unpacked)
    np.testing.assert_array_equal(np.asarray(n).view(np.uint16), unpacked)


def _reshape_twin(src, dst, dtype):
    def k(x_hbm, o_ref, s_ref):
        s_ref[...] = jnp.zeros(src, dtype)
        o_ref[...] = jnp.zeros((8, 128), f32) + s_ref.reshape(*dst)[...].astype(f32).sum()

    def f(x):
        return pl.pallas_call(k, out_shape=S((8, 128), f32), grid=(1,),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                              scratch_shapes=[pltpu.VMEM(src, dtype)], name="reshape_case")(x)
    return f


def test_reshapes_we_accept_are_those_libtpu_compiles(tmp_path):
    """The reshape sweep of `tests/ref_views.rs` (leading dimensions folded into rows, rows unfolded,
    leading dimensions regrouped, lanes folded; f32, bf16, i8; 1 to 24 rows): every reshape `build()`
    accepts, libtpu compiles in Pallas's twin (v6e), and every one it refuses, libtpu refuses — but for
    the cases listed in `CONSERVATIVE` (libtpu compiles them; our rule is simpler, see `trace::views`)."""
    import json
    path = tmp_path / "sweep.jsonl"
    env = dict(os.environ, TPU_KERNEL_VIEWS_SWEEP=str(path))
    p = subprocess.run(["cargo", "test", "--quiet", "--test", "ref_views", "--", "--ignored", "--exact",
                        "export_reshape_sweep"], cwd=REPO, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cases = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(cases) > 50
    dtypes = {"f32": f32, "bf16": bf16, "i8": jnp.int8}
    wrong, conservative = [], []
    for src, dst, dt, ours_ok in cases:
        fn = _reshape_twin(tuple(src), tuple(dst), dtypes[dt])
        r = tc.compile_jax(fn, [S((8, 128), f32)], "v6e")
        if ours_ok and not r.ok:
            wrong.append((src, dst, dt, tc.first_line(r.error)))
        elif r.ok and not ours_ok:
            conservative.append((src, dst, dt))
    print(f"{len(cases)} reshapes; refused by us, compiled by libtpu: {conservative}")
    assert not wrong, f"accepted by us, refused by libtpu: {wrong}"
    assert sorted(map(str, conservative)) == sorted(map(str, CONSERVATIVE)), conservative


# Reshapes libtpu 0.0.51 compiles that our rule refuses (measured by the test above).
CONSERVATIVE = []

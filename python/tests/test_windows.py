"""Windows real kernels use (issue 21, items 2 and 3), judged by the real toolchain: where Pallas and
libtpu take strided windows (`pl.ds(start, size, stride)`), so that every window our trace refuses
(`tests/windows.rs`, each refusal at the user's line) is one the toolchain refuses too. The strided
example's compile and LLO / bundle parity with its Pallas twin are `test_examples.py`'s (`strided`).

Measured with jax 0.12 / libtpu 0.0.51 on v5e (the refusals are the lowering's or Mosaic's, before any
generation-specific step).
"""
import os
import subprocess

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpu_toolchain as tc
from conftest import REPO

S = jax.ShapeDtypeStruct
f32, i32 = jnp.float32, jnp.int32


def _call(kernel):
    """`kernel(n_ref, x_hbm, o_ref, buf, sem)`: an SMEM scalar, a [32, 128] f32 array in HBM, a [16, 128]
    output block, a [16, 128] VMEM buffer and a DMA semaphore."""
    def f(n, x):
        gs = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((16, 128), lambda i, n: (0, 0)),
            scratch_shapes=[pltpu.VMEM((16, 128), f32), pltpu.SemaphoreType.DMA])
        return pl.pallas_call(kernel, out_shape=S((16, 128), f32), grid_spec=gs, name="probe")(n, x)
    return f


ARGS = [S((1,), i32), S((32, 128), f32)]


def _strided_dma(n_ref, x_hbm, o_ref, buf, sem):
    c = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8, stride=2)], buf.at[pl.ds(0, 8)], sem)
    c.start()
    c.wait()
    o_ref[...] = buf[...]


def _lane_stride(n_ref, x_hbm, o_ref, buf, sem):
    o_ref[:, pl.ds(0, 64)] = buf[:, pl.ds(0, 64, stride=2)]


def _masked_strided_store(n_ref, x_hbm, o_ref, buf, sem):
    v = buf[pl.ds(0, 8, stride=2), :]
    pltpu.store(o_ref.at[pl.ds(0, 8, stride=2), :], v, mask=v > 0)


def _sublane_stride_unaligned(n_ref, x_hbm, o_ref, buf, sem):
    o_ref[pl.ds(8, 4, stride=2), :] = buf[pl.ds(1, 4, stride=3), :] * 2.0


def _wide_strided(n_ref, x_hbm, o_ref, buf, sem):
    o_ref[...] = buf[pl.ds(0, 8, stride=2), :][:, :128]


def _call_wide(kernel):
    """`_call` with a [16, 256] VMEM buffer."""
    def f(n, x):
        gs = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, n: (0, 0)),
            scratch_shapes=[pltpu.VMEM((16, 256), f32), pltpu.SemaphoreType.DMA])
        return pl.pallas_call(kernel, out_shape=S((8, 128), f32), grid_spec=gs, name="probe")(n, x)
    return f


# Our refusal (tests/windows.rs tag) -> the Pallas twin and what refuses it.
REFUSED = {
    "stride_dma": (_strided_dma, "Strided slices of references are unsupported"),
    "stride_lanes": (_lane_stride, "Stride on last dim is not 1"),
    "stride_masked": (_masked_strided_store, "masked swap with strided store"),
    "stride_wide": (_wide_strided, "The last dim size is not 128 in original base memref"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_windows_we_refuse_the_toolchain_refuses(case):
    fn, why = REFUSED[case]
    r = tc.compile_jax((_call_wide if case == "stride_wide" else _call)(fn), ARGS, "v5e")
    assert not r.ok, f"{case}: Pallas + libtpu compile what we refuse"
    assert why in r.error, r.error


@pytest.mark.parametrize("generation", ["v5e", "v6e", "tpu7x"])
def test_unaligned_sublane_strides_compile(generation):
    """Strides and starts off the (8, 128) tile along sublanes compile (what we accept)."""
    r = tc.compile_jax(_call(_sublane_stride_unaligned), ARGS, generation)
    assert r.ok, r.error


# -- run-time-sized DMA windows: `tests/windows.rs`'s `ragged_kernel` and its Pallas twin
def _ragged_kernel(meta, x_hbm, o_ref, buf, sem):
    i = pl.program_id(0)
    start, n = meta[i, 0], meta[i, 1]
    buf[...] = jnp.zeros_like(buf)
    c = pltpu.make_async_copy(x_hbm.at[pl.ds(start, n)], buf.at[pl.ds(0, n)], sem)
    c.start()
    c.wait()
    o_ref[...] = buf[...]


def ragged(meta, x):
    steps = meta.shape[0]
    gs = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(steps,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((16, 128), lambda i, meta: (i, 0)),
        scratch_shapes=[pltpu.VMEM((16, 128), f32), pltpu.SemaphoreType.DMA])
    return pl.pallas_call(_ragged_kernel, out_shape=S((steps * 16, 128), f32), grid_spec=gs,
                          name="ragged_kernel")(meta, x)


GENERATIONS = ["v5e", "v6e", "tpu7x"]
_ragged = {}


def _our_ragged(tmp_path_factory, generation):
    if "dir" not in _ragged:
        out = tmp_path_factory.mktemp("windows")
        env = dict(os.environ, TPU_KERNEL_WINDOWS_OUT=str(out), TPU_KERNEL_WINDOWS_TARGETS=",".join(GENERATIONS))
        p = subprocess.run(["cargo", "test", "--quiet", "--test", "windows", "--", "--ignored", "--exact",
                            "export_ragged"], cwd=REPO, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        _ragged["dir"] = out
    return (_ragged["dir"] / f"ragged_{generation}.mlir").read_text()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_run_time_sized_dma_compiles_with_pallas_parity(generation, tmp_path_factory):
    """libtpu compiles our run-time-sized copy; its LLO ops and scheduled bundles are at most the Pallas
    twin's (`pl.ds(start, traced_size)` on both ends)."""
    ours = tc.compile_stablehlo(_our_ragged(tmp_path_factory, generation), generation)
    pallas = tc.compile_jax(ragged, [S((4, 2), i32), S((64, 128), f32)], generation)
    assert ours.ok, ours.error
    assert pallas.ok, pallas.error
    print(f"ragged {generation}: LLO ops ours {ours.llo_total} / Pallas {pallas.llo_total}, "
          f"bundles ours {ours.bundles} / Pallas {pallas.bundles}")
    assert ours.llo_total <= pallas.llo_total
    assert ours.bundles <= pallas.bundles


def _dyn_one_end(n_ref, x_hbm, o_ref, buf, sem):
    c = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n_ref[0])], buf, sem)
    c.start()
    c.wait()
    o_ref[...] = buf[...]


def _dyn_lanes(n_ref, x_hbm, o_ref, buf, sem):
    n = n_ref[0]
    c = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 16), pl.ds(0, n)], buf.at[:, pl.ds(0, n)], sem)
    c.start()
    c.wait()
    o_ref[...] = buf[...]


def _dyn_load(n_ref, x_hbm, o_ref, buf, sem):
    o_ref[...] = buf.at[pl.ds(0, n_ref[0])][...]


REFUSED_SIZES = {
    "ragged_one_end": (_dyn_one_end, "DMA source and target shape mismatch"),
    "ragged_lanes": (_dyn_lanes, "The contiguous inner slice in the DMA transfer must be divisible by 512 bytes"),
    "ragged_load": (_dyn_load, "DShapedArray"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_SIZES))
def test_run_time_sizes_we_refuse_the_toolchain_refuses(case):
    fn, why = REFUSED_SIZES[case]
    r = tc.compile_jax(_call(fn), ARGS, "v5e")
    assert not r.ok, f"{case}: Pallas + libtpu compile what we refuse"
    assert why in r.error, r.error

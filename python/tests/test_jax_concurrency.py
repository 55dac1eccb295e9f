"""The FFI handler under jax's asynchronous dispatch, from many Python threads.

8 threads each make `TPU_KERNEL_STRESS_CALLS` calls (default 1,000) of jitted tpu_kernel ops without
waiting for them (results are checked in windows, so up to a window's worth of calls per thread are in
flight at once): a kernel every thread shares (one jitted function, one signature), kernels of their
own (another kernel, or another signature of the shared one), a call whose input is donated to the
output it aliases, and a kernel that fails at run time inside the handler. Every result must carry the
bits of the same call made alone; the failing one must raise jax's runtime error with the Rust message,
and the process must go on. `TPU_KERNEL_STRESS_CALLS=10000 pytest python/tests/test_jax_concurrency.py`
is the long run.
"""
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpu_kernel.examples as ex

THREADS = 8
CALLS = int(os.environ.get("TPU_KERNEL_STRESS_CALLS", "1000"))
WINDOW = 64  # calls in flight per thread before their results are checked

f32, bf16 = jnp.float32, jnp.bfloat16


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _ops(t, rng, user_crate):
    """Thread t's calls: (name, jitted fn, args maker, numpy check of the first result or None)."""
    x = rng.standard_normal((64, 256), dtype=np.float32)
    shared = ("softmax (shared)", _SHARED, lambda: (x,), lambda out: np.testing.assert_allclose(
        out, _softmax(x), rtol=1e-5, atol=1e-6))
    kind = t % 4
    if kind == 0:
        a, b = (rng.standard_normal((256, 256), dtype=np.float32) for _ in range(2))
        own = ("add", jax.jit(lambda a, b: ex.add(a, b, block=(128, 128))), lambda: (a, b),
               lambda out: np.testing.assert_array_equal(out, a + b))
    elif kind == 1:
        a = jnp.asarray(rng.standard_normal((128, 256)), bf16)
        b = jnp.asarray(rng.standard_normal((256, 128)), bf16)
        want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
        own = ("matmul", jax.jit(ex.matmul), lambda: (a, b),
               lambda out: np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=0.5))
    elif kind == 2:
        xr = jnp.asarray(rng.standard_normal((64, 256)), bf16)
        w = rng.standard_normal((1, 256), dtype=np.float32)
        xf = np.asarray(xr, np.float32)
        want = xf / np.sqrt((xf * xf).mean(axis=-1, keepdims=True) + 1e-6) * w
        own = ("rmsnorm", jax.jit(lambda x, w: ex.rmsnorm(x, w, block_rows=16)), lambda: (xr, w),
               lambda out: np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=2e-2))
    else:
        y = rng.standard_normal((64, 256), dtype=np.float32)
        own = ("softmax block_rows=16", jax.jit(lambda y: ex.softmax(y, block_rows=16)), lambda: (y,),
               lambda out: np.testing.assert_allclose(out, _softmax(y), rtol=1e-5, atol=1e-6))
    z = rng.standard_normal((256, 128), dtype=np.float32)
    # A fresh device array per call: donating it hands its buffer to the output it aliases.
    donated = ("inplace_scale (donated)", _DONATED, lambda: (jnp.array(z),),
               lambda out: np.testing.assert_array_equal(out, z * np.float32(3)))
    return [shared, own, donated]


_SHARED = jax.jit(ex.softmax)
_DONATED = jax.jit(ex.inplace_scale, donate_argnums=0)


def test_eight_threads_of_jitted_calls_under_async_dispatch(user_crate):
    rng = np.random.default_rng(0)
    ops = [_ops(t, np.random.default_rng(100 + t), user_crate) for t in range(THREADS)]
    # Each op alone first: its result checked against numpy, its bits kept as what every concurrent
    # call must give.
    want = [[np.asarray(jax.block_until_ready(fn(*args()))) for _, fn, args, _ in thread] for thread in ops]
    for thread, results in zip(ops, want):
        for (name, _, _, check), w in zip(thread, results):
            check(w)
    bad = jax.jit(user_crate.bad_rows)  # reads past its block at run time for 16 rows
    bad_x = jnp.ones((16, 128), f32)
    del rng
    errors = []
    failures_seen = [0] * THREADS
    start = threading.Barrier(THREADS)

    def run(t):
        try:
            pending = []
            start.wait()
            for i in range(CALLS):
                if i % 50 == 49:
                    # A run-time failure inside the handler, in the middle of the others.
                    with pytest.raises(jax.errors.JaxRuntimeError, match="bounds"):
                        jax.block_until_ready(bad(bad_x))
                    failures_seen[t] += 1
                    continue
                k = 0 if i % 4 in (0, 2) else (1 if i % 4 == 1 else 2)
                name, fn, args, _ = ops[t][k]
                pending.append((name, fn(*args()), want[t][k]))
                if len(pending) >= WINDOW or i == CALLS - 1:
                    for name, out, w in pending:
                        got = np.asarray(jax.block_until_ready(out))
                        if got.dtype != w.dtype or got.tobytes() != w.tobytes():
                            raise AssertionError(f"thread {t}, {name}: other bits than the call made alone")
                    pending.clear()
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append((t, e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        t, e = errors[0]
        raise AssertionError(f"{len(errors)} thread(s) failed; thread {t}: {e!r}") from e
    assert sum(failures_seen) == THREADS * (CALLS // 50)
    print(f"\n{THREADS} threads x {CALLS} calls in {elapsed:.1f} s")
    # The process is fine afterwards.
    np.testing.assert_array_equal(np.asarray(ex.add(jnp.ones((256, 256), f32), jnp.ones((256, 256), f32))),
                                  2 * np.ones((256, 256), np.float32))

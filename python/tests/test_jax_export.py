"""jax.export of a program using our kernels for CPU and TPU at once: serialized, deserialized and run
in a fresh Python process (which only loads the library), with the TPU half being our custom call."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpu_kernel.examples as ex
import tpu_toolchain as tc

f32, bf16 = jnp.float32, jnp.bfloat16


def program(x, y, w):
    h = ex.matmul(x, y)
    return ex.softmax(ex.rmsnorm(h, w).astype(f32) * 0.25)


def args():
    rng = np.random.default_rng(3)
    return (jnp.asarray(rng.uniform(-1, 1, (128, 256)), bf16), jnp.asarray(rng.uniform(-1, 1, (256, 384)), bf16),
            jnp.asarray(rng.uniform(0.5, 1.5, (1, 384)), f32))


def test_export_needs_the_ffi_target_allowed():
    with pytest.raises(ValueError, match="tpu_kernel_examples"):
        jax.export.export(jax.jit(program), platforms=["cpu", "tpu"])(*args())


def test_export_cpu_and_tpu_run_in_a_fresh_process(tmp_path):
    a = args()
    exp = jax.export.export(jax.jit(program), platforms=["cpu", "tpu"],
                            disabled_checks=ex.library.export_safety_checks())(*a)
    assert exp.platforms == ("cpu", "tpu")
    text = exp.mlir_module()
    assert "tpu_kernel_examples" in text  # CPU: our FFI call
    assert "tpu_custom_call" in text      # TPU: our Mosaic kernel
    h = jax.ShapeDtypeStruct((128, 384), bf16)
    for kernel, kargs in ((ex.matmul, a[:2]), (ex.rmsnorm, (h, a[2])), (ex.softmax, (jax.ShapeDtypeStruct((128, 384), f32),))):
        assert f'kernel_name = "{kernel.lower(*kargs)["kernel_name"]}"' in text

    blob = tmp_path / "program.jax"
    blob.write_bytes(exp.serialize())
    for i, v in enumerate(a):
        np.save(tmp_path / f"arg{i}.npy", np.asarray(v.astype(f32)))
    script = textwrap.dedent(f"""
        import json
        import numpy as np, jax, jax.numpy as jnp
        import tpu_kernel.examples  # loads the library: registers its FFI target in this process
        exp = jax.export.deserialize(open({str(blob)!r}, "rb").read())
        dtypes = [a.dtype for a in exp.in_avals]
        xs = [jnp.asarray(np.load({str(tmp_path)!r} + f"/arg{{i}}.npy")).astype(d) for i, d in enumerate(dtypes)]
        out = exp.call(*xs)
        np.save({str(tmp_path)!r} + "/out.npy", np.asarray(out))
        print(json.dumps({{"platforms": list(exp.platforms)}}))
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["platforms"] == ["cpu", "tpu"]
    there = np.load(tmp_path / "out.npy")
    here = np.asarray(jax.jit(program)(*a))
    np.testing.assert_array_equal(there, here)  # the same interpreter on the same inputs: same bits
    # and right, not just repeatable
    h = jnp.dot(a[0], a[1], preferred_element_type=f32).astype(bf16).astype(f32)
    n = (h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6) * a[2]).astype(bf16)
    ref = jax.nn.softmax(n.astype(f32) * 0.25, axis=-1)
    np.testing.assert_allclose(there, np.asarray(ref), rtol=3e-2, atol=1e-4)


def test_exported_tpu_half_is_the_lowered_custom_call():
    a = args()
    exp = jax.export.export(jax.jit(lambda x, y: ex.matmul(x, y)), platforms=["tpu"])(*a[:2])
    calls = tc.tpu_custom_calls(exp.mlir_module())
    assert len(calls) == 1
    lower = ex.matmul.lower(*a[:2])
    assert calls[0]["config"] == json.loads(lower["backend_config"])
    assert calls[0]["attrs"]["kernel_name"] == json.dumps(lower["kernel_name"])

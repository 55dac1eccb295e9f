"""Child process of test_ragged_paged_attention_tpu.py: ours and tpu-inference's ragged paged attention
at one small config, traced for one TPU generation and compiled by libtpu for it (one generation per
process: tpu-inference's kernel traced for one generation and compiled for another can abort libtpu).

    python rpa_tpu_worker.py <generation>   ->   one JSON line on stdout

Per case (decode, mixed): LLO ops (post-finalize-llo dump of the case's kernel) and total scheduled
bundles of its custom-call program, ours and theirs. Theirs: `ragged_paged_attention` as vLLM calls
it (jitted, queries/keys/values/kv_cache donated), its decode and mixed `pallas_call`s told apart by
their names (`RPAd-..`, `RPAm-..`). Ours: `tpu_kernel.examples.ragged_paged_attention(.., only_case=..)`
(the launch traced with that case alone), kv_cache donated. Both pay the same jnp layout preparation
outside their kernels; only the kernels are counted.
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))

import tpu_toolchain as tc  # noqa: E402  (dump directories before jax starts libtpu)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tpu_inference_rpa as tir  # noqa: E402
import tpu_kernel.examples as ex  # noqa: E402

VERSION = {"v5e": 5, "v6e": 6, "tpu7x": 7}
# The small config (a CI cost): 64 tokens, 8 query heads over 2 kv heads, head_dim 128, bf16, pages
# of 16 tokens, 4 sequences of up to 8 pages, a pool of 64 pages.
CONFIG = dict(tokens=64, heads=8, kv_heads=2, head_dim=128, page_size=16, pages_per_seq=8, seqs=4, pages=64)


def args(c=CONFIG, kv_dtype=jnp.bfloat16):
    mod = tir.kernel_module()
    S, dt, kt = jax.ShapeDtypeStruct, jnp.bfloat16, kv_dtype
    t, h, kvh, d = c["tokens"], c["heads"], c["kv_heads"], c["head_dim"]
    return [S((t, h, d), dt), S((t, kvh, d), kt), S((t, kvh, d), kt),
            S(mod.get_kv_cache_shape(c["pages"], c["page_size"], kvh, d, kt), kt),
            S((c["seqs"],), jnp.int32), S((c["seqs"] * c["pages_per_seq"],), jnp.int32),
            S((c["seqs"] + 1,), jnp.int32), S((3,), jnp.int32)]


def llo_by_kernel(before):
    """LLO op totals of the post-finalize-llo dumps written since `before`, by kernel name."""
    out = {}
    for f in sorted(set(os.listdir(tc.DUMP_DIR)) - before):
        if "post-finalize-llo" in f:
            name = f.split("mosaic-dump-", 1)[1].rsplit("-post-finalize-llo", 1)[0]
            with open(os.path.join(tc.DUMP_DIR, f)) as fh:
                out[name] = sum(tc.count_llo(fh.read()).values())
    return out


def one(programs, prefix):
    [(name, value)] = [(k, v) for k, v in programs.items() if k.startswith(prefix)]
    return value


def main(gen):
    mod = tir.kernel_module()
    a = args()
    result = {"generation": gen, "config": CONFIG, "versions": tc.VERSIONS}
    before = set(os.listdir(tc.DUMP_DIR))
    with tir.tpu_generation(mod, VERSION[gen]):
        theirs = tc.compile_jax(lambda *x: mod.ragged_paged_attention(*x), a, gen, donate_argnums=(0, 1, 2, 3))
    if not theirs.ok:
        print(json.dumps({"error": f"tpu-inference: {theirs.error}"}))
        return
    t_llo = llo_by_kernel(before)
    for case, prefix in (("decode", "RPAd"), ("mixed", "RPAm")):
        before = set(os.listdir(tc.DUMP_DIR))
        ours = tc.compile_jax(lambda *x, case=case: ex.ragged_paged_attention(*x, only_case=case), a, gen,
                              donate_argnums=(3,))
        if not ours.ok:
            print(json.dumps({"error": f"ours ({case}): {ours.error}"}))
            return
        o_llo = llo_by_kernel(before)
        result[case] = {
            "ours": {"llo": one(o_llo, "ragged_paged_attention_kernel"),
                     "bundles": one(ours.bundles_by_program, "ragged_paged_attention_kernel")},
            "theirs": {"llo": one(t_llo, prefix), "bundles": one(theirs.bundles_by_program, prefix)},
        }
    # An fp8 cache (float8_e4m3fn, k and v scales): our one launch (decode and mixed) beside the sum of
    # tpu-inference's two, scheduled bundles.
    f8 = args(kv_dtype=jnp.float8_e4m3fn)
    scales = dict(k_scale=0.5, v_scale=2.0)
    with tir.tpu_generation(mod, VERSION[gen]):
        theirs = tc.compile_jax(lambda *x: mod.ragged_paged_attention(*x, **scales), f8, gen,
                                donate_argnums=(0, 1, 2, 3))
    ours = tc.compile_jax(lambda *x: ex.ragged_paged_attention(*x, **scales), f8, gen, donate_argnums=(3,))
    if not (ours.ok and theirs.ok):
        print(json.dumps({"error": f"fp8: ours {ours.error}, theirs {theirs.error}"}))
        return
    result["fp8"] = {"ours": {"bundles": one(ours.bundles_by_program, "ragged_paged_attention_kernel")},
                     "theirs": {"bundles": sum(v for k, v in theirs.bundles_by_program.items() if k.startswith("RPA"))}}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])

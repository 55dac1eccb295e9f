"""`tpu_kernel.tune` (issue 25, item 2) from Python: our JAX op and a Pallas kernel tuned over small
spaces (a few compiles through the Rust libtpu workers), pruning before any compile, the ranking by
the static cost model, the persistent cache, and the JAX op taking its defaults from the cache (with a
warning naming a missing key)."""
import functools
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpu_kernel
import tpu_kernel.examples as ex
from tpu_kernel import _tune

X = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)


def test_our_op_is_pruned_compiled_ranked_and_cached(tmp_path):
    space = {"block": [(128, 128, 128), (512, 512, 512), (100, 128, 128), (1024, 1024, 1024)]}
    t = tpu_kernel.tune(ex.matmul, X, X, space=space, generation="v5e", cache_dir=str(tmp_path))
    print(t.report())
    by = {json.dumps(c.config["block"]): c for c in t.candidates}
    # 100 does not tile 1024: our check refuses it at trace time, before any compile
    assert by["[100, 128, 128]"].outcome == "pruned", t.report()
    assert "100" in by["[100, 128, 128]"].reason, by["[100, 128, 128]"].reason
    assert t.compiles == 3
    ranked = t.ranked()
    assert [c.outcome for c in ranked] == ["ranked"] * 3
    assert all(a.cycles <= b.cycles for a, b in zip(ranked, ranked[1:]))
    assert t.best == ranked[0].config and t.best_cycles == ranked[0].cycles
    steps = {json.dumps(c.config["block"]): c.estimate["steps"] for c in ranked}
    assert steps == {"[128, 128, 128]": 512, "[512, 512, 512]": 8, "[1024, 1024, 1024]": 1}
    # 512 grid steps of 128^3 blocks cost more than 8 of 512^3 in the model
    assert by["[128, 128, 128]"].cycles > by["[512, 512, 512]"].cycles
    again = tpu_kernel.tune(ex.matmul, X, X, space=space, generation="v5e", cache_dir=str(tmp_path))
    assert again.from_cache and again.compiles == 0 and again.best == t.best
    cache = json.loads((tmp_path / "v5e.json").read_text())
    assert cache[t.key]["best"] == t.best


def _pallas_matmul(x, y, *, bm, bn, bk):
    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        kernel, grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def test_a_pallas_kernel_is_tuned_too(tmp_path):
    t = tpu_kernel.tune(_pallas_matmul, X, X, space={"bm": [256, 512], "bn": [256, 512], "bk": [512]},
                        constraints=[lambda c: c["bm"] >= c["bn"]], generation="v6e", cache_dir=str(tmp_path))
    print(t.report())
    assert len(t.candidates) == 3 and t.compiles == 3
    assert all(c.outcome == "ranked" for c in t.candidates), t.report()
    assert t.best in [c.config for c in t.candidates]


def _add(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] + w_ref[...]


def _row_plus_column(x, w, *, whole_x=False):
    """out[i, j] = x[i] + w[j] over a (2, 4) grid of 128x512 f32 blocks: x's block follows the row
    axis only, w's the column axis only; with `whole_x`, x is one block of its whole array."""
    x_spec = (pl.BlockSpec((128, 512), lambda i, j: (0, 0)) if whole_x
              else pl.BlockSpec((128, 512), lambda i, j: (i, 0)))
    return pl.pallas_call(
        _add, grid=(2, 4), in_specs=[x_spec, pl.BlockSpec((128, 512), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 512), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((256, 2048), jnp.float32))(x[:128] if whole_x else x, w)


def test_the_copy_pattern_follows_the_index_maps():
    """What the pipeline copies after the first step (libtpu skips a block whose index did not
    change), from the lowered kernel's index maps: `[[steps, share of a step's block bytes], ...]`."""
    from tpu_kernel._copies import block_copies
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    w = jax.ShapeDtypeStruct((128, 2048), jnp.float32)
    # w and the output move every step, x (a third of the bytes) only when the row changes
    hlo = _tune._lower(_row_plus_column, (x, w), {}, "v6e")
    assert block_copies(hlo) == [[6, 2 / 3], [1, 1.0]]
    # a block that is its whole array is copied once, outside the pattern: w and out, every step
    hlo = _tune._lower(_row_plus_column, (x, w), {"whole_x": True}, "v6e")
    assert block_copies(hlo) == [[7, 1.0]]
    # our matmul over a (2, 2, 2) grid: the output block stays over the reduction axis (the pattern
    # Rust's tuner reads from our IR for the same kernel: tests/tune.rs)
    hlo = _tune._lower(ex.matmul, (X, X), {"block": (512, 512, 512)}, "v6e")
    assert block_copies(hlo) == [[4, 2 / 3], [3, 1.0]]

    # index arithmetic as Pallas lowers it (floor division and modulo through compares, selects,
    # i1 extensions; min): x's block changes when i // 2 does, w's and the output's every step
    def arithmetic(x, w):
        return pl.pallas_call(
            _add, grid=(4, 2),
            in_specs=[pl.BlockSpec((128, 512), lambda i, j: (i // 2, 0)),
                      pl.BlockSpec((128, 512), lambda i, j: (jnp.minimum(i, 1), jnp.where(j > 0, 1, 0)))],
            out_specs=pl.BlockSpec((128, 512), lambda i, j: (i % 2 + 2 * (i // 2), j)),
            out_shape=jax.ShapeDtypeStruct((512, 1024), jnp.float32))(x, w)
    hlo = _tune._lower(arithmetic, (x, jax.ShapeDtypeStruct((256, 1024), jnp.float32)), {}, "v6e")
    assert block_copies(hlo) == [[6, 2 / 3], [1, 1.0]]

    # blocks chosen by scalar-prefetch data are known only at run time
    def gathered(idx, x):
        return pl.pallas_call(
            lambda i_ref, x_ref, o_ref: _add(x_ref, x_ref, o_ref),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,),
                in_specs=[pl.BlockSpec((128, 512), lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec((128, 512), lambda i, idx: (i, 0))),
            out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32))(idx, x)
    idx = jax.ShapeDtypeStruct((4,), jnp.int32)
    hlo = _tune._lower(gathered, (idx, jax.ShapeDtypeStruct((512, 512), jnp.float32)), {}, "v6e")
    assert block_copies(hlo) is None


def test_the_model_counts_only_the_blocks_that_move(tmp_path):
    """`tune` hands each candidate's copy pattern to the model: the grid's DMA is the first step's
    copies and each later step's share, not every block every step (what the model assumes when
    the pattern is not known)."""
    from tpu_kernel import libtpu
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    w = jax.ShapeDtypeStruct((128, 2048), jnp.float32)
    t = tpu_kernel.tune(_row_plus_column, x, w, space={"whole_x": [False]}, generation="v6e",
                        cache_dir=str(tmp_path), progress=False)
    [c] = t.candidates
    assert c.copies == [[6, 2 / 3], [1, 1.0]], c
    e = c.estimate
    assert e["steps"] == 8 and e["dma_step"] > 0, e
    assert abs(e["dma_grid"] - e["dma_step"] * (1 + 6 * 2 / 3 + 1)) < 1e-6 * e["dma_grid"], e
    assert "75% of the blocks' bytes moved" in t.report(), t.report()  # (1 + 6 x 2/3 + 1) / 8
    upper, why = libtpu.estimate(c.schedule, "v6e")
    assert why is None and upper["dma_grid"] == e["dma_step"] * 8, upper
    assert upper["cycles"] >= e["cycles"], (upper, e)
    # a pattern over another grid is refused, naming both
    none, why = libtpu.estimate(c.schedule, "v6e", copies=[[3, 1.0]])
    assert none is None and "covers 3 steps" in why and "has 7" in why, why


def test_a_copy_pattern_that_cannot_be_read_is_unknown_with_a_warning(tmp_path, monkeypatch):
    def unreadable(hlo):
        raise ValueError("an op printed another way")
    monkeypatch.setattr(_tune, "block_copies", unreadable)
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    w = jax.ShapeDtypeStruct((128, 2048), jnp.float32)
    with pytest.warns(UserWarning, match=r"copy pattern of a configuration could not be read \(ValueError: an op"):
        t = tpu_kernel.tune(_row_plus_column, x, w, space={"whole_x": [False]}, generation="v6e",
                            cache_dir=str(tmp_path), progress=False)
    [c] = t.candidates
    assert c.outcome == "ranked" and c.copies is None, c
    assert c.estimate["dma_grid"] == c.estimate["dma_step"] * 8, c.estimate


def test_the_jax_op_takes_its_defaults_from_the_cache(tmp_path, monkeypatch):
    a = jnp.ones((1024, 1024), jnp.bfloat16)
    monkeypatch.setenv(_tune.ENV_CACHE, str(tmp_path))
    space = {"block": [(256, 256, 256), (512, 512, 512)]}
    t = tpu_kernel.tune(ex.matmul, a, a, space=space, generation="v5e")
    assert (tmp_path / "v5e.json").is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an entry exists: no warning
        jaxpr = str(jax.make_jaxpr(functools.partial(ex.matmul, target="v5e"))(a, a))
    block = json.dumps({"block": t.best["block"]}, separators=(",", ":"))
    assert f"params={block}" in jaxpr, jaxpr
    # a shape with no entry: the kernel's default, and a warning naming the key and the file
    b = jnp.ones((512, 1024), jnp.bfloat16)
    with pytest.warns(UserWarning, match=r"no tuned entry for examples\.matmul\(bfloat16\[512,1024\], "
                                         r"bfloat16\[1024,1024\]\)\[\{\}\] on v5e in .*v5e\.json"):
        jaxpr = str(jax.make_jaxpr(functools.partial(ex.matmul, target="v5e"))(b, a))
    assert 'params={"block":[128,128,128]}' in jaxpr, jaxpr
    # a parameter the caller gives is never replaced
    jaxpr = str(jax.make_jaxpr(functools.partial(ex.matmul, target="v5e", block=(128, 256, 128)))(a, a))
    assert 'params={"block":[128,256,128]}' in jaxpr, jaxpr


def _tune_tpu_inference():
    from conftest import bench_module
    return bench_module("tune_tpu_inference")


def test_tpu_inference_table_sample(tmp_path):
    """Item 3's command (benches/tune_tpu_inference.py) on one key of tpu-inference's v6 int8 table:
    tpu-inference's own Pallas quantized matmul tuned over our space for that key (the table's choice
    always among the candidates) compiles and is ranked by the model; the row says where the table's
    hardware-tuned choice lands. The full table is a benchmark (docs/tune.md), not a test."""
    tti = _tune_tpu_inference()
    table = tti.Qmm()
    keys = table.keys()
    assert len(keys) == 319, len(keys)  # the table of tpu-inference 0.32.0
    out = tmp_path / "qmm.jsonl"
    [row] = tti.run(table, keys[:1], workers=2, out=str(out))
    print(row)
    # With more than one input block the kernel traces four dots (tpu-inference's unfold_args over the
    # first and the last input step), three of them in regions libtpu branches into only when the
    # input step equals 0 or the last: read as `rare`, counted every step by the model, and at one
    # step in the input axis's by `--report --branches`. With one block of each there is nothing to
    # branch on.
    [raw] = tti.read_rows([str(out)])
    shared = tti.reestimate(raw, branches=True)["candidates"]
    for c, b in zip(raw["candidates"], shared):
        if c["outcome"] != "ranked":
            continue
        e, s = c["estimate"], c["schedule"]
        assert e["body"] == s["loop_body_weighted"], c
        if c["config"]["bi"] < 8192 and c["config"]["bb"] == 16:
            k_steps = 8192 // c["config"]["bi"]
            assert 0 < e["rare"] < s["loop_body_weighted"], c
            assert b["estimate"]["body"] == e["body"] - e["rare"] + -(-e["rare"] // k_steps), (c, b)
        elif c["config"] == {"bb": 16, "bo": 128, "bi": 8192}:
            assert e["rare"] == 0 and b["estimate"]["body"] == e["body"], c
    assert row["ranked"] >= 4, row
    # batch 16, out 128, in 8192: the table's 16-row block over the whole input is our first. A
    # 128-row block pads x, XLA fuses the pad into the call and places the operands in VMEM: a model
    # blind to VMEM-placed operands, the grid loop's own trip count and the ops around the kernel
    # ranked that first, and the table's choice 5th of 8 (docs/tune.md).
    assert row["rank_of_table"] == 1, row
    assert row["cost_ratio_table_over_ours"] == 1.0, row


def test_the_kept_table_rows_are_what_docs_tune_md_reports():
    """The compiled rows of tpu-inference's tables kept in the repository (`--stored`, item 3's full
    tables growing run by run): at most one row per key of the table, each holding the table's own
    choice among its candidates, and `--report`'s summary of them — re-judged under the model as it
    is now — quoted in docs/tune.md, so the agreement the docs give is the kept rows'."""
    tti = _tune_tpu_inference()
    assert tti.STORED["qmm"].exists(), tti.STORED["qmm"]
    _check_kept_rows(tti, tti.STORED, "table_choice",
                     lambda name, rows: tti.summary([tti.judge(tti.reestimate(r)) for r in rows], f"{name}: "))


def _check_kept_rows(tti, stored, choice_field, summary):
    """Each kept file of `stored` (table name -> path): one row per key of that table, each with the
    table's own choice, holding `choice_field`'s config among its candidates; `summary(name, rows)`
    quoted in docs/tune.md."""
    from conftest import REPO
    docs = (REPO / "docs" / "tune.md").read_text()
    for name, path in stored.items():
        if not path.exists():
            continue
        rows = tti.read_rows([path])
        keys = [json.dumps(r["key"]) for r in rows]
        assert len(set(keys)) == len(keys), "a key compiled twice"
        table = dict((json.dumps(k), c) for k, c in tti.TABLES[name]().keys())
        for r in rows:
            assert r["table"] == name and table[json.dumps(r["key"])] == r["table_choice"], r["key"]
            assert r[choice_field] in [c["config"] for c in r["candidates"]], r["key"]
        line = summary(name, rows)
        assert line in docs, f"docs/tune.md does not quote the kept rows' report: {line}"


def test_tpu_inference_gmm_sample(tmp_path):
    """The same on one key of tpu-inference's megablox gmm table, a kernel whose grid has an axis sized
    at run time (its group-tile visits): ranked with the trip count the bench gives, refused with the
    reason without one; the stored row judges the same again (`--report`)."""
    tti = _tune_tpu_inference()
    table = tti.Gmm()
    keys = table.keys()
    assert len(keys) == 50, len(keys)  # the table of tpu-inference 0.32.0
    key, choice = keys[0]
    out = tmp_path / "gmm.jsonl"
    [row] = tti.run(table, [(key, choice)], workers=2, out=str(out))
    print(row)
    assert row["ranked"] >= 4 and row["rank_of_table"] is not None, row
    [raw] = tti.read_rows([str(out)])
    assert tti.judge(raw) == row
    [mine] = [c for c in raw["candidates"] if c["config"] == choice]
    m, k, n, g = key[0], key[1], key[2], key[4]
    visits = m // choice["tm"] + min(g, m) - 1
    n_tiles, k_tiles = -(-n // choice["tn"]), -(-k // choice["tk"])
    assert mine["estimate"]["steps"] == n_tiles * visits * k_tiles, (mine, visits)
    # without trips the kernel compiles but is not ranked, and says why
    small = {"tm": [choice["tm"]], "tk": [choice["tk"]], "tn": [choice["tn"]]}
    with pytest.raises(RuntimeError, match="sized at run time"):
        tpu_kernel.tune(table.fn(), *table.args(key), space=small, generation="tpu7x", cache_dir="",
                        progress=False)


def test_the_gmm_benchs_metadata_in_jnp_is_the_librarys():
    """`--table gmm --ours` builds our grouped_matmul's metadata in jnp ops (the library's goes through
    a host callback, which a TPU lowering cannot carry): the same arrays as the library's, empty
    groups, a tile straddling a boundary and a single group included."""
    tti = _tune_tpu_inference()
    rng = np.random.default_rng(7)
    cases = [(512, 128, [100, 0, 156, 256]), (256, 128, [0, 0, 256]), (1024, 256, [1024]),
             (384, 128, [1, 1, 1, 381])]
    for _ in range(20):
        g, tm = int(rng.integers(1, 9)), int(rng.choice([128, 256]))
        m = tm * int(rng.integers(1, 6))
        cuts = np.sort(rng.integers(0, m + 1, g - 1))
        cases.append((m, tm, np.diff(np.concatenate([[0], cuts, [m]])).tolist()))
    for m, tm, sizes in cases:
        ours = tti.group_metadata_jnp(jnp.asarray(sizes, jnp.int32), m, tm)
        want = ex.group_metadata(np.asarray(sizes, np.int32), m, tm)
        for a, b in zip(ours, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{m} {tm} {sizes}")


def test_our_grouped_matmul_on_a_gmm_key_is_kept_and_judged_again(tmp_path):
    """`--table gmm --ours --out`: our grouped_matmul tuned on gmm keys, every candidate kept as for
    tpu-inference's kernels, and judged again from the file to the same row; a table choice our
    checks refuse (a `tn` that does not divide `n`) is reported with the check's message."""
    tti = _tune_tpu_inference()
    keys = tti.Gmm().keys()
    key, choice = keys[0]
    assert key == [128, 320, 6144, 160, 160] and choice["tn"] == 1280, (key, choice)
    out = tmp_path / "ours_gmm.jsonl.gz"
    [row] = tti.run_ours_gmm([(key, choice)], workers=2, out=str(out))
    print(row)
    assert row["ours_best"] is not None and row["ours_best_cycles"] > 0, row
    assert row["table_through_ours"] is None and "not a multiple of the block size 1280" in \
        row["table_through_ours_outcome"], row
    [raw] = tti.read_rows([str(out)])
    assert raw["kernel"] == "ours" and raw["table_as_ours"] == {**choice, "tk": 320}
    assert tti.judge_ours(tti.reestimate(raw)) == row
    assert "refused: dimension 2 of the [160, 320, 6144] bf16 array" in tti.markdown_ours(tti.Gmm.params, row)


def test_our_kernels_kept_rows_are_what_docs_tune_md_reports():
    """The rows of our own kernels tuned on the tables' keys kept in the repository (`--ours
    --stored`): one row per key of the table, each holding the table's choice as our kernel takes it
    among its candidates, and `--report --ours`'s summary of them — re-judged under the model as it is
    now — quoted in docs/tune.md."""
    tti = _tune_tpu_inference()
    assert tti.STORED_OURS["gmm"].exists(), tti.STORED_OURS["gmm"]

    def summary(name, rows):
        assert all(r["kernel"] == "ours" for r in rows), name
        return tti.summary_ours([tti.judge_ours(tti.reestimate(r)) for r in rows], f"{name} through ours: ")
    _check_kept_rows(tti, tti.STORED_OURS, "table_as_ours", summary)

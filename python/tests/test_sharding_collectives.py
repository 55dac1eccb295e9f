"""The collectives GSPMD puts into a sharded `x @ w`, predicted on paper and checked against libtpu.

The cases and their predictions are read from the table in docs/stack-map.md ("Part B"), never
restated here. Each case is compiled for a 4-chip `v5e:2x2` topology (no TPU present) twice:

- from jax: `jax.jit(lambda x, w: x @ w)` over `ShapeDtypeStruct`s carrying `NamedSharding`s;
- from torch through torchax: the torch function `lambda x, w: x @ w` made a jax function with
  `torchax.interop.jax_view` and jitted with `in_shardings`/`out_shardings` (what
  `torchax.interop.jax_jit(fn, kwargs_for_jax_jit=...)` does), and once more with the placements
  written inside the torch function as `Tensor.shard_(NamedSharding)` (a sharding constraint: the way
  tpu-inference's vLLM layers annotate torchax tensors).

From each optimized HLO the collectives are extracted (kind, replica groups in every printed form —
explicit, iota `[2,2]<=[4]`, mesh axes `mesh[...] {'axis_1'}` —, dimension, source/target pairs) and
the test asserts: prediction == what jax compiled == what torch compiled (the latter also with the
same result types and the same output sharding as jax).
"""
from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tpu_toolchain as tc

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "stack-map.md"
TOPOLOGY = "v5e:2x2"
DTYPE = jnp.bfloat16
KINDS = tc.COLLECTIVES
LEFT_TO_GSPMD = "left to GSPMD"

# ------------------------------------------------------------------------- the doc's table


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    return cell.replace("`", "").strip()


def read_table(doc: Path = DOC) -> list[dict]:
    """The rows of the table whose header has a "final prediction" column, as dicts keyed by the
    header's names (lower case)."""
    lines = doc.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and "final prediction" in line.lower():
            header = [h.lower() for h in _cells(line)]
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                cells = _cells(body)
                assert len(cells) == len(header), f"row has {len(cells)} cells, header {len(header)}: {body}"
                rows.append(dict(zip(header, cells)))
            return rows
    raise AssertionError(f"no table with a 'final prediction' column in {doc}")


def parse_spec(cell: str) -> P | None:
    """`P('x', None)` → PartitionSpec; "left to GSPMD" → None (no out_shardings)."""
    text = _unquote(cell)
    if text == LEFT_TO_GSPMD:
        return None
    m = re.fullmatch(r"P\((.*)\)", text)
    assert m, f"not a PartitionSpec: {cell!r}"
    args = ast.literal_eval(f"({m.group(1)},)") if m.group(1).strip() else ()
    return P(*args)


def parse_shapes(cell: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`[512,1024] × [1024,512]` → ((512, 1024), (1024, 512))."""
    dims = [tuple(int(d) for d in m.split(",")) for m in re.findall(r"\[([\d, ]+)\]", cell)]
    assert len(dims) == 2, f"expected two shapes in {cell!r}"
    return dims[0], dims[1]


# ------------------------------------------------------------------------- canonical collectives


def canonical(kind: str, groups=None, dim=None, pairs=None) -> str:
    """One collective in the doc's cell format, normalized: groups sorted within and between,
    pairs sorted; keys in a fixed order (dim, groups, pairs)."""
    assert kind in KINDS, kind
    keys = []
    if dim is not None:
        keys.append(f"dim={int(dim)}")
    if groups is not None:
        g = sorted(sorted(int(d) for d in grp) for grp in groups)
        keys.append("groups=" + json.dumps(g, separators=(",", ":")))
    if pairs is not None:
        p = sorted([int(s), int(t)] for s, t in pairs)
        keys.append("pairs=" + json.dumps(p, separators=(",", ":")))
    return f"{kind}{{{','.join(keys)}}}"


def parse_prediction(cell: str) -> list[str]:
    """A "final prediction" cell → sorted canonical collectives (a multiset)."""
    text = _unquote(cell)
    if text == "none":
        return []
    out = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        m = re.fullmatch(r"([a-z-]+)\{(.*)\}", item)
        assert m, f"bad collective {item!r} in {cell!r}"
        fields = dict(re.findall(r"(\w+)=(\[[\[\]\d, ]*\]|-?\d+)", m.group(2)))
        leftover = re.sub(r"(\w+)=(\[[\[\]\d, ]*\]|-?\d+)", "", m.group(2)).replace(",", "").strip()
        assert not leftover, f"unparsed text {leftover!r} in {item!r}"
        out.append(canonical(m.group(1),
                             groups=json.loads(fields["groups"]) if "groups" in fields else None,
                             dim=int(fields["dim"]) if "dim" in fields else None,
                             pairs=json.loads(fields["pairs"]) if "pairs" in fields else None))
    return sorted(out)


# ------------------------------------------------------------------------- collectives in optimized HLO


def collectives(hlo: str) -> list[tuple[str, str]]:
    """Every collective in an optimized HLO module (tpu_toolchain.hlo_collectives) as (canonical
    form, result type without layouts)."""
    return sorted((canonical(c["kind"], groups=c["groups"] if c["kind"] != "collective-permute" else None,
                             dim=c["dimension"], pairs=c["pairs"]), c["type"])
                  for c in tc.hlo_collectives(hlo))


# ------------------------------------------------------------------------- compiling the cases


@functools.cache
def mesh() -> Mesh:
    _, topo = tc.topology(TOPOLOGY)
    devices = topo.devices
    assert len(devices) == 4, f"{TOPOLOGY} should have 4 devices, has {len(devices)}"
    return Mesh(np.array(devices).reshape(2, 2), ("x", "y"))


class Case:
    def __init__(self, row: dict):
        self.name = _unquote(row["case"])
        self.x_shape, self.w_shape = parse_shapes(row["shapes (x × w)"])
        self.x_spec, self.w_spec = parse_spec(row["x sharding"]), parse_spec(row["w sharding"])
        assert self.x_spec is not None and self.w_spec is not None, "operand shardings are required"
        self.out_spec = parse_spec(row["out sharding"])
        self.prediction = parse_prediction(row["final prediction"])

    def sharding(self, spec: P) -> NamedSharding:
        return NamedSharding(mesh(), spec)

    def compiled_jax(self):
        x = jax.ShapeDtypeStruct(self.x_shape, DTYPE, sharding=self.sharding(self.x_spec))
        w = jax.ShapeDtypeStruct(self.w_shape, DTYPE, sharding=self.sharding(self.w_spec))
        kw = {} if self.out_spec is None else {"out_shardings": self.sharding(self.out_spec)}
        return jax.jit(lambda x, w: x @ w, **kw).trace(x, w).lower().compile()

    def compiled_torch_jit_kwargs(self, torchax):
        """The placements given to jax.jit as torchax.interop.jax_jit passes them
        (`kwargs_for_jax_jit`): `jax.jit(jax_view(torch_fn), in_shardings=..., out_shardings=...)`."""
        def torch_fn(x, w):
            return x @ w

        kw = {"in_shardings": (self.sharding(self.x_spec), self.sharding(self.w_spec))}
        if self.out_spec is not None:
            kw["out_shardings"] = self.sharding(self.out_spec)
        jitted = jax.jit(torchax.interop.jax_view(torch_fn), **kw)
        x, w = jax.ShapeDtypeStruct(self.x_shape, DTYPE), jax.ShapeDtypeStruct(self.w_shape, DTYPE)
        return jitted.trace(x, w).lower().compile()

    def compiled_torch_shard_(self, torchax):
        """The placements written on the torchax tensors inside the torch function
        (`Tensor.shard_` = jax.lax.with_sharding_constraint on the wrapped array), as
        tpu-inference's linear layers do; neither the jit nor its arguments carry a sharding (the
        compiler propagates the constraints to the parameters, and the mesh names the devices)."""
        def torch_fn(x, w):
            x.shard_(self.sharding(self.x_spec))
            w.shard_(self.sharding(self.w_spec))
            y = x @ w
            if self.out_spec is not None:
                y.shard_(self.sharding(self.out_spec))
            return y

        jitted = jax.jit(torchax.interop.jax_view(torch_fn))
        x, w = jax.ShapeDtypeStruct(self.x_shape, DTYPE), jax.ShapeDtypeStruct(self.w_shape, DTYPE)
        return jitted.trace(x, w).lower().compile()


CASES = [Case(r) for r in read_table()]


@pytest.fixture(scope="module")
def torchax():
    import torch  # noqa: F401  (torchax needs it; imported here so collecting the suite stays fast)
    import torchax
    import torchax.interop  # noqa: F401
    return torchax


def _spec_of(compiled) -> list:
    """The output sharding libtpu settled on, as a comparable value."""
    (s,) = jax.tree_util.tree_leaves(compiled.output_shardings)
    return [tuple(d) if isinstance(d, (tuple, list)) else d for d in s.spec] + \
        [None] * (2 - len(s.spec))


def _observed(compiled) -> tuple[list[str], list[tuple[str, str]]]:
    found = collectives(compiled.as_text())
    return sorted(c for c, _ in found), found


# ------------------------------------------------------------------------- the tests


def test_the_doc_table_has_the_four_cases_and_parses():
    names = [c.name for c in CASES]
    assert {"1", "2", "3", "4"} <= set(names), names
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_collectives_match_the_prediction_from_jax_and_from_torch(case, torchax):
    jax_compiled = case.compiled_jax()
    jax_kinds, jax_full = _observed(jax_compiled)
    assert jax_kinds == case.prediction, (
        f"case {case.name}: jax compiled {jax_kinds}, docs/stack-map.md predicts {case.prediction}")
    for how in ("compiled_torch_jit_kwargs", "compiled_torch_shard_"):
        torch_compiled = getattr(case, how)(torchax)
        torch_kinds, torch_full = _observed(torch_compiled)
        assert torch_kinds == case.prediction, (
            f"case {case.name} ({how}): torch compiled {torch_kinds}, doc predicts {case.prediction}")
        # the same collectives on the same types (dtype and local shapes), and the same output layout
        assert torch_full == jax_full, f"case {case.name} ({how}): torch {torch_full} != jax {jax_full}"
        assert _spec_of(torch_compiled) == _spec_of(jax_compiled), (
            f"case {case.name} ({how}): output sharding {torch_compiled.output_shardings} "
            f"!= jax's {jax_compiled.output_shardings}")
        # the torch-side placements are the parameters' shardings in the compiled program
        (xs, ws), _ = torch_compiled.input_shardings
        assert xs.is_equivalent_to(case.sharding(case.x_spec), 2), f"case {case.name} ({how}): x {xs}"
        assert ws.is_equivalent_to(case.sharding(case.w_spec), 2), f"case {case.name} ({how}): w {ws}"


# ------------------------------------------------------------------------- the parser itself


def test_replica_group_forms_expand_to_the_same_groups():
    # iota forms: [2,2]<=[4] is [[0,1],[2,3]]; [2,2]<=[2,2]T(1,0) is [[0,2],[1,3]]
    assert tc.replica_groups("[2,2]<=[4]", 4) == [[0, 1], [2, 3]]
    assert tc.replica_groups("[2,2]<=[2,2]T(1,0)", 4) == [[0, 2], [1, 3]]
    assert tc.replica_groups("[1,4]<=[4]", 4) == [[0, 1, 2, 3]]
    assert tc.replica_groups("{{0,2},{1,3}}", 4) == [[0, 2], [1, 3]]
    assert tc.replica_groups("{}", 4) == [[0, 1, 2, 3]]
    # mesh-axes form: the groups of devices that differ only along the listed axes
    assert tc.replica_groups("mesh['axis_0'=2,'axis_1'=2] {'axis_1'}", 4) == [[0, 1], [2, 3]]
    assert tc.replica_groups("mesh['axis_0'=2,'axis_1'=2] {'axis_0'}", 4) == [[0, 2], [1, 3]]
    assert tc.replica_groups("mesh['axis_0'=2,'axis_1'=2] {'axis_0','axis_1'}", 4) == [[0, 1, 2, 3]]
    assert tc.replica_groups("mesh['a'=2,'b'=2], device_ids=(1,0,3,2) {'b'}", 4) == [[1, 0], [3, 2]]
    # a sub-axis: 'a':(1)2 of an axis of 4 is its major half → pairs 4 apart on an 8-device mesh
    assert tc.replica_groups("mesh['a'=4,'b'=2] {'a':(1)2}", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert tc.replica_groups("mesh['a'=4,'b'=2] {'a':(2)2}", 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_collectives_are_read_from_sync_and_async_instructions():
    hlo = "\n".join([
        "HloModule m, num_partitions=4",
        "  %all-reduce = bf16[8,8]{1,0:T(8,128)(2,1)} all-reduce(%f), channel_id=1, "
        "replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true, to_apply=%add",
        "  %cp = (bf16[8,8]{1,0}, bf16[8,8]{1,0}, u32[], u32[]) collective-permute-start(%p), channel_id=2, "
        "source_target_pairs={{1,2},{0,0},{2,1},{3,3}}, metadata={op_name=\"a\"}",
        "  %cpd = bf16[8,8]{1,0} collective-permute-done(%cp)",
        "  ROOT %ag = f32[4,8]{1,0} all-gather(%q), channel_id=3, replica_groups={{0,1},{2,3}}, "
        "dimensions={0}, use_global_device_ids=true",
    ])
    got = sorted(c for c, _ in collectives(hlo))
    assert got == parse_prediction("`all-gather{dim=0,groups=[[2,3],[0,1]]}; "
                                   "collective-permute{pairs=[[0,0],[1,2],[2,1],[3,3]]}; "
                                   "all-reduce{groups=[[1,3],[0,2]]}`")
    assert parse_prediction("none") == []

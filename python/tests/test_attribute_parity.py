"""Attribute-level parity with the Pallas twins (issue 10, item 3).

For every example with a Pallas twin in `pallas_kernels.KERNELS`, at the twin's shapes and blocks:

1. **Ops with their attributes.** Our Mosaic module (the body of `tpu_kernel.examples.<name>.lower`,
   deserialized by jaxlib) and Pallas's (the body of the twin's `tpu_custom_call`, cross-lowered for
   TPU and deserialized the same way) are both read into one normalized form, and the *multisets* of
   op signatures must be equal (the failure message is a readable two-sided diff). A signature is

       @func/<enclosing region ops>/op.name(operands) : (operand types) -> (result types) {attributes}

   with *every* attribute the parser gives (inherent defaults included: `fastmath`, overflow flags,
   `tpu.matmul` dimension numbers / precision / `transpose_lhs_hint`, `vector.multi_reduction` kind
   and dims, `arith.cmpi`/`cmpf` predicates, `tpu.vector_store` strides and segment sizes, ...); the
   op name itself carries cast semantics (`sitofp` vs `uitofp`, `extf`, `truncf`) and arith flavours
   (`addf`/`addi`, `maximumf`/`maxnumf`). An operand is written as the *name of the op producing it*
   (one level of dataflow, so SSA names do not matter), a constant as its literal, a function argument
   as `%argN` (the kernel signatures are equal, so the index means the same operand), a region argument
   as `<op>.arg`; an `scf.if`'s condition is written three producers deep, in its own signature and in
   the path of every op inside it (so ops cannot move between the `pl.when` blocks unseen). The kernel
   `func.func` (dimension semantics, iteration bounds, window params, scratch and prefetch counts),
   every `@transform_*` index-map function and the module attributes are compared the same way.

   Normalizations (each applied to both modules; the complete list):
   - **Constants are folded into their uses** (`arith.constant` ops disappear; the operand becomes the
     literal). A splat `dense<c> : vector<..>` and a scalar `c` materialized by `vector.broadcast` are
     the same literal, and an op whose operands are all literals is evaluated (integer `addi`/`subi`/
     `muli`, `cmpi`, `select`, `broadcast`, `index_cast`). Why: how a constant is materialized is not
     part of the computation; jax writes `jnp.zeros(...)` as a scalar broadcast and `fori_loop(0, 8)`'s
     bound as `0 + 8`, we write splats and folded bounds; MLIR's canonicalizer (and libtpu) make them
     one thing.
   - **`arith.cmpi ne, (arith.extui %b : i1 to i32), 0` is `%b`.** Why: it is how `pl.when` turns its
     bool into an `scf.if` condition (bool -> int32 -> `!= 0`), the identity on `%b`; we branch on `%b`.
   - **Identity `vector.shape_cast` / `vector.broadcast` (result type == operand type) are their
     operand.** Why: jnp's `keepdims`/`broadcast_to` emit them when nothing changes; they are no-ops.
   - **Dead pure ops are dropped** (no uses, no side effect). Why: Pallas loads every ref it stores
     to (`o_ref[...] = v` lowers to a `vector.load` whose result is never used, a strided one to a dead
     `tpu.strided_load`) and the extui above is
     left unused by its fold; libtpu removes them (../shared/TOOLCHAIN.md).
   - **Empty `scf.yield`s are dropped.** Why: Pallas prints `pl.when`'s `scf.if` with an empty `else {}`
     block, we write no else block; neither computes anything.
   - **The carried values of an `scf.while` are compared as a multiset** (the while's inits and result
     types, the `scf.condition` payload, the after-region `scf.yield`). Why: their order is the order
     the source names them (`(0, v)` in the Pallas twin, `v` then `n` in the Rust kernel); a
     permutation of the loop state, not another computation.
   - **`arith.addf(X, tpu.matmul(a, b, 0))` is `tpu.matmul(a, b, X)`** (the matmul's only use, zero
     accumulator, default fastmath). Why: our `opt` pass rewrites `acc + dot` into `tpu.matmul` with
     the accumulator as its `acc` operand (ARCHITECTURE.md, `opt.rs`: fewer LLO ops than Pallas,
     ../shared/TOOLCHAIN.md); a deliberate, documented lowering choice, not an accident — its numbers
     are checked below (on CPU). Nothing else about the matmul (dimension numbers, precision, types) is relaxed.
     The same for an integer accumulator: **`arith.addi(X, tpu.matmul(a, b, 0))`** (no overflow flags)
     **is `tpu.matmul(a, b, X)`** (`quantized_matmul_w8a8`'s i8 × i8 → i32; the pass is the same, and
     integer addition is exact, so the bits are too).

   - **Leading unit dimensions of memref and vector types are dropped** (`memref<1x128x128xbf16>` is
     `memref<128x128xbf16>`), with the zero indices they take in `vector.load`/`vector.store`/
     `tpu.vector_store` (a shape_cast that then changes nothing is its operand, as above). Why: a
     `BlockSpec` with a squeezed dimension (`None` in Pallas, `.squeeze(0)` for us) gives Pallas a
     window memref that keeps the unit dimension and a `vector.shape_cast` after every load and before
     every store; we type the window rank-reduced and load/store it directly — the same elements in the
     same order, fewer ops (flash attention: 16 LLO ops below its twin, bundles equal).
   - **`arith.addi(lo, arith.subi(hi, lo))` is `hi`** (no overflow flags on either; exact in wrapping
     integer arithmetic). Why: it is the upper bound Pallas gives the `scf.for` of a `lax.fori_loop` whose
     bounds are traced (`lo + (hi - lo)`, with `lo` the lower bound: `0 + (n - 0)` for
     `fori_loop(0, n, ..)`); we bound the loop by `hi` itself (`paged_attention`'s loops over the pages a
     sequence owns). MLIR's arith canonicalizer folds the pair the same way.

   Real mismatches are not normalized away: a twin whose module differs is `xfail(strict=True)` with
   the exact difference named (`KNOWN_MISMATCHES`), so the test fails the day it is fixed as well.

2. **Numbers.** The twin under Pallas `interpret=True` and our op (`tpu_kernel.examples.<name>`: our
   interpreter on CPU through XLA FFI) on the same random inputs (floats N(0, 1), integers over their
   whole range). One rule per output, by its dtype (`BY_DTYPE`), or exact for a whole twin (`ALL_EXACT`):
   - `EXACT` (same bits) where both sides do the same correctly rounded ops in an order the kernel
     fixes: `add` (one f32 add), `transpose` (data movement), `causal_mask` (`x * 0.125` is exact, a
     select, -inf), `fori_rowsum` and `paged_gather` (the same f32 adds in the loop's order); and every
     integer output (integer ops are exact: `ops_tour`'s counts).
   - `F32_NORMWISE` for the other f32 outputs, results of reductions, dots and transcendentals
     (`softmax`, `colsum`, `ops_tour`): |ours - Pallas| <= 16 * eps(f32) * max|Pallas| element by
     element, non-finite values in the same places. Why: XLA:CPU and our interpreter sum in different orders and widths
     (pairwise/SIMD lanes vs blocked) and use different `exp`/`tanh` polynomials; the rounding error of
     a sum is bounded relative to the magnitude of what is summed, not to each (possibly cancelled)
     result. Measured: <= 2 such ulps on every case and seed tried.
   - `BF16_INNER` for the bf16 results of kernels that round an f32 intermediate to bf16 before a dot
     (`flash_attention`'s probabilities before `p @ v`): one bf16 ulp, or near zero within
     eps(bf16) / 16 * max|Pallas|. Why: where ours and Pallas's `exp` differ by an f32 ulp, a
     probability may round to the other bf16 neighbour; that moves a result by a bf16 ulp of one term
     — small against the row's magnitude, large against a result that cancels to ~1e-6 (measured:
     at most ~1.2e-6 against a bound of ~1e-4 at max|Pallas| ~ 0.4).
   - `BF16_1ULP` for bf16 results of f32 math (`matmul`, `rmsnorm`: f32 accumulate / normalize, then
     `truncf`): at most one bf16 ulp apart, or, where the f32 value cancelled to near zero, within the
     f32 normwise bound above. Why: two f32 values a few f32 ulps apart round to the same or to
     neighbouring bf16 values; a result that cancels to ~1e-5 keeps the f32 sum's absolute noise.
"""
from __future__ import annotations

import collections
import contextlib
import json
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxlib.mlir import ir

import pallas_kernels
from conftest import SPMD_EXAMPLES
import tpu_kernel.examples as ex
import tpu_toolchain as tc

TWINS = sorted(pallas_kernels.KERNELS)

# Real differences between our lowering and Pallas's: name -> (what differs, the op names the diff may
# hold). The parity test of these twins is `xfail(strict=True)`; each reason names the exact ops.
KNOWN_MISMATCHES: dict[str, tuple[str, set]] = {
    # (none: ops_tour's twin used jnp's floor-mod `%` where the Rust kernel's `%` is truncated; the twin
    # now says `lax.rem`, the same algorithm, and matches)
}

# Twins not held op for op (their ops and attributes, test_ops_and_attributes_match_pallas), with why:
# the structural comparison wants a twin written op for op; these are the same algorithm in Pallas's
# idioms, held by LLO ops and bundles (test_examples.py) and their numbers elsewhere. Not yet done:
# an op-for-op ragged paged attention twin (its module differs in 670 op signatures: Pallas's loop and
# index forms).
NOT_OP_FOR_OP: dict[str, str] = {
    "ragged_paged_attention": "the algorithm in Pallas's idioms (pl.loop, fori_loop carries): LLO ops and "
                              "bundles compared in test_examples.py",
}


# ------------------------------------------------------------------------------------------ modules

def our_kernel(name: str):
    """The installed `tpu_kernel.examples` kernel of a twin; a twin without one is a failure (the
    package is installed from examples-lib/ by `pip install .`: a new example needs a reinstall)."""
    name = ex.WRAPPERS.get(name, name)  # an example whose Python face wraps a kernel: that kernel
    if name not in ex.library.kernels:
        pytest.fail(f"the installed tpu_kernel.examples library ({ex.library.path}) has no kernel `{name}`, "
                    f"which pallas_kernels.py twins: reinstall the package (`.venv/bin/pip install .`)",
                    pytrace=False)
    return ex.library.kernels[name]


def our_module(name: str) -> str:
    """Our Mosaic module for `name` at the twin's shapes (the examples' default static parameters,
    which are the twin's blocks: the func attributes compared below say so), as jaxlib prints it."""
    _, args = pallas_kernels.KERNELS[name]
    cfg = json.loads(our_kernel(name).lower(*args)["backend_config"])
    return tc.deserialize_body(tc.b64_body(cfg))


def pallas_module(fn, args) -> str:
    calls = tc.tpu_custom_calls(tc.lower_jax_for_tpu(fn, args, "v5e"))
    assert len(calls) == 1, f"expected one tpu_custom_call from the Pallas twin, got {len(calls)}"
    return tc.deserialize_body(tc.b64_body(calls[0]["config"]))


# ------------------------------------------------------------------------------------ normalization

class Const:
    """A folded constant operand: its scalar value (`int`, `float` or the literal text) and type."""
    __slots__ = ("value", "text", "type")

    def __init__(self, value, text: str, type_: str):
        self.value, self.text, self.type = value, text, type_

    def label(self) -> str:
        return self.text


class Arg:
    __slots__ = ("name", "type")

    def __init__(self, name: str, type_: str):
        self.name, self.type = name, type_

    def label(self) -> str:
        return self.name


_UNIT_DIMS = re.compile(r"\b(memref|vector)<((?:1x)+)(?=\d)")


def _squeeze(type_: str) -> str:
    """`type_` (or any attribute text) with the leading unit dims of its memref and vector types dropped."""
    return _UNIT_DIMS.sub(r"\1<", type_)


def _unit_dims(type_: str) -> int:
    m = _UNIT_DIMS.match(type_)
    return len(m.group(2)) // 2 if m else 0


class Node:
    """One op kept in the normalized module."""
    __slots__ = ("name", "attrs", "operands", "types", "path", "pure", "uses", "mlir")

    def __init__(self, name, attrs, operands, types_, path, mlir_op):
        self.name, self.attrs, self.operands, self.types, self.path = name, attrs, operands, types_, path
        self.pure = _is_pure(name)
        self.uses = 0
        self.mlir = mlir_op


class Res:
    __slots__ = ("node", "type")

    def __init__(self, node: Node, type_: str):
        self.node, self.type = node, type_

    def label(self) -> str:
        return self.node.name


_PURE_PREFIXES = ("arith.", "math.")
_PURE_OPS = {"vector.load", "tpu.strided_load", "vector.broadcast", "vector.shape_cast", "vector.multi_reduction", "tpu.iota",
             "tpu.matmul", "tpu.transpose", "tpu.assume_multiple"}


def _is_pure(name: str) -> bool:
    return name.startswith(_PURE_PREFIXES) or name in _PURE_OPS


_INT_RE = re.compile(r"^(-?\d+) : (i\d+|index)$")
_FLOAT_RE = re.compile(r"^(\S+) : (f\d+|bf16)$")


def _literal(attr: ir.Attribute, type_: str) -> Const:
    """An `arith.constant` value attribute as a Const (a splat becomes its scalar)."""
    text = str(attr)
    if text.startswith("dense<"):
        dense = ir.DenseElementsAttr(attr)
        if dense.is_splat:
            text = str(dense.get_splat_value())
    if (m := _INT_RE.match(text)) and m.group(2) != "i1":
        return Const(int(m.group(1)), text, type_)
    if text in ("true", "false"):
        return Const(int(text == "true"), f"{text} : i1", type_)
    if m := _FLOAT_RE.match(text):
        return Const(m.group(1), text, type_)
    return Const(text, text, type_)


_CMPI = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "slt": lambda a, b: a < b,
         "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b, "sge": lambda a, b: a >= b}
_INT_BIN = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b}


def _elem(type_: str) -> str:
    m = re.match(r"vector<(?:\d+x)*(\w+)>", type_)
    return m.group(1) if m else type_


def _wrap(v: int, type_: str) -> int:
    """Two's-complement wrap of an integer result to its element width (index: 64 bits)."""
    e = _elem(type_)
    bits = 64 if e == "index" else int(e[1:])
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _fold(name: str, attrs: dict, ops: list, type_: str) -> Const | None:
    """Evaluate an op whose operands are all integer/bool constants, when it is one of the few that
    jax's and our constant materialization produce; else None (the op stays)."""
    if not ops or not all(isinstance(o, Const) for o in ops):
        return None
    vals = [o.value for o in ops]
    if name == "vector.broadcast":
        return Const(ops[0].value, ops[0].text, type_)
    if not all(isinstance(v, int) for v in vals):
        return None
    if name in _INT_BIN:
        v = _wrap(_INT_BIN[name](*vals), type_)
    elif name == "arith.cmpi":
        pred = _readable(name, attrs)["predicate"]
        if pred not in _CMPI:
            return None
        v = int(_CMPI[pred](*vals))
        return Const(v, f"{'true' if v else 'false'} : i1", type_)
    elif name == "arith.select":
        v = vals[1] if vals[0] else vals[2]
    elif name == "arith.index_cast":
        v = vals[0]
    else:
        return None
    return Const(v, f"{v} : {_elem(type_)}", type_)


class Normalized:
    """A Mosaic module as the multiset of normalized op signatures (see the module docstring)."""

    def __init__(self, text: str, if_depth: int = 3):
        self.if_depth = if_depth  # how deep an `scf.if`'s condition is written (in its path and signature)
        self.nodes: list[Node] = []
        self.header: list[str] = []
        self.unit_dims: dict[str, int] = {}  # kernel argument -> leading unit dims its type lost
        with tc.make_ctx(False), ir.Location.unknown():
            module = ir.Module.parse(text)
            attrs = {n: str(module.operation.attributes[n]) for n in module.operation.attributes}
            self.header.append(f"module {_attrs(attrs)}")
            for func in module.body.operations:
                self._func(func.operation)
        self._dce()
        self.signatures = collections.Counter(self.header + [self._signature(n) for n in self.nodes])

    # -- reading
    def _func(self, func: ir.Operation) -> None:
        fattrs = {n: _squeeze(str(func.attributes[n])) if n == "function_type" else str(func.attributes[n])
                  for n in func.attributes}
        sym = fattrs["sym_name"].strip('"')
        self.header.append(f"func.func @{sym} {_attrs(fattrs)}")
        values: dict = {}
        for block in func.regions[0].blocks:
            for i, a in enumerate(block.arguments):
                values[a] = Arg(f"%arg{i}", _squeeze(str(a.type)))
                self.unit_dims[f"%arg{i}"] = _unit_dims(str(a.type))
            self._block(block, f"@{sym}/", values)

    def _block(self, block: ir.Block, path: str, values: dict) -> None:
        for op in block.operations:
            self._op(op.operation, path, values)

    def _op(self, op: ir.Operation, path: str, values: dict) -> None:
        name = op.name
        attrs = {n: str(op.attributes[n]) for n in op.attributes}
        types_ = [_squeeze(str(r.type)) for r in op.results]
        operands = [values[v] for v in op.operands]
        operands, attrs = self._drop_unit_indices(name, operands, attrs)
        replacement = self._rewrite(op, name, attrs, operands, types_)
        if replacement is not None:
            values[op.results[0]] = replacement
            return
        if name == "scf.yield" and not operands:
            return  # an empty `else {}` / a yield of nothing
        node = Node(name, attrs, operands, types_, path, op)
        for o in operands:
            if isinstance(o, Res):
                o.node.uses += 1
        self.nodes.append(node)
        for r in op.results:
            values[r] = Res(node, _squeeze(str(r.type)))
        for ri, region in enumerate(op.regions):
            for block in region.blocks:
                for a in block.arguments:
                    values[a] = Arg(f"{name}.arg", _squeeze(str(a.type)))
                self._block(block, f"{path}{self._region_op(name, operands)}[{ri}]/", values)

    def _drop_unit_indices(self, name: str, operands: list, attrs: dict) -> tuple[list, dict]:
        """A load or store of a window whose leading unit dims were dropped loses their zero indices."""
        ref = {"vector.load": 0, "vector.store": 1, "tpu.vector_store": 1}.get(name)
        if ref is None or not isinstance(operands[ref], Arg):
            return operands, attrs
        k = self.unit_dims.get(operands[ref].name, 0)
        indices = operands[ref + 1:ref + 1 + k]
        if not k or not all(isinstance(i, Const) and i.value == 0 for i in indices):
            return operands, attrs
        operands = operands[:ref + 1] + operands[ref + 1 + k:]
        if "operandSegmentSizes" in attrs:  # tpu.vector_store: value, base, indices, mask
            sizes = [int(x) for x in attrs["operandSegmentSizes"].split(":")[1].rstrip(">").split(",")]
            sizes[2] -= k
            attrs = {**attrs, "operandSegmentSizes": f"array<i32: {', '.join(map(str, sizes))}>"}
        return operands, attrs

    def _rewrite(self, op, name, attrs, operands, types_):
        """The value an op is replaced by under the normalizations, or None to keep the op."""
        if name == "arith.constant":
            return _literal(op.attributes["value"], types_[0])
        if len(types_) != 1:
            return None
        folded = _fold(name, attrs, operands, types_[0])
        if folded is not None:
            return folded
        if name in ("vector.shape_cast", "vector.broadcast") and operands[0].type == types_[0]:
            return operands[0]
        if name == "arith.cmpi" and _readable(name, attrs)["predicate"] == "ne":
            a, b = operands
            if isinstance(a, Res) and a.node.name == "arith.extui" and a.node.operands[0].type == "i1" \
                    and isinstance(b, Const) and b.value == 0:
                return a.node.operands[0]  # the extui is left unused (dropped as dead)
        if name == "arith.addi" and attrs.get("overflowFlags") == "#arith.overflow<none>":
            lo, diff_ = operands
            if isinstance(diff_, Res) and diff_.node.name == "arith.subi" \
                    and diff_.node.attrs.get("overflowFlags") == "#arith.overflow<none>" \
                    and _same_value(diff_.node.operands[1], lo) and diff_.node.operands[0].type == types_[0]:
                return diff_.node.operands[0]  # lo + (hi - lo) is hi (the subi is left unused: dead)
        if (name == "arith.addf" and attrs.get("fastmath") == "#arith.fastmath<none>") or \
                (name == "arith.addi" and attrs.get("overflowFlags") == "#arith.overflow<none>"):
            for mm, other in (operands, operands[::-1]):
                if isinstance(mm, Res) and mm.node.name == "tpu.matmul" and len(mm.node.operands) == 3 \
                        and isinstance(mm.node.operands[2], Const) and _is_zero(mm.node.operands[2]) \
                        and len(list(mm.node.mlir.results[0].uses)) == 1 and other.type == types_[0]:
                    mm.node.operands[2] = other
                    if isinstance(other, Res):
                        other.node.uses += 1  # (the addf itself never became a node: no use to undo)
                    return mm
        return None

    def _dce(self) -> None:
        changed = True
        while changed:
            changed = False
            keep = []
            for n in self.nodes:
                if n.pure and n.uses == 0:
                    for o in n.operands:
                        if isinstance(o, Res):
                            o.node.uses -= 1
                    changed = True
                else:
                    keep.append(n)
            self.nodes = keep

    def _region_op(self, name: str, operands: list) -> str:
        """How an op with regions appears in the path of the ops inside: an `scf.if` with its condition
        (so the two `pl.when` blocks of a kernel are told apart), loops by name."""
        return f"scf.if({_expr(operands[0], self.if_depth)})" if name == "scf.if" else name

    # -- writing
    def _signature(self, n: Node) -> str:
        pairs = [(o.label(), o.type) for o in n.operands]
        types_ = list(n.types)
        carried = n.path.rsplit("/", 2)[-2] if "/" in n.path else ""
        if n.name == "scf.while":
            pairs, types_ = sorted(pairs), sorted(types_)
        elif n.name == "scf.condition":
            pairs = pairs[:1] + sorted(pairs[1:])
        elif n.name == "scf.yield" and carried.startswith("scf.while["):
            pairs = sorted(pairs)
        if n.name == "scf.if":
            pairs = [(_expr(n.operands[0], self.if_depth), n.operands[0].type)]
        ops = ", ".join(p[0] for p in pairs)
        tys = ", ".join(p[1] for p in pairs)
        attrs = _attrs(_readable(n.name, n.attrs))
        return f"{n.path}{n.name}({ops}) : ({tys}) -> ({', '.join(types_)}) {attrs}".rstrip()


def _same_value(a, b) -> bool:
    """The same SSA value (one producer, one argument) or the same constant."""
    if isinstance(a, Const) and isinstance(b, Const):
        return (a.value, a.type) == (b.value, b.type)
    if isinstance(a, Res) and isinstance(b, Res):
        return a.node is b.node
    return a is b


def _is_zero(c: Const) -> bool:
    try:
        return float(c.value) == 0.0
    except (TypeError, ValueError):
        return False


_CMPI_NAMES = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
_CMPF_NAMES = ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une",
               "uno", "true"]


def _readable(name: str, attrs: dict) -> dict:
    """Attributes as printed, with `arith.cmpi`/`cmpf` predicates by name (`predicate = sge`)."""
    names = {"arith.cmpi": _CMPI_NAMES, "arith.cmpf": _CMPF_NAMES}.get(name)
    if names and "predicate" in attrs:
        code = attrs["predicate"].split(" : ")[0]
        if code.isdigit() and int(code) < len(names):
            return {**attrs, "predicate": names[int(code)]}
    return attrs


def _expr(ref, depth: int) -> str:
    """An operand as an expression `depth` producers deep (`arith.cmpi<eq>(%arg2, 3 : i32)`)."""
    if not isinstance(ref, Res) or depth == 0:
        return ref.label()
    n = ref.node
    pred = _readable(n.name, n.attrs).get("predicate")
    return f"{n.name}{f'<{pred}>' if pred else ''}({', '.join(_expr(o, depth - 1) for o in n.operands)})"


def _attrs(attrs: dict) -> str:
    return "{" + ", ".join(f"{k} = {v}" for k, v in sorted(attrs.items())) + "}" if attrs else ""


def diff(ours: collections.Counter, theirs: collections.Counter) -> str:
    """A readable two-sided diff of two signature multisets ('' when equal)."""
    only_ours, only_theirs = ours - theirs, theirs - ours
    if not only_ours and not only_theirs:
        return ""
    lines = []
    for title, c in (("only in ours", only_ours), ("only in Pallas's", only_theirs)):
        lines.append(f"{title} ({sum(c.values())}):")
        lines += [f"  {k}" + (f"   [x{v}]" if v > 1 else "") for k, v in sorted(c.items())]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ 1. ops

_modules: dict = {}


def modules(name: str) -> tuple[str, str]:
    if name not in _modules:
        fn, args = pallas_kernels.KERNELS[name]
        _modules[name] = (our_module(name), pallas_module(fn, args))
    return _modules[name]


def _parity_cases():
    for name in (n for n in TWINS if n not in NOT_OP_FOR_OP):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISMATCHES[name][0])] if name in KNOWN_MISMATCHES else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", _parity_cases())
def test_ops_and_attributes_match_pallas(name):
    ours, theirs = modules(name)
    d = diff(Normalized(ours).signatures, Normalized(theirs).signatures)
    assert not d, f"{name}: ops/attributes differ from the Pallas twin's after normalization\n{d}"


def test_every_example_has_a_twin():
    """The installed examples and the twins are one list (a kernel without a twin is not compared;
    backward kernels — those a kernel's grad or fwd rule runs — are exercised through their forward
    example's gradient; flash attention's have twins of their own, compared in test_flash_attention)."""
    kernels = ex.library.kernels.values()
    backward = {e["kernel"] for k in kernels for e in k.grad or []} | {k.fwd for k in kernels if k.fwd}
    wrapped = {kernel: name for name, kernel in ex.WRAPPERS.items()}  # twins take the example's name
    exported = {wrapped.get(k.name, k.name) for k in kernels} - backward - set(SPMD_EXAMPLES)
    assert exported == set(TWINS), (
        f"installed examples without a twin in pallas_kernels.py: {sorted(exported - set(TWINS))}; twins whose "
        f"example is not in the installed package (reinstall it: `.venv/bin/pip install .`): "
        f"{sorted(set(TWINS) - exported)}")


def test_known_mismatches_are_exactly_that():
    """Each xfailed twin differs *only* by what its reason names, so an xfail cannot hide a second
    mismatch: the diff against the twin holds only the named ops, and against a twin with the named
    difference taken out (`PARITY_VARIANTS`) there is no diff at all."""
    for name, (_, allowed_ops) in KNOWN_MISMATCHES.items():
        ours, theirs = modules(name)
        # (an scf.if's condition written as its op name only: the named ops may feed a condition)
        o, t = Normalized(ours, if_depth=0).signatures, Normalized(theirs, if_depth=0).signatures
        assert o != t, f"{name} matches its twin now: remove it from KNOWN_MISMATCHES"
        stray = [k for k in (o - t) + (t - o) if k.split("/")[-1].split("(")[0] not in allowed_ops]
        assert not stray, f"{name}: differences beyond the known mismatch:\n" + "\n".join(stray)
        fn, args = PARITY_VARIANTS[name]
        d = diff(Normalized(ours).signatures, Normalized(pallas_module(fn, args)).signatures)
        assert not d, f"{name}: beyond the known mismatch, ops/attributes differ:\n{d}"


# Per known mismatch: the twin with the named difference taken out (name -> (fn, args)).
PARITY_VARIANTS: dict = {}


# -- the comparator itself: every kind of attribute difference the test is about must be caught

MUTATIONS = [
    # (what, example whose module is mutated, regex on our module text, replacement)
    ("maximumf -> maxnumf", "ops_tour", r"arith\.maximumf", "arith.maxnumf"),
    ("cmpi predicate", "ops_tour", r"arith\.cmpi sge", "arith.cmpi sgt"),
    ("sitofp -> uitofp", "ops_tour", r"arith\.sitofp", "arith.uitofp"),
    ("extui -> extsi", "ops_tour", r"arith\.extui", "arith.extsi"),
    ("truncf rounding", "matmul", r"(arith\.truncf %\w+) :", r"\1 to_nearest_even :"),
    ("reduction kind", "ops_tour", r"vector\.multi_reduction <add>", "vector.multi_reduction <maxsi>"),
    ("reduction dims", "colsum", r"(vector\.multi_reduction <add>, %\w+, %\w+) \[0\]", r"\1 [1]"),
    ("matmul dimension numbers", "ops_tour", r"dot_dimension_numbers<\[1\], \[1\], \[0\], \[0\], \[0, 0, 1, 0\]",
     "dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1]"),
    ("matmul transpose hint", "ops_tour", r"transpose_lhs_hint = false", "transpose_lhs_hint = true"),
    ("matmul precision", "ops_tour", r"transpose_lhs_hint = false\}",
     "precision = #tpu.contract_precision<fp32>, transpose_lhs_hint = false}"),
    ("fastmath flag", "ops_tour", r"(math\.tanh %\w+) :", r"\1 fastmath<fast> :"),
    ("overflow flag", "ops_tour", r"(arith\.muli %arg0, %\w+) :", r"\1 overflow<nsw> :"),
    ("constant value", "ops_tour", r"4\.471500e-02", "4.471600e-02"),
    ("addf -> subf", "ops_tour", r"arith\.addf", "arith.subf"),
    ("exp -> exp2", "softmax", r"math\.exp ", "math.exp2 "),
    ("operand swap", "softmax", r"arith\.subf (%\w+), (%\w+) :", r"arith.subf \2, \1 :"),
    ("store mask dropped", "ops_tour",
     r"(tpu\.vector_store %arg3\[%\w+, %\w+\], %\w+#0) masked %\w+ (\{strides = array<i32>\}"
     r" : memref<64x128xf32, #tpu.memory_space<vmem>>, vector<64x128xf32>), vector<64x128xi1>", r"\1 \2, "),
    ("load index", "fori_rowsum", r"(vector\.load %arg1\[)%\w+(, (%\w+)\])", r"\1\3\2"),
    ("iteration bounds", "ops_tour", r"iteration_bounds = array<i64: 4>", "iteration_bounds = array<i64: 8>"),
    ("dimension semantics", "colsum", r"#tpu.dimension_semantics<arbitrary>", "#tpu.dimension_semantics<parallel>"),
    ("index map", "ops_tour",
     r"(@transform_3\(%arg0: i32\) -> \(i32, i32\) \{\n\s*%c0_i32 = arith.constant 0 : i32\n\s*return) %arg0, %c0_i32",
     r"\1 %c0_i32, %arg0"),
    ("ops moved out of their if", "matmul", r"scf\.if %5 \{\n(.*?)\n    \}\n",  # (renamed: names are per region)
     lambda m: re.sub(r"%c0_(\d+)", r"%c0_m\1", m.group(1)) + "\n"),
]


def test_comparator_catches_attribute_differences():
    """Each mutation of one of our modules — every kind of difference this test is about — must
    show up in the diff against the unmutated module."""
    missed = []
    for what, name, pattern, repl in MUTATIONS:
        ours = modules(name)[0]
        bad, n = re.subn(pattern, repl, ours, count=1, flags=re.S)
        assert n == 1, f"mutation {what!r} did not apply to our {name} module"
        try:
            changed = Normalized(bad).signatures
        except ir.MLIRError as e:
            raise AssertionError(f"mutation {what!r} made an invalid module: {e}") from None
        if not diff(changed, Normalized(ours).signatures):
            missed.append(what)
    assert not missed, f"the comparator did not see: {missed}"


def test_normalizations_are_the_documented_ones():
    """The allowances really apply to Pallas's module (each one is needed) and nothing else is
    normalized away: a live load is kept, `acc + dot` with a nonzero dot accumulator stays two ops."""
    _, theirs = modules("matmul")
    n = Normalized(theirs)
    names = collections.Counter(node.name for node in n.nodes)
    assert names["arith.addf"] == 0 and names["tpu.matmul"] == 1       # acc + dot -> matmul(acc)
    assert names["arith.extui"] == 0 and names["arith.cmpi"] == 2       # pl.when's bool round trip
    assert names["vector.load"] == 4                                     # acc, x, y, acc: dead ones gone
    assert names["vector.broadcast"] == 0 and names["arith.constant"] == 0
    # a used load before a store is kept
    # (the accumulator's init stores zeros where a load of it is dead: store the loaded value instead)
    live, stored = re.subn(
        r"(%(\d+) = vector\.load %arg6\[(%c0_\d+), (%c0_\d+)\][^\n]*\n\s*%(\d+) = vector\.shape_cast %\2 [^\n]*\n"
        r"(?:[^\n]*\n)*?\s*tpu\.vector_store %arg6\[\3, \4\], )%\d+", r"\1%\5", theirs, count=1)
    assert stored == 1 and live != theirs
    assert collections.Counter(x.name for x in Normalized(live).nodes)["vector.load"] == 5
    acc1 = re.sub(r"dense<0.000000e\+00> : vector<128x128xf32>(\n\s*%\w+ = tpu\.matmul)",
                  r"dense<1.000000e+00> : vector<128x128xf32>\1", theirs)
    assert acc1 != theirs
    kept = collections.Counter(x.name for x in Normalized(acc1).nodes)
    assert kept["arith.addf"] == 1 and kept["tpu.matmul"] == 1
    # squeezed windows: Pallas's unit dims and their shape_casts go, and a store keeps its real indices
    _, fa = modules("flash_attention")
    fa_nodes = Normalized(fa).nodes
    assert "vector<1x128x128xbf16>" in fa and not any(x.name == "vector.shape_cast" and "<128x128xbf16>" in x.types[0]
                                                       for x in fa_nodes)
    stores = [x for x in fa_nodes if x.name == "tpu.vector_store"]
    assert stores and all(len(x.operands) == 4 for x in stores)  # value, window, two indices
    assert _squeeze("memref<1x1x8x128xf32>, vector<1xf32>, vector<4x1x128xf32>") == \
        "memref<8x128xf32>, vector<1xf32>, vector<4x1x128xf32>"
    # the integer accumulator of w8a8: acc + dot -> matmul(acc) as well
    _, theirs8 = modules("quantized_matmul_w8a8")
    names8 = collections.Counter(node.name for node in Normalized(theirs8).nodes)
    assert "arith.addi" in theirs8 and names8["arith.addi"] == 0 and names8["tpu.matmul"] == 1
    # the upper bounds of paged_attention's traced fori_loops: lo + (hi - lo) -> hi, nothing else
    _, theirs_pa = modules("paged_attention")
    loops = [x for x in Normalized(theirs_pa).nodes if x.name == "scf.for"]
    uppers = collections.Counter(x.operands[1].label() for x in loops)
    assert uppers == {"arith.minsi": 3, "arith.divsi": 1, "8 : i32": 2}, uppers
    # hi + (hi - lo) is not hi: both ops stay
    off, n = re.subn(r"(%\w+) = arith\.subi (%\w+), (%\w+) : i32\n(\s*)(%\w+) = arith\.addi \3, \1 : i32",
                     r"\1 = arith.subi \2, \3 : i32\n\4\5 = arith.addi \2, \1 : i32", theirs_pa, count=1)
    assert n == 1, "no lo + (hi - lo) in the twin's module"
    uppers = collections.Counter(x.operands[1].label() for x in Normalized(off).nodes if x.name == "scf.for")
    assert uppers["arith.addi"] == 1, uppers


# --------------------------------------------------------------------------------------- 2. numbers

EXACT = "bit-exact"            # the same bits
F32_NORMWISE = "f32 normwise"  # |ours - pallas| <= 16 * eps(f32) * max|pallas|, non-finite values equal
BF16_1ULP = "bf16 1 ulp"       # at most one bf16 ulp apart, or (near zero) within the f32 normwise bound
BF16_INNER = "bf16 inner"      # as BF16_1ULP, but near zero within eps(bf16) / 16 * max|pallas|
F32_NORMWISE_ULPS = 16
# The rule of an output by its dtype, and the twins whose outputs must all be bit-exact (why: the
# module docstring).
BY_DTYPE = {"float32": F32_NORMWISE, "bfloat16": BF16_1ULP, "int32": EXACT, "int8": EXACT, "uint8": EXACT,
            "uint32": EXACT, "bool": EXACT}
ALL_EXACT = {"add", "transpose", "causal_mask", "fori_rowsum", "paged_gather"}
# Twins that round an f32 intermediate to bf16 before a dot (the module docstring: BF16_INNER).
BF16_INTERMEDIATES = {"flash_attention"}


def tolerance(name: str, dtype) -> str:
    if name in ALL_EXACT:
        return EXACT
    if name in BF16_INTERMEDIATES and np.dtype(dtype) == jnp.bfloat16:
        return BF16_INNER
    key = np.dtype(dtype).name
    assert key in BY_DTYPE, f"{name}: no tolerance rule for dtype {key}"
    return BY_DTYPE[key]


@contextlib.contextmanager
def pallas_interpret():
    """Run the twins unmodified with `interpret=True`: `pallas_kernels.pl` is, for the duration, the
    real `jax.experimental.pallas` but with `pallas_call(..., interpret=True)`."""
    real = pallas_kernels.pl
    proxy = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    proxy.pallas_call = lambda *a, **kw: real.pallas_call(*a, **{**kw, "interpret": True})
    twins = (pallas_kernels, pallas_kernels.pallas_rpa)
    for m in twins:
        m.pl = proxy
    try:
        yield
    finally:
        for m in twins:
            m.pl = real


def random_inputs(args, seed):
    """N(0, 1) floats (cast to the operand's dtype); integers over their whole range."""
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if jnp.issubdtype(a.dtype, jnp.integer):
            info = np.iinfo(a.dtype)
            out.append(jnp.asarray(rng.integers(info.min, info.max, a.shape, dtype=a.dtype, endpoint=True)))
        else:
            out.append(jnp.asarray(rng.standard_normal(a.shape, dtype=np.float32)).astype(a.dtype))
    return out


def _bf16_ordered(a: np.ndarray) -> np.ndarray:
    """bf16 bit patterns as integers ordered like the values (adjacent values differ by 1)."""
    b = a.view(np.uint16).astype(np.int32)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def check_close(what: str, ours: np.ndarray, theirs: np.ndarray, tol: str) -> None:
    assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype), what
    if tol == EXACT:
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{what} ({tol})")
        # (not `assert a == b` on the bytes: under CI=true pytest would diff 32 KiB byte strings with difflib)
        if ours.tobytes() != theirs.tobytes():
            raise AssertionError(f"{what}: equal values but other bits (signed zeros?)")
    elif tol in (BF16_1ULP, BF16_INNER):
        assert ours.dtype == jnp.bfloat16, what
        ulps = np.abs(_bf16_ordered(ours) - _bf16_ordered(theirs))
        o32, t32 = ours.astype(np.float32), theirs.astype(np.float32)
        # results that cancel to near zero keep the f32 math's absolute noise (normwise, as below), or
        # with bf16 intermediates the noise of one of them rounded the other way
        eps = np.finfo(np.float32).eps * F32_NORMWISE_ULPS if tol == BF16_1ULP else float(jnp.finfo(jnp.bfloat16).eps) / 16
        noise = eps * np.abs(t32[np.isfinite(t32)]).max()
        bad = (ulps > 1) & ~(np.abs(o32 - t32) <= noise)
        if bad.any():
            worst = np.unravel_index(np.argmax(np.where(bad, ulps, -1)), ulps.shape)
            raise AssertionError(f"{what}: {int(bad.sum())} elements more than 1 bf16 ulp apart (and beyond the f32 "
                                 f"noise {noise:.3g}); worst at {worst}: ours {ours[worst]}, Pallas {theirs[worst]}, "
                                 f"{ulps[worst]} ulps")
    elif tol == F32_NORMWISE:
        assert ours.dtype == np.float32, what
        np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs), err_msg=f"{what}: non-finite")
        fin = np.isfinite(theirs)
        atol = F32_NORMWISE_ULPS * np.finfo(np.float32).eps * np.abs(theirs[fin]).max()
        np.testing.assert_allclose(ours[fin], theirs[fin], rtol=0, atol=atol, err_msg=f"{what} ({tol})")
    else:
        raise AssertionError(f"unknown tolerance {tol!r}")


@pytest.mark.parametrize("name", TWINS)
def test_numbers_match_pallas_interpret(name):
    fn, args = pallas_kernels.KERNELS[name]
    kernel = our_kernel(name)
    xs = pallas_kernels.valid_inputs(name, random_inputs(args, seed=sum(map(ord, name))))
    if name in PALLAS_CANNOT_INTERPRET:
        # Its numbers are held elsewhere (see the table); here: Pallas's interpreter still refuses it.
        with pytest.raises(Exception, match=PALLAS_CANNOT_INTERPRET[name]):
            with pallas_interpret():
                jax.block_until_ready(jax.jit(lambda *a: fn(*a))(*xs))
        return
    with pallas_interpret():
        theirs = jax.jit(lambda *a: fn(*a))(*xs)  # a new function: no jit cache hit on the TPU trace
    ours = kernel(*xs)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    ours = ours if isinstance(ours, tuple) else (ours,)
    assert len(ours) == len(theirs), f"{name}: {len(ours)} outputs, the twin has {len(theirs)}"
    for k, (o, t) in enumerate(zip(ours, theirs)):
        t = np.asarray(t)
        assert np.isfinite(t.astype(np.float32)).any(), f"{name} output {k}: Pallas produced no finite values"
        check_close(f"{name} output {k}", np.asarray(o), t, tolerance(name, t.dtype))


# Twins Pallas's interpreter cannot run, with the reason it gives; their numbers are checked against
# another reference: ragged_paged_attention's against tpu-inference's `ref_ragged_paged_attention`
# and a jnp reference (test_ragged_paged_attention.py, test_jax_transforms.py), and in both of our
# engines (tests/ragged_paged_attention.rs).
PALLAS_CANNOT_INTERPRET = {"ragged_paged_attention": "Shapes must be 1D sequences of concrete values"}  # run-time DMA sizes


def test_tolerances_reject_real_errors():
    """The checks are not vacuous: a difference just beyond each rule fails it, and one within passes."""
    rng = np.random.default_rng(0)
    f = rng.standard_normal((64, 128), dtype=np.float32)
    allowed = F32_NORMWISE_ULPS * np.finfo(np.float32).eps * np.abs(f).max()
    one = np.zeros_like(f)
    one[3, 7] = 1
    failing = [
        (EXACT, np.nextafter(f, np.float32(np.inf)), f),                  # one f32 ulp everywhere
        (EXACT, -np.zeros_like(f), np.zeros_like(f)),                     # -0.0 vs +0.0
        (F32_NORMWISE, f + 2 * allowed * one, f),                         # one element, twice the bound
        (F32_NORMWISE, np.where(one > 0, np.float32(np.inf), f), f),      # a non-finite value
    ]
    for tol, bad, ref in failing:
        with pytest.raises(AssertionError):
            check_close(tol, bad.astype(np.float32), ref, tol)
    check_close("f32 within", f + np.float32(0.5 * allowed) * one, f, F32_NORMWISE)
    b = f.astype(jnp.bfloat16)
    bits = b.view(np.uint16)
    with pytest.raises(AssertionError):
        check_close("bf16 2 ulps", (bits + (2 * one).astype(np.uint16)).view(jnp.bfloat16), b, BF16_1ULP)
    check_close("bf16 1 ulp", (bits + np.ones_like(bits)).view(jnp.bfloat16), b, BF16_1ULP)
    with pytest.raises(AssertionError):  # 2 ulps of a large value: beyond the f32 noise too
        big = np.abs(b).argmax()
        check_close("bf16 2 ulps", (bits + 2 * (np.arange(bits.size) == big).reshape(bits.shape).astype(np.uint16))
                    .view(jnp.bfloat16), b, BF16_1ULP)

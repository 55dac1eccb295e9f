"""What a kernel's pipeline copies on each grid step, from its lowered `tpu_custom_call`.

libtpu's pipeline predicates every block's DMA on its block index having changed since the previous
grid step: a block whose index repeats is not copied again (an `x` block over a `j` axis it does not
follow, an output block over a reduction axis). The cost model (`docs/tune.md`) takes that from the
kernel's index maps — the Mosaic module's `transform_indices` functions, evaluated here on every grid
point at once (numpy) — as the same `(steps, share)` pattern our Rust tuner makes from our IR
(`kernel_runtime::libtpu::cost::Copies`): for the steps after the first, how many steps move which
share of a step's block bytes. Blocks that are their whole array are left out (the pipeline copies them
once; the model counts them apart). The pattern is unknown (`None`) when an index map reads
scalar-prefetch data, uses an op this evaluator does not know, or the grid is sized at run time.
"""
from __future__ import annotations

import base64
import json
import re
from typing import Any, Iterator

#: grids with more steps are not walked (the model then takes every block to move every step)
MAX_WALKED_STEPS = 1 << 20

_PREFIX = "stable_mosaic."  # the serialized body's op names (`stable_mosaic.arith.addi`)


def _walk(op: Any) -> Iterator[Any]:
    yield op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _walk(inner.operation)


def _bits(type_text: str) -> int:
    """Bits of a tensor/memref element type (`tensor<8x128xbf16>` → 16, `f8E4M3FN` → 8, `i1` → 1)."""
    element = type_text.rstrip(">").split("x")[-1]
    m = re.search(r"\d+", element)
    if not m:
        raise ValueError(f"no bit width in {type_text}")
    return int(m.group())


def _shape(type_text: str) -> list[int]:
    inner = type_text[type_text.index("<") + 1:].rstrip(">")
    return [int(d) for d in inner.split("x")[:-1]]


def _evaluate(func: Any, grid_indices: list) -> list | None:
    """The block indices `func` (a `transform_indices` function) returns for the grid indices given
    (numpy arrays over every grid point), or None if it reads anything else or uses an unknown op."""
    import numpy as np
    from jaxlib.mlir import ir
    block = func.regions[0].blocks[0]
    env: dict = {}
    for i, arg in enumerate(block.arguments):
        if i < len(grid_indices):
            env[arg] = grid_indices[i]
    binary = {
        "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
        "arith.divsi": lambda a, b: np.trunc(a / b).astype(np.int64),
        "arith.floordivsi": np.floor_divide,
        "arith.ceildivsi": lambda a, b: -np.floor_divide(-a, b),
        "arith.remsi": np.fmod, "arith.maxsi": np.maximum, "arith.minsi": np.minimum,
        "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
        "arith.shli": np.left_shift, "arith.shrsi": np.right_shift,
        # unsigned: the same as numpy's on non-negative operands (checked below)
        "arith.divui": np.floor_divide, "arith.remui": np.remainder, "arith.shrui": np.right_shift,
        "arith.maxui": np.maximum, "arith.minui": np.minimum,
    }
    compare = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
               5: np.greater_equal}
    same = ("arith.index_cast", "arith.extsi", "arith.trunci", "arith.index_castui", "arith.extui")
    for inner in block.operations:
        op = inner.operation
        name = op.name[len(_PREFIX):] if op.name.startswith(_PREFIX) else op.name
        try:
            args = [env[v] for v in op.operands]
        except KeyError:  # a scalar-prefetch ref, or a value of an op not evaluated
            return None
        if name.endswith("ui") and any(np.any(np.asarray(a) < 0) for a in args):
            return None  # an unsigned op on a negative value: not worth modelling
        # values are int64 arrays (or scalars); an i1 is 0 or 1
        if name == "arith.constant":
            value = ir.IntegerAttr(op.attributes["value"]).value
            env[op.results[0]] = np.int64(value & 1 if str(op.results[0].type) == "i1" else value)
        elif name in binary:
            env[op.results[0]] = binary[name](*args)
        elif name == "arith.extsi" and str(op.operands[0].type) == "i1":
            env[op.results[0]] = -args[0]  # true is all ones
        elif name in same:
            env[op.results[0]] = args[0]
        elif name == "arith.select":
            env[op.results[0]] = np.where(np.asarray(args[0]) != 0, args[1], args[2])
        elif name == "arith.cmpi" and ir.IntegerAttr(op.attributes["predicate"]).value in compare:
            predicate = compare[ir.IntegerAttr(op.attributes["predicate"]).value]
            env[op.results[0]] = np.asarray(predicate(*args)).astype(np.int64)
        elif name == "func.return":
            return [np.broadcast_to(a, grid_indices[0].shape) if grid_indices else np.atleast_1d(a)
                    for a in args]
        else:
            return None
    return None


def block_copies(stablehlo: str) -> list | None:
    """The copy pattern (`[[steps, share], ...]`, shares ascending) of the one `tpu_custom_call` in
    `stablehlo` (a lowered module's text), or None where it is not known (see the module docstring)."""
    import numpy as np
    from jax.interpreters import mlir as jmlir
    from jaxlib.mlir import ir
    ctx = jmlir.make_ir_context()
    ctx.allow_unregistered_dialects = True
    with ctx:
        module = ir.Module.parse(stablehlo)
        calls = [o for o in _walk(module.operation) if o.name == "stablehlo.custom_call"
                 and ir.StringAttr(o.attributes["call_target_name"]).value == "tpu_custom_call"]
        if len(calls) != 1:
            return None
        call = calls[0]
        config = json.loads(ir.StringAttr(call.attributes["backend_config"]).value)
        body = ir.Module.parse(base64.b64decode(config["custom_call_config"]["body"]))
        funcs = {ir.StringAttr(o.attributes["sym_name"]).value: o for o in _walk(body.operation)
                 if o.name in ("func.func", _PREFIX + "func.func")}
        main = next((f for f in funcs.values() if "window_params" in f.attributes), None)
        if main is None or "iteration_bounds" not in main.attributes:
            return None
        grid = [int(b) for b in ir.DenseI64ArrayAttr(main.attributes["iteration_bounds"])]
        steps = int(np.prod(grid, dtype=np.int64)) if grid else 1
        if any(b < 0 for b in grid) or steps > MAX_WALKED_STEPS:
            return None
        prefetch = ir.IntegerAttr(main.attributes["scalar_prefetch"]).value \
            if "scalar_prefetch" in main.attributes else 0
        # window_params cover the inputs (the call's operands after the scalar-prefetch ones), then
        # the outputs (its results)
        arrays = [str(v.type) for v in list(call.operands)[prefetch:]] + [str(r.type) for r in call.results]
        params = list(ir.ArrayAttr(main.attributes["window_params"]))
        if len(params) != len(arrays):
            return None
        points = [a.reshape(-1).astype(np.int64) for a in np.indices(grid)] if grid else []
        blocks = []  # (bytes, per-step block indices)
        for p, array in zip(params, arrays):
            p = ir.DictAttr(p)
            if "transform_indices" not in p or "window_bounds" not in p:
                continue  # not pipelined (a whole array in HBM the kernel copies itself)
            window = [int(b) for b in ir.DenseI64ArrayAttr(p["window_bounds"])]
            if window == _shape(array):
                continue  # its whole array: copied once
            target = ir.FlatSymbolRefAttr(p["transform_indices"]).value
            indices = _evaluate(funcs[target], points)
            if indices is None:
                return None
            nbytes = -(-int(np.prod(window, dtype=np.int64)) * _bits(array) // 8)
            blocks.append((nbytes, np.stack(indices, axis=-1) if indices else np.zeros((steps, 0))))
    total = sum(b for b, _ in blocks)
    moved = np.zeros(max(steps - 1, 0), dtype=np.int64)
    for nbytes, idx in blocks:
        moved += nbytes * np.any(idx[1:] != idx[:-1], axis=-1)
    values, counts = np.unique(moved, return_counts=True)
    return [[int(n), (int(m) / total) if total else 1.0] for m, n in zip(values, counts)]

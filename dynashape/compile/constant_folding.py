"""Constant folding: a node whose inputs are all known runs once, at compile time, on the CPU.

Shape nodes fold when their input's shape is static, so the shape_of subgraphs whose result
is already known at compile time vanish; the rest of such subgraphs stays for run time.
"""

from __future__ import annotations

import torch

from ..ir import Node
from ..ops.shapes import prod

# Random ops must draw anew on every run; folding them would freeze one draw.
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Bernoulli", "Multinomial"}
# A folded value lives in the model for good: do not inflate it with huge broadcasts. Weights
# written as ConstantOfShape (as in the onnx package's light models) are folded whatever their size:
# they are the model's parameters, and computing them again on every run would be far worse.
MAX_FOLD_ELEMENTS = 1 << 22
ALWAYS_FOLD = {"ConstantOfShape", "Constant"}


def fold_node(node: Node) -> bool:
    """Fold ``node`` if possible; returns whether its outputs became constants."""
    if node.op_type in NONDETERMINISTIC or node.subgraphs or node.opdef.host and node.op_type != "Constant":
        return False
    if any(v is not None and v.kind != "tensor" for v in (*node.inputs, *node.outputs)):
        return False  # sequences and optionals are built at run time: a list is not a constant
    if node.op_type in ("Shape", "Size"):
        return _fold_shape(node)
    if any(v is not None and not v.is_const for v in node.inputs):
        return _fold_symbolic(node)
    for v in node.outputs:
        if node.op_type in ALWAYS_FOLD:
            break
        if v is not None and v.shape is not None and v.shape.is_static:
            if prod(v.shape.to_static()) > MAX_FOLD_ELEMENTS:
                return False
    ins = [None if v is None else v.const for v in node.inputs]
    try:
        res = node.opdef.fn(*ins, **node.attrs)
    except Exception:  # noqa: BLE001  leave it to run time, which reports errors with context
        return False
    if isinstance(res, list) and len(node.outputs) == 1:
        return False  # a sequence, where ONNX's inference did not say so
    res = res if isinstance(res, (tuple, list)) else (res,)
    if len(res) < sum(v is not None for v in node.outputs):
        return False  # a kernel that cannot tell how many outputs the node has: leave it to run time
    if not all(isinstance(r, torch.Tensor) for v, r in zip(node.outputs, res) if v is not None):
        return False
    for v, r in zip(node.outputs, res):
        if v is not None:
            v.const = r.contiguous().clone()
            from ..shape import PartialShape
            v.shape = PartialShape(r.shape)
    return True


def _fold_shape(node: Node) -> bool:
    src = node.inputs[0]
    if src is None or src.shape is None:
        return False
    if node.op_type == "Size":
        if not src.shape.is_static:
            return False
        node.outputs[0].const = torch.tensor(prod(src.shape.to_static()), dtype=torch.int64)
        return True
    rank = len(src.shape)
    start = node.attrs.get("start", 0)
    end = node.attrs.get("end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    dims = src.shape.dims[start:end]
    if not all(d.is_static for d in dims):
        node.outputs[0].sym = [d.min if d.is_static else d for d in dims]
        return False
    node.outputs[0].const = torch.tensor([d.min for d in dims], dtype=torch.int64)
    return True


def _sym(v):
    """The value of a shape-like tensor as Python ints / Dimensions, when known symbolically."""
    if v is None:
        return None
    if v.is_const and isinstance(v.const, torch.Tensor) and v.const.dim() <= 1 and not v.const.is_floating_point():
        return v.const.tolist()
    return getattr(v, "sym", None)


def _fold_symbolic(node: Node) -> bool:
    """Follow a Shape's partly known value through the small ops of a shape_of subgraph; when
    every element it selects is static, the result is a constant (e.g. the static axis of a
    tensor whose other axes are dynamic)."""
    op, ins = node.op_type, [_sym(v) for v in node.inputs]
    if not node.inputs or ins[0] is None:
        return False
    x = ins[0]
    try:
        if op == "Gather" and isinstance(x, list) and ins[1] is not None:
            idx = ins[1]
            res = [x[i] for i in idx] if isinstance(idx, list) else x[idx]
        elif op == "Slice" and node.opset >= 10 and isinstance(x, list) and all(i is not None for i in ins[1:3]):
            steps = ins[4] if len(ins) > 4 and ins[4] is not None else [1]
            if len(ins) > 3 and ins[3] not in (None, [0], [-1]):
                return False
            res = x[slice(ins[1][0], ins[2][0], steps[0])]
        elif op == "Concat" and all(isinstance(i, list) for i in ins):
            res = [d for i in ins for d in i]
        elif op == "Unsqueeze" and not isinstance(x, list):
            res = [x]
        elif op == "Squeeze" and isinstance(x, list) and len(x) == 1:
            res = x[0]
        elif op == "Cast" and node.attrs.get("to") in (6, 7):
            res = x
        else:
            return False
    except (IndexError, TypeError):
        return False
    out = node.outputs[0]
    out.sym = res
    flat = res if isinstance(res, list) else [res]
    if all(isinstance(d, int) for d in flat):
        from ..ir.dtypes import torch_dtype
        dt = torch_dtype(out.elem_type) if out.elem_type else torch.int64
        out.const = torch.tensor(res, dtype=dt)
        from ..shape import PartialShape
        out.shape = PartialShape(out.const.shape)
        return True
    return False

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
    if node.op_type in ("Shape", "Size"):
        return _fold_shape(node)
    if any(v is not None and not v.is_const for v in node.inputs):
        return False
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
    res = res if isinstance(res, (tuple, list)) else (res,)
    for v, r in zip(node.outputs, res):
        if v is not None:
            if not isinstance(r, torch.Tensor):
                return False
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
        return False
    node.outputs[0].const = torch.tensor([d.min for d in dims], dtype=torch.int64)
    return True

"""Shape tensors known in part at compile time: which entries are numbers and which are dims.

Exporters compute a Reshape's target from the input's own shape: Paddle2ONNX writes
``Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1]))``, whose value depends on the batch and so does
not fold; static shape inference then lost the output's rank, and with it every fusion below
(ocr_rec_v4's SVTR neck: 125 values of unknown shape, its LayerNorms, SiLUs and attention
unfused). Here a 1-D (or scalar) integer value is followed as a list of entries, each an int or
the Dimension of the shape it was read from, through Shape, Slice, Gather, Concat, Unsqueeze,
Squeeze and Cast (onnxruntime's symbolic shape inference follows the same chains); the walk in
``propagate`` keeps them per value. The shape program does this exactly at run time; this is only
for what the compile passes can know.
"""

from __future__ import annotations

import torch

from ..ir import Node, Value

Partial = list  # of int | shape.Dimension
_MAX = 16  # entries followed: shape tensors are short


def _ints(v: Value | None) -> list[int] | None:
    c = None if v is None else v.const
    if not isinstance(c, torch.Tensor) or c.is_floating_point() or c.dim() > 1 or c.numel() > _MAX:
        return None
    return [int(x) for x in c.reshape(-1).tolist()]


def of(v: Value | None, known: dict[int, Partial]) -> Partial | None:
    """The entries of ``v``: from its constant, or from what the walk derived."""
    if v is None:
        return None
    return _ints(v) if v.is_const else known.get(id(v))


def derive(node: Node, known: dict[int, Partial]) -> Partial | None:
    """The entries of ``node``'s first output, where its op is followed and its inputs are known."""
    if node.domain not in ("", "ai.onnx") or not node.outputs or node.outputs[0] is None:
        return None
    op, ins, a = node.op_type, node.inputs, node.attrs
    if op == "Shape":
        x = ins[0]
        if x is None or x.shape is None:
            return None
        dims = [d.min if d.is_static else d for d in x.shape]
        r = len(dims)
        start, end = a.get("start", 0), a.get("end", r)
        return dims[max(0, start + r if start < 0 else start):max(0, end + r if end < 0 else end)]
    if op in ("Unsqueeze", "Squeeze", "Cast", "Identity"):
        return of(ins[0], known)
    if op == "Concat" and a.get("axis", 0) in (0, -1):
        parts = [of(v, known) for v in ins]
        return None if any(p is None for p in parts) else [e for p in parts for e in p]
    if op == "Gather" and a.get("axis", 0) == 0:
        data, idx = of(ins[0], known), _ints(ins[1])
        if data is None or idx is None or any(not -len(data) <= i < len(data) for i in idx):
            return None
        return [data[i] for i in idx]
    if op == "Slice":
        return _slice(node, known)
    return None


def _slice(node: Node, known: dict[int, Partial]) -> Partial | None:
    ins = node.inputs + [None] * (5 - len(node.inputs))
    data = of(ins[0], known)
    starts, ends = _ints(ins[1]), _ints(ins[2])
    axes, steps = _ints(ins[3]) if ins[3] is not None else [0], _ints(ins[4]) if ins[4] is not None else [1]
    if data is None or starts is None or ends is None or axes is None or steps is None \
            or len(starts) != 1 or len(ends) != 1 or axes not in ([0], [-1]) or steps[0] == 0:
        return None
    return data[slice(starts[0], ends[0], steps[0])]

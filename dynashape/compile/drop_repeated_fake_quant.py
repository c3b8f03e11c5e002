"""Pass: a FakeQuant whose input is already on its grid is the identity, and goes.

A QDQ model (``fuse_qdq.py``) quantizes an activation again after ops that only move its values:
``FakeQuant -> Reshape / Transpose / Slice / Gather / MaxPool ... -> FakeQuant`` with the same
scale, zero point and range (quantize_static puts a QDQ pair on both sides of each such op; tiny
BERT's QDQ export has 16 of its 74). The second one computes ``clamp(round(y / s)) * s`` of values
``y = fl(q * s)`` with ``q`` an integer within the range: ``y / s`` is within a few ulps of ``q``
(|q| <= 65535), so it rounds back to ``q``, the clamp keeps it, and ``q * s`` is ``y`` again, bit
for bit. Four passes over the activation saved per one dropped; its readers read its input.
"""

from __future__ import annotations

from ..ir import Graph, Node
from .fuse_qdq import _same, _scalar
from .patterns import FUSED_DOMAIN, remove, reroute

_ONNX = ("", "ai.onnx")
# ops whose first output's values are some of their first input's (moved, repeated or a max of them)
MOVES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather",
                   "Expand", "Tile", "MaxPool", "DepthToSpace", "SpaceToDepth"})


def _grid(n: Node) -> tuple:
    return (_scalar(n.inputs[1]), _scalar(n.inputs[2]) if len(n.inputs) > 2 else None,
            n.attrs.get("lo"), n.attrs.get("hi"))


def _same_grid(a: tuple, b: tuple) -> bool:
    return (a[0] is not None and b[0] is not None and _same(a[0], b[0]) and _same(a[1], b[1])
            and a[2:] == b[2:])


def _source(v):
    """The node that put ``v``'s values on a grid through moves only, or None."""
    p = v.producer if v is not None else None
    while p is not None and p.op_type in MOVES and p.domain in _ONNX and p.inputs and p.inputs[0] is not None:
        p = p.inputs[0].producer
    return p if p is not None and p.op_type == "FakeQuant" and p.domain == FUSED_DOMAIN else None


def drop_repeated_fake_quant(graph: Graph) -> Graph:
    outputs = {id(v) for v in graph.outputs}
    gone: set[int] = set()
    for n in [n for n in graph.nodes if n.op_type == "FakeQuant" and n.domain == FUSED_DOMAIN]:
        x, y = n.inputs[0], n.outputs[0]
        if y is None or id(y) in outputs:
            continue
        src = _source(x)
        if src is None or id(src) in gone or not _same_grid(_grid(src), _grid(n)):
            continue
        reroute(y, x)
        gone.add(id(n))
    remove(graph, gone)
    return graph

"""Pass: a constant per-channel Add right after a Conv becomes the Conv's bias.

``Add(Conv(x, W[, b]), c)`` (either operand order) with ``c`` a constant that broadcasts along the
output channels only ([1, C, 1, 1], [C, 1, 1], or one value) is ``Conv(x, W, b + c)``. PaddlePaddle's
exporter writes every convolution's bias so (PaddleOCR's det/rec v5 and v6 models: ~100 per
call, each a pass over the activation, 20% of the detector's CPU time). The convolution then adds
the bias itself; ``b + c`` is rounded once at load, so values move by an ulp at most.
Runs before ``fold_conv_bn``, so a BatchNormalization after such an Add still folds.
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node, Value
from .patterns import add_const, fold_into, only_feeds, producer


def _channel_vector(c: Value, conv: Node, inputs: bool = False) -> torch.Tensor | None:
    """``c`` as the (C,) vector it adds per output channel (per input channel when ``inputs``), or
    None when it broadcasts otherwise."""
    t = c.const
    w = conv.inputs[1]
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or w is None or not w.is_const:
        return None
    # the output (input) is (N, C, spatial...) of the weight's rank
    count = w.const.shape[1] * conv.attrs.get("group", 1) if inputs else w.const.shape[0]
    rank = w.const.dim()
    if t.numel() == 1:
        return t.reshape(1).expand(count)
    dims = list(t.shape)
    if len(dims) > rank or len(dims) < rank - 1:
        return None
    if len(dims) == rank:
        if dims[0] != 1:
            return None
        dims = dims[1:]
    if dims[0] != count or any(d != 1 for d in dims[1:]):
        return None
    return t.reshape(count)


def conv_operands(graph: Graph, op_type: str):
    """The ``op_type`` nodes (Add, Mul) with a Conv's output, read by nothing else, on one side and a
    constant per-output-channel vector on the other: (the node, the Conv, the vector, the constant).
    The Conv's bias must be constant and the vector of its weight's dtype."""
    for node in [n for n in graph.nodes if n.op_type == op_type and n.domain in ("", "ai.onnx")]:
        for i in (0, 1):
            y, c = node.inputs[i], node.inputs[1 - i]
            conv = producer(y, "Conv")
            if conv is None or c is None or not c.is_const or not only_feeds(y, [node], graph):
                continue
            b = conv.inputs[2] if len(conv.inputs) > 2 else None
            vec = _channel_vector(c, conv)
            if vec is None or (b is not None and not b.is_const) or vec.dtype != conv.inputs[1].const.dtype:
                continue
            yield node, conv, vec, c
            break


def fold_conv_add(graph: Graph) -> Graph:
    for add, conv, vec, c in conv_operands(graph, "Add"):
        b = conv.inputs[2] if len(conv.inputs) > 2 else None
        bias = vec.clone() if b is None else (b.const.to(torch.float64) + vec.to(torch.float64)).to(vec.dtype)
        fold_into(graph, conv, add, [conv.inputs[0], conv.inputs[1],
                                     add_const(graph, f"{add.name}_folded_bias", c, bias)])
    return graph

"""Pass: a Conv and the Relu after it, with a residual Add between them or not, become one op.

``Relu(Conv(x, W, b))`` becomes ``ConvRelu(x, W, b)``; ``Relu(Add(Conv(x, W, b), z))`` (the Add's
operands in either order) becomes ``ConvAddRelu(x, W, b, z)``: cuDNN applies the epilogue inside
the convolution (``ops/conv_act.py``, measured there). The Conv's output, and the Add's, must be
read by nothing else; ``z`` must be able to have the convolution's shape (a constant, a bias that
broadcasts, stays as it is; static shape inference does not follow a dim through a convolution, so
equality is left to the op: a call where the shapes differ runs the replaced nodes, counted). When
both operands of the Add are convolutions (a ResNet block whose shortcut is projected), the one
computed last takes the Add: the fused node runs where the Relu was, and the other convolution's
input would otherwise stay alive until then. Runs after ``fold_conv_bn`` and
``channels_last``, which look for plain Conv nodes.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from .patterns import fuse, only_feeds, producer


def _conv_of(graph: Graph, v, users: list[Node]) -> Node | None:
    conv = producer(v, "Conv")
    if conv is None or not only_feeds(v, users, graph) or len(conv.outputs) != 1:
        return None
    return conv


def _may_match(y: Value, z: Value) -> bool:
    if z.is_const or y.shape is None or z.shape is None or len(y.shape) != len(z.shape):
        return False
    return not any(a.is_static and b.is_static and a.min != b.min for a, b in zip(y.shape, z.shape))


def _inputs(conv: Node) -> list:
    return [conv.inputs[0], conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None]


def fuse_conv_relu(graph: Graph) -> Graph:
    for relu in [n for n in graph.nodes if n.op_type == "Relu" and n.domain in ("", "ai.onnx")]:
        v = relu.inputs[0]
        conv = _conv_of(graph, v, [relu])
        if conv is not None:
            fuse(graph, [conv, relu], "ConvRelu", _inputs(conv), dict(conv.attrs))
            continue
        add = producer(v, "Add")
        if add is None or not only_feeds(v, [relu], graph):
            continue
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        cands = [(order[id(c)], i, c) for i in (0, 1) if (c := _conv_of(graph, add.inputs[i], [add])) is not None]
        if not cands:
            continue
        _, i, conv = max(cands, key=lambda t: t[0])
        if not _may_match(conv.outputs[0], add.inputs[1 - i]):
            continue
        fuse(graph, [conv, add, relu], "ConvAddRelu", [*_inputs(conv), add.inputs[1 - i]], dict(conv.attrs))
    return graph

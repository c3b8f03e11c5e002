"""Pass (CPU): a squeeze-and-excitation block becomes one ``SqueezeExcite`` node.

The block, after ``fuse_conv_activation``: ``GlobalAveragePool(x)`` -> ``ConvAct`` 1x1 (ReLU or
none) -> ``ConvAct`` 1x1 (none, then a ``HardSigmoid`` or ``Sigmoid`` node; or with the hard sigmoid
as its post-op, as MobileNetV3 writes it) -> ``Mul`` by the same ``x``. Each inner value read by the
next node only; the weights constant. Measured on this project's CPU (2 threads), PaddleOCR's
direction classifier at batch 1 (48 x 192): its nine blocks went from five kernels and a dozen
small torch calls each to one C call (ops/squeeze_excite.py).
"""

from __future__ import annotations

from ..ir import Graph, Node
from ..ops.elementwise import SIXTH
from .patterns import FUSED_DOMAIN, fuse, only_feeds

_STD = ("", "ai.onnx")


def _conv_1x1(node: Node | None, acts: tuple[str, ...]) -> bool:
    if node is None or node.op_type != "ConvAct" or node.domain != FUSED_DOMAIN or len(node.outputs) != 1:
        return False
    a = node.attrs
    w = node.inputs[1]
    return (a.get("activation") in acts and a.get("group", 1) == 1 and list(a.get("strides", [1, 1])) == [1, 1]
            and not any(a.get("pads", [0] * 4)) and not a.get("act_exact", 0) and w is not None and w.is_const
            and w.const.dim() == 4 and tuple(w.const.shape[2:]) == (1, 1)
            and (len(node.inputs) < 3 or node.inputs[2] is None or node.inputs[2].is_const))


def _single_user(node: Node, graph: Graph) -> Node | None:
    users = node.outputs[0].users
    if len(users) != 1 or not only_feeds(node.outputs[0], users, graph):
        return None
    return users[0]


def _gate(node: Node) -> tuple[str, float, float] | None:
    """(gate, alpha, beta) of a gate node after the second convolution, or None."""
    if node.op_type == "HardSigmoid" and node.domain in _STD:
        return "hardsigmoid", float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    if node.op_type == "HardSigmoid" and node.domain == FUSED_DOMAIN:
        return "hardsigmoid", SIXTH, 0.5
    if node.op_type == "Sigmoid" and node.domain in _STD:
        return "sigmoid", 1.0, 0.0
    return None


def fuse_squeeze_excite(graph: Graph) -> Graph:
    for gap in [n for n in graph.nodes if n.op_type == "GlobalAveragePool" and n.domain in _STD]:
        x = gap.inputs[0]
        c1 = _single_user(gap, graph)
        if not _conv_1x1(c1, ("relu", "none")):
            continue
        c2 = _single_user(c1, graph)
        if not _conv_1x1(c2, ("none", "hardsigmoid", "sigmoid")):
            continue
        chain = [gap, c1, c2]
        act = c2.attrs["activation"]
        if act == "none":
            g = _single_user(c2, graph)
            gate = _gate(g) if g is not None else None
            if gate is None:
                continue
            chain.append(g)
        else:
            gate = (act, SIXTH, 0.5) if act == "hardsigmoid" else ("sigmoid", 1.0, 0.0)
        mul = _single_user(chain[-1], graph)
        if mul is None or mul.op_type != "Mul" or mul.domain not in _STD or len(mul.inputs) != 2:
            continue
        other = mul.inputs[0] if mul.inputs[1] is chain[-1].outputs[0] else mul.inputs[1]
        if other is not x:
            continue
        w1, w2 = c1.inputs[1], c2.inputs[1]
        if w1.const.shape[1] != w2.const.shape[0] or w2.const.shape[1] != w1.const.shape[0]:
            continue
        b1 = c1.inputs[2] if len(c1.inputs) > 2 else None
        b2 = c2.inputs[2] if len(c2.inputs) > 2 else None
        fuse(graph, [*chain, mul], "SqueezeExcite", [x, w1, b1, w2, b2],
             {"act1": c1.attrs["activation"], "gate": gate[0], "alpha": gate[1], "beta": gate[2]})
    return graph

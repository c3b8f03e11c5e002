"""Pass: the readers of an Identity's output read its input instead, and the Identity goes.
A Concat of one input is one too (GPT-2 as onnxruntime's optimizer writes it concatenates the first
layer's past key alone, then with the new key: the past was copied twice per decode step), and so
is a product by, or a division by, a constant one that does not broadcast the tensor (exact in
IEEE arithmetic, NaN and signed zeros included): Paddle2ONNX writes SiLU as ``x * sigmoid(1 * x)``.

Paddle2ONNX writes an Identity after many of its ops (PaddleOCR's v5 / v6 detector: between
every convolution's bias Add and its activation), which hides the pair from the fusion passes
that follow (a Conv and its activation, GELU's arithmetic). The generated code already made the
Identity an alias; without it the patterns meet. An Identity whose output the graph returns, or
that a subgraph reads from its enclosing scope, stays.
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node, Value
from .patterns import remove, reroute

_STD = ("", "ai.onnx")


def _one(c: Value | None, x: Value) -> bool:
    """``c`` a constant 1 of ``x``'s element type that broadcasts into x without growing it."""
    t = None if c is None else c.const
    return (isinstance(t, torch.Tensor) and t.numel() == 1 and x.shape is not None and t.dim() <= len(x.shape)
            and c.elem_type == x.elem_type and bool(t.reshape(()) == 1))


def _passes_through(node: Node) -> Value | None:
    """The input whose values ``node`` hands on unchanged, if it is such a node."""
    if node.domain not in _STD:
        return None
    ins = node.inputs
    if node.op_type in ("Identity", "Concat") and len(ins) == 1:
        return ins[0]
    if node.op_type == "Mul" and len(ins) == 2 and ins[0] is not None and ins[1] is not None:
        for x, c in ((ins[0], ins[1]), (ins[1], ins[0])):
            if not x.is_const and _one(c, x):
                return x
    if node.op_type == "Div" and len(ins) == 2 and ins[0] is not None and not ins[0].is_const and _one(ins[1], ins[0]):
        return ins[0]
    return None


def skip_identities(graph: Graph) -> Graph:
    outputs = {id(v) for v in graph.outputs}
    gone = set()
    for node in graph.nodes:
        src = _passes_through(node)
        out = node.outputs[0] if node.outputs else None
        if src is None or out is None or id(out) in outputs or out.elem_type != src.elem_type:
            continue
        if any(out is v for u in out.users for sub in u.subgraphs.values() for v in sub.outer):
            continue
        reroute(out, src)
        gone.add(id(node))
    remove(graph, gone)
    return graph

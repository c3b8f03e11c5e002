"""Pass: the readers of an Identity's output read its input instead, and the Identity goes.
A Concat of one input is one too (GPT-2 as onnxruntime's optimizer writes it concatenates the first
layer's past key alone, then with the new key: the past was copied twice per decode step).

Paddle2ONNX writes an Identity after many of its ops (PaddleOCR's v5 / v6 detector: between
every convolution's bias Add and its activation), which hides the pair from the fusion passes
that follow (a Conv and its activation, GELU's arithmetic). The generated code already made the
Identity an alias; without it the patterns meet. An Identity whose output the graph returns, or
that a subgraph reads from its enclosing scope, stays.
"""

from __future__ import annotations

from ..ir import Graph
from .patterns import remove, reroute


def skip_identities(graph: Graph) -> Graph:
    outputs = {id(v) for v in graph.outputs}
    gone = set()
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or len(node.inputs) != 1 or node.op_type not in ("Identity", "Concat"):
            continue
        src, out = node.inputs[0], node.outputs[0]
        if src is None or out is None or id(out) in outputs or out.elem_type != src.elem_type:
            continue
        if any(out is v for u in out.users for sub in u.subgraphs.values() for v in sub.outer):
            continue
        reroute(out, src)
        gone.add(id(node))
    remove(graph, gone)
    return graph

"""Pass: one forward walk that infers shapes and folds constants, each feeding the other."""

from __future__ import annotations

from ..ir import Graph
from .constant_folding import fold_node
from .shape_inference import infer_if, infer_node


def propagate(graph: Graph) -> Graph:
    for node in graph.nodes:
        infer_node(node)
        node.folded = fold_node(node)
        for sub in node.subgraphs.values():
            propagate(sub)
        if node.op_type == "If" and node.domain == "":
            infer_if(node)
    return graph

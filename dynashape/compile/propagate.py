"""Pass: one forward walk that infers shapes and folds constants, each feeding the other."""

from __future__ import annotations

from ..ir import Graph
from . import partial_values
from .constant_folding import fold_node
from .shape_inference import infer_if, infer_node


def propagate(graph: Graph) -> Graph:
    known: dict[int, list] = {}  # shape tensors known in part (partial_values.py), by value id
    for node in graph.nodes:
        infer_node(node, known)
        node.folded = fold_node(node)
        if node.outputs and node.outputs[0] is not None and not node.outputs[0].is_const:
            entries = partial_values.derive(node, known)
            if entries is not None:
                known[id(node.outputs[0])] = entries
        for sub in node.subgraphs.values():
            propagate(sub)
        if node.op_type == "If" and node.domain == "":
            infer_if(node)
    return graph

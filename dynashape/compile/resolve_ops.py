"""Pass: attach an OpDef to every node (subgraphs too); unsupported ops fail here, at load."""

from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import Graph
from ..ops import lookup


def resolve_ops(graph: Graph) -> Graph:
    for node in graph.nodes:
        opdef = lookup(node.op_type, node.domain, node.opset, node.name)
        extra = sorted(set(node.attrs) - opdef.attrs)
        if extra:
            raise UnsupportedOpError(node.op_type, node.domain, node.opset, node.name,
                                     f"attribute(s) {extra} not supported; supported: {sorted(opdef.attrs)}")
        node.opdef = opdef
        if "_n_outputs" in opdef.attrs:  # ops whose outputs count is part of their meaning (Split)
            node.attrs["_n_outputs"] = _count_outputs(node)
        if "_present" in opdef.attrs:  # which outputs the graph reads: a kernel without out= cannot tell
            node.attrs["_present"] = tuple(v is not None for v in node.outputs)
        if "_out_types" in opdef.attrs:  # result types a torch dtype cannot name (INT4 is held in int8)
            node.attrs["_out_types"] = tuple(0 if v is None else v.elem_type for v in node.outputs)
        for sub in node.subgraphs.values():
            resolve_ops(sub)
    return graph


def _count_outputs(node) -> int:
    """The outputs up to the last one the node names (MaxPool without Indices counts 1)."""
    n = len(node.outputs)
    while n > 1 and node.outputs[n - 1] is None:
        n -= 1
    return n

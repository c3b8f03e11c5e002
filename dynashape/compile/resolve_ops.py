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
        for sub in node.subgraphs.values():
            resolve_ops(sub)
    return graph

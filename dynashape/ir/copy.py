"""A structural copy of a graph: new Values and Nodes, the same constants (weights are not duplicated).

A rewrite of the copy (fusion) leaves the original as it was. ``copy.deepcopy`` would recurse
along producer/user links as deep as the graph is long.
"""

from __future__ import annotations

from .graph import Graph, Node, Value

_VALUE_EXTRA = ("sym",)
_NODE_EXTRA = ("opdef", "shape_of", "folded")


def _value(v: Value, vmap: dict[int, Value]) -> Value:
    c = vmap.get(id(v))
    if c is None:
        c = vmap[id(v)] = Value(v.name, v.elem_type, v.shape, v.kind, v.const)
        for a in _VALUE_EXTRA:
            if hasattr(v, a):
                setattr(c, a, getattr(v, a))
    return c


def _copy(graph: Graph, vmap: dict[int, Value]) -> Graph:
    for v in graph.values.values():
        _value(v, vmap)
    nodes = []
    for n in graph.nodes:
        c = Node(n.op_type, n.domain, n.name, [None if v is None else _value(v, vmap) for v in n.inputs],
                 [None if v is None else _value(v, vmap) for v in n.outputs], dict(n.attrs), n.opset,
                 {k: _copy(sub, vmap) for k, sub in n.subgraphs.items()})
        for a in _NODE_EXTRA:
            if hasattr(n, a):
                setattr(c, a, getattr(n, a))
        nodes.append(c)
    out = Graph(graph.name, [_value(v, vmap) for v in graph.inputs], [_value(v, vmap) for v in graph.outputs], nodes,
                {k: _value(v, vmap) for k, v in graph.values.items()}, dict(graph.opsets),
                [_value(v, vmap) for v in graph.outer])
    out.rebuild_users()
    return out


def copy_graph(graph: Graph) -> Graph:
    return _copy(graph, {})

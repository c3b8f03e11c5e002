"""Pass: drop folded nodes and nodes that no graph output needs."""

from __future__ import annotations

from ..ir import Graph


def remove_dead_nodes(graph: Graph) -> Graph:
    needed = {id(v) for v in graph.outputs}
    keep = []
    for node in reversed(graph.nodes):
        if getattr(node, "folded", False):
            continue
        if any(v is not None and id(v) in needed for v in node.outputs):
            keep.append(node)
            # a fused node's replaced nodes may run instead of it (unfusion): what they read stays
            for n in (node, *getattr(node, "unfused", ())):
                for v in n.inputs:
                    if v is not None and not v.is_const:
                        needed.add(id(v))
            for sub in node.subgraphs.values():
                remove_dead_nodes(sub)
                needed.update(id(v) for v in sub.outer)
    graph.nodes = keep[::-1]
    graph.rebuild_users()
    return graph

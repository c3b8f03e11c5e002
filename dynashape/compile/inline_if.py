"""Pass: an If whose condition is a compile-time constant becomes the nodes of the branch it takes.

Exporters leave such Ifs behind (a sample-rate switch fixed by a constant, `if self.training`,
torch.jit's scripted checks); silero-vad nests seven. Run as a node, each costs a body call per
inference and hides its nodes from fusion and the memory plan; inlined, they are ordinary nodes.
The If's outputs stay the same Values, now made by Identity nodes (views in the generated code).
"""

from __future__ import annotations

from ..ir import Graph, Node
from ..ops import lookup
from .propagate import propagate


def inline_constant_if(graph: Graph) -> Graph:
    # An inlined branch gives its outputs shapes (an If node's are unknown), so conditions that
    # test a rank or a static dim of them fold on the next walk: repeat until nothing changes.
    for _ in range(_MAX_ROUNDS):
        if not _inline(graph):
            break
        propagate(graph)
    return graph


_MAX_ROUNDS = 16


def _inline(graph: Graph) -> bool:
    changed = False
    nodes: list[Node] = []
    for node in graph.nodes:
        for sub in node.subgraphs.values():
            changed |= _inline(sub)
        branch = _taken_branch(node)
        if branch is None:
            nodes.append(node)
            continue
        changed = True
        _adopt_values(graph, branch)
        nodes.extend(branch.nodes)
        nodes.extend(output_identities(node, branch, f"{node.name}_out"))
    if changed:
        graph.nodes = nodes
        graph.rebuild_users()
    return changed


_IDENTITY_OPSET = 16  # any Identity copies its input; which version does not matter here


def _taken_branch(node: Node) -> Graph | None:
    if node.op_type != "If" or node.domain != "" or not node.inputs or node.inputs[0] is None:
        return None
    cond = node.inputs[0].const
    if cond is None or cond.numel() != 1:
        return None
    return branch_taken(node, bool(cond.reshape(-1)[0]))


def branch_taken(node: Node, cond: bool) -> Graph | None:
    """The branch an If takes when its condition is ``cond``, where its nodes can stand in the
    If's place (also shape_program.py's, for a condition the shapes decide); None for a branch
    that yields sequences or optionals, which keep the If's own handling."""
    branch = node.subgraphs["then_branch" if cond else "else_branch"]
    if len(branch.outputs) != len(node.outputs) or any(v.kind != "tensor" for v in branch.outputs):
        return None
    return branch


def output_identities(node: Node, branch: Graph, prefix: str) -> list[Node]:
    """An Identity per output of the If ``node`` from the ``branch`` result that makes it: the If's
    outputs stay the same Values."""
    made = []
    for i, (out, res) in enumerate(zip(node.outputs, branch.outputs)):
        if out is not None:
            ident = Node("Identity", "", f"{prefix}{i}", [res], [out], {}, _IDENTITY_OPSET)
            ident.opdef = lookup("Identity", "", _IDENTITY_OPSET, ident.name)
            made.append(ident)
    return made


def _adopt_values(graph: Graph, branch: Graph) -> None:
    """The branch's own values join the graph, renamed where a name is taken (sibling branches may
    reuse names; generated code names its variables after values)."""
    outer = {id(v) for v in branch.outer}
    for v in list(branch.values.values()):
        if id(v) in outer:
            continue
        if v.name in graph.values and graph.values[v.name] is not v:
            v.name = _fresh(graph, v.name)
        graph.values[v.name] = v


def _fresh(graph: Graph, name: str) -> str:
    i = 1
    while f"{name}__{i}" in graph.values:
        i += 1
    return f"{name}__{i}"


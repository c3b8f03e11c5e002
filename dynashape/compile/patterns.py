"""Helpers the fusion passes share: walking producers, checking users, rewriting a pattern.

A fusion pass finds a pattern that ends at one node, checks that the values inside it are read
by nothing outside it, and replaces its nodes by one node of a fused op (``ops/fused.py``). The
replaced nodes are kept on the new node (``unfused``): the shape program runs them instead for a
signature the fused kernel cannot serve.
"""

from __future__ import annotations

import itertools

import torch

from ..ir import Graph, Node, Value
from ..ops.registry import lookup

FUSED_DOMAIN = "com.dynashape"
_ids = itertools.count()


# ops whose results are random: two of them on the same inputs draw different numbers, and none is
# computed once for many calls
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})


def producer(v: Value | None, op_type: str | tuple[str, ...] | None = None) -> Node | None:
    """The node producing ``v`` (of ``op_type`` when given), if any."""
    if v is None or v.producer is None:
        return None
    n = v.producer
    if op_type is not None and n.op_type not in ((op_type,) if isinstance(op_type, str) else op_type):
        return None
    if n.domain not in ("", "ai.onnx"):
        return None
    return n


def fused_producer(v: Value | None, op_type: str) -> Node | None:
    """The node of our fused op ``op_type`` (domain ``com.dynashape``) producing ``v``, if any."""
    n = v.producer if v is not None else None
    return n if n is not None and n.op_type == op_type and n.domain == FUSED_DOMAIN else None


def only_feeds(v: Value, nodes: list[Node], graph: Graph) -> bool:
    """``v`` is read by ``nodes`` only (and is no graph output): it can disappear inside a fusion."""
    if any(v is o for o in graph.outputs):
        return False
    ids = {id(n) for n in nodes}
    return all(id(u) in ids for u in v.users)


def scalar(v: Value | None) -> float | None:
    """The value of a one-element constant."""
    if v is None or not isinstance(v.const, torch.Tensor) or v.const.numel() != 1:
        return None
    return float(v.const.reshape(()).item())


def const_ints(v: Value | None) -> list[int] | None:
    if v is None or not isinstance(v.const, torch.Tensor) or v.const.is_floating_point():
        return None
    return [int(x) for x in v.const.reshape(-1).tolist()]


def add_const(graph: Graph, name: str, like: Value, t: torch.Tensor) -> Value:
    """A new constant value of ``like``'s element type, registered in the graph."""
    v = Value(name, like.elem_type, None, "tensor", t.contiguous())
    graph.values[name] = v
    return v


def fold_into(graph: Graph, node: Node, folded: Node, inputs: list[Value | None]) -> None:
    """``node`` (a Conv) takes ``inputs`` and ``folded``'s output; ``folded`` leaves the graph."""
    node.inputs = list(inputs)
    node.outputs = [folded.outputs[0]]
    graph.nodes = [n for n in graph.nodes if n is not folded]
    graph.rebuild_users()


def reroute(out: Value, src: Value) -> None:
    """The readers of ``out`` read ``src`` instead (the graph's users are rebuilt by ``remove``)."""
    for u in list(out.users):
        u.inputs = [src if v is out else v for v in u.inputs]


def remove(graph: Graph, gone: set[int]) -> None:
    """The nodes with these ids leave the graph."""
    if gone:
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]
        graph.rebuild_users()


def same_shape(a: Value, b: Value) -> bool:
    """Both shapes known and equal dim by dim (symbols that are provably the same)."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(x.known_equal(y) for x, y in zip(a.shape, b.shape))


def rank(v: Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def fuse(graph: Graph, nodes: list[Node], op_type: str, inputs: list[Value | None], attrs: dict) -> Node:
    """Replace ``nodes`` (the last one's outputs become the new node's) by one node of a fused op."""
    last = nodes[-1]
    od = lookup(op_type, FUSED_DOMAIN, 1)
    node = Node(op_type, FUSED_DOMAIN, f"{op_type}_{next(_ids)}_{last.name}", list(inputs), list(last.outputs),
                dict(attrs), 1)
    node.opdef = od
    node.unfused = list(nodes)
    node.shape_of = False
    gone = {id(n) for n in nodes}
    at = max(i for i, n in enumerate(graph.nodes) if id(n) in gone)
    graph.nodes = [n for i, n in enumerate(graph.nodes) if id(n) not in gone or i == at]
    graph.nodes[graph.nodes.index(last)] = node
    graph.rebuild_users()
    return node

"""Pass: a node that computes what an earlier node already computed (same op, same attributes,
the same inputs) goes; its readers read the earlier node's outputs (common subexpression
elimination, as onnxruntime's level-1 optimizer does).

Exporters repeat shape arithmetic per layer: T5's decoder builds its causal mask and its
``arange`` of positions in every block, GPT-2 as transformers exports it rebuilds the attention
mask's index chain per layer. Where the lengths change every call (a decoder without a KV cache),
each copy was recomputed by the generated code's group of that length at every call.

Inputs match by identity, small constants by value (exporters write the same 0, 1 or axes list as
many Constant nodes). Not merged: ops whose results are random (a second RandomNormal draws other
numbers), ops outside the ONNX and onnxruntime domains (a custom op may keep state), nodes with
subgraphs, a node whose outputs the graph returns (their names are the caller's) or a branch
reads from the enclosing scope, and nodes whose outputs differ in type or inferred shape from the
first's (a data-dependent op's outputs get their own symbols; readers were inferred with them).
"""

from __future__ import annotations

import numpy as np
import torch

from ..ir import Graph, Node, Value
from .patterns import RANDOM_OPS, remove, reroute

_DOMAINS = ("", "ai.onnx", "com.microsoft")
_SMALL = 64  # constants of at most this many elements compare by value, larger ones by identity


def _frozen(x):
    """A hashable stand-in for an attribute's value (None where it has none: the node is kept)."""
    if isinstance(x, (int, float, str, bytes, bool)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        items = [_frozen(i) for i in x]
        return None if any(i is None and j is not None for i, j in zip(items, x)) else ("seq", *items)
    if isinstance(x, torch.Tensor):
        # the bytes, through strides 1 whatever x's (a broadcast constant has 0), as uint8 (bfloat16
        # has no numpy type)
        flat = torch.empty(x.numel(), dtype=x.dtype)
        flat.copy_(x.detach().cpu().reshape(-1))
        return ("tensor", str(x.dtype), tuple(x.shape), flat.view(torch.uint8).numpy().tobytes())
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return ("array", x.shape, str(x.tolist()))
        return ("array", str(x.dtype), x.shape, x.tobytes())
    return None


def _input_key(v: Value | None):
    if v is None:
        return None
    t = v.const
    if isinstance(t, torch.Tensor) and t.numel() <= _SMALL:
        return ("const", v.elem_type, _frozen(t))
    return ("value", id(v))


def _key(node: Node):
    if node.domain not in _DOMAINS or node.op_type in RANDOM_OPS or node.subgraphs or not node.outputs:
        return None
    attrs = []
    for name in sorted(node.attrs):
        f = _frozen(node.attrs[name])
        if f is None and node.attrs[name] is not None:
            return None
        attrs.append((name, f))
    return (node.domain, node.op_type, node.opset, len(node.outputs), tuple(attrs),
            tuple(_input_key(v) for v in node.inputs))


def _same_results(kept: Node, dup: Node) -> bool:
    for a, b in zip(kept.outputs, dup.outputs):
        if b is None:
            continue
        if a is None or a.elem_type != b.elem_type or a.kind != b.kind or a.shape != b.shape:
            return False
    return True


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    returned = {id(v) for v in graph.outputs}
    outer = {id(v) for n in graph.nodes for sub in n.subgraphs.values() for v in sub.outer}
    seen: dict = {}
    gone: set[int] = set()
    for node in graph.nodes:
        key = _key(node)
        if key is None:
            continue
        kept = seen.get(key)
        if kept is None:
            seen[key] = node
            continue
        if any(v is not None and (id(v) in returned or id(v) in outer) for v in node.outputs) \
                or not _same_results(kept, node):
            continue
        for a, b in zip(kept.outputs, node.outputs):
            if b is not None:
                reroute(b, a)  # later nodes' keys then name the kept outputs: chains merge in one walk
        gone.add(id(node))
    remove(graph, gone)
    return graph

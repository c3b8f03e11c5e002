"""Pass (the session option ``paged_kv``, which the paged engine sets): a decoder's attention reads its
past from a paged KV pool instead of a dense past input.

    present_k = Concat(past_k, k_new, axis=2)        present_v = Concat(past_v, v_new, axis=2)
    y = Attention(q, present_k, present_v, mask)      (fuse_attention's op)
  ->
    y = PagedAttention(q, k_new, v_new, past_k.pool, past_v.pool, paged.tables, paged.starts,
                       paged.lens, paged.slots)

The new graph inputs: a pool per past input (``<past>.pool``, one layer's [blocks, block_size,
kv_heads, head_dim]) and the rows' block tables, first positions, lengths and new positions' slots
(``paged.*``, shared by the layers). The op writes the new keys and values into the pool itself,
so the caller feeds pasts of length 0 (the presents are then the new positions alone) and gathers
nothing. The mask the graph computes goes unused (the op masks by the lengths) and is removed.

All or nothing: where one attention of the graph reads its keys or values otherwise (a past that is
not a graph input, a transposed key), nothing is rewritten and ``paged_kv_refused`` on the graph
says why (the engine then gathers the pasts as before).
"""

from __future__ import annotations

import onnx

from ..ir import Graph, Value
from ..shape import Dimension, PartialShape
from .patterns import FUSED_DOMAIN, fuse, producer

SHARED = ("paged.tables", "paged.starts", "paged.lens", "paged.slots")


def _past_concat(v: Value | None, inputs: dict) -> tuple[Value, Value] | None:
    """``v = Concat(past, new)`` on the positions' axis, ``past`` a graph input: (past, new)."""
    c = producer(v, "Concat")
    if c is None or len(c.inputs) != 2 or c.inputs[0] is None or c.inputs[0].name not in inputs:
        return None
    past = c.inputs[0]
    if past.shape is None or len(past.shape) != 4 or c.attrs.get("axis") not in (2, -2):
        return None
    return past, c.inputs[1]


def paged_kv(graph: Graph) -> Graph:
    inputs = {v.name: v for v in graph.inputs}
    plan, why = [], None
    for n in graph.nodes:
        if n.op_type != "Attention" or n.domain != FUSED_DOMAIN:
            continue
        k, v = _past_concat(n.inputs[1], inputs), _past_concat(n.inputs[2], inputs)
        if k is None or v is None or n.attrs.get("k_transposed"):
            why = f"attention {n.name} does not read Concat(past input, new) keys and values"
            break
        plan.append((n, k, v))
    if why is None and not plan:
        why = "no attention over a past input"
    if why is not None:
        graph.paged_kv_refused = why
        return graph
    batch = plan[0][1][0].shape[0]
    i64 = onnx.TensorProto.INT64

    def new_input(name: str, dims, elem_type: int) -> Value:
        val = Value(name, elem_type, PartialShape(dims))
        graph.values[name] = val
        graph.inputs.append(val)
        return val

    tables = new_input("paged.tables", [batch, Dimension.dynamic("paged_width")], i64)
    starts = new_input("paged.starts", [batch], i64)
    lens = new_input("paged.lens", [batch], i64)
    slots = new_input("paged.slots", [batch, Dimension.dynamic("paged_new")], i64)
    blocks, size = Dimension.dynamic("paged_blocks"), Dimension.dynamic("paged_block_size")
    for n, (pk, k_new), (pv, v_new) in plan:
        pools = [new_input(f"{p.name}.pool", [blocks, size, p.shape[1], p.shape[3]], p.elem_type) for p in (pk, pv)]
        node = fuse(graph, [n], "PagedAttention", [n.inputs[0], k_new, v_new, *pools, tables, starts, lens, slots],
                    {"scale": n.attrs.get("scale", 1.0), "heads_last": n.attrs.get("heads_last", 0)})
        node.unfused = []  # the dense attention would read the empty pasts: never a fallback
    graph.paged_kv_refused = None
    return graph

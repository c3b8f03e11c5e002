"""Pass (the session option ``paged_kv``, which the paged engine sets): a decoder's attention reads its
past from a paged KV pool instead of a dense past input.

    present_k = Concat(past_k, k_new, axis=2)        present_v = Concat(past_v, v_new, axis=2)
    y = Attention(q, present_k, present_v, mask)      (fuse_attention's op)
  ->
    y = PagedAttention(q, k_new, v_new, past_k.pool, past_v.pool, paged.tables, paged.starts,
                       paged.lens, paged.slots, paged.qstarts)

The logits: where a graph output (not a present) is a product of rank-3 hidden states with a constant
weight (the LM head), the product takes each row's position ``paged.last`` only (``PagedLast``): a
prompt chunk's run computes and writes one row of logits, not one per position.

The new graph inputs: a pool per past input (``<past>.pool``, one layer's [blocks, block_size,
kv_heads, head_dim]) and the rows' block tables, first positions, lengths and new positions' slots
(``paged.*``, shared by the layers), and where each row's queries start among the run's tokens
(``paged.qstarts``: the rows may be packed along the tokens of a batch of one, so that decode rows
and prompt chunks share a run; the tables, starts, lengths and ``paged.last`` are then per row,
``paged_rows``, not per batch row). The op writes the new keys and values into the pool itself,
so the caller feeds pasts of length 0 (the presents are then the new positions alone) and gathers
nothing. The mask the graph computes goes unused (the op masks by the lengths) and is removed.

onnxruntime's GroupQueryAttention (the model builder's decoders) whose pasts are graph inputs becomes
``PagedGroupQueryAttention`` the same way: the rotary at each row's positions (``paged.starts``, not
the op's seqlens_k), the new keys and values into the pool, its presents the new positions only.
Only its causal form without a window, softcap, sink, bias, position_ids or quantized cache.

All or nothing: where one attention of the graph reads its keys or values otherwise (a past that is
not a graph input, a transposed key), nothing is rewritten and ``paged_kv_refused`` on the graph
says why (the engine then gathers the pasts as before).
"""

from __future__ import annotations

import onnx

from ..ir import Graph, Node, Value
from ..ops.registry import lookup
from ..shape import Dimension, PartialShape
from .patterns import FUSED_DOMAIN, fuse, producer


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
    plan, gqa, why = [], [], None
    for n in graph.nodes:
        if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft":
            why = _gqa_refusal(n, inputs)
            if why is not None:
                break
            gqa.append(n)
            continue
        if n.op_type != "Attention" or n.domain != FUSED_DOMAIN:
            continue
        k, v = _past_concat(n.inputs[1], inputs), _past_concat(n.inputs[2], inputs)
        if k is None or v is None or n.attrs.get("k_transposed"):
            why = f"attention {n.name} does not read Concat(past input, new) keys and values"
            break
        plan.append((n, k, v))
    if why is None and not plan and not gqa:
        why = "no attention over a past input"
    if why is not None:
        graph.paged_kv_refused = why
        return graph
    batch = plan[0][1][0].shape[0] if plan else gqa[0].inputs[3].shape[0]
    i64 = onnx.TensorProto.INT64

    def new_input(name: str, dims, elem_type: int) -> Value:
        val = Value(name, elem_type, PartialShape(dims))
        graph.values[name] = val
        graph.inputs.append(val)
        return val

    rows = Dimension.dynamic("paged_rows")  # the batch's rows, or (packed) the rows of a batch of one
    tables = new_input("paged.tables", [rows, Dimension.dynamic("paged_width")], i64)
    starts = new_input("paged.starts", [rows], i64)
    lens = new_input("paged.lens", [rows], i64)
    slots = new_input("paged.slots", [batch, Dimension.dynamic("paged_new")], i64)
    qstarts = new_input("paged.qstarts", [rows], i64) if plan else None
    blocks, size = Dimension.dynamic("paged_blocks"), Dimension.dynamic("paged_block_size")

    def pools(*pasts: Value) -> list[Value]:  # a layer's blocks, as inputs named after its pasts
        return [new_input(f"{p.name}.pool", [blocks, size, p.shape[1], p.shape[3]], p.elem_type) for p in pasts]

    for n, (pk, k_new), (pv, v_new) in plan:
        node = fuse(graph, [n], "PagedAttention", [n.inputs[0], k_new, v_new, *pools(pk, pv), tables, starts, lens,
                                                   slots, qstarts], {"scale": n.attrs.get("scale", 1.0)})
        node.unfused = []  # the dense attention would read the empty pasts: never a fallback
    for n in gqa:
        ins = [n.inputs[i] if i < len(n.inputs) else None for i in (0, 1, 2, 7, 8)]
        node = fuse(graph, [n], "PagedGroupQueryAttention", [*ins, *pools(n.inputs[3], n.inputs[4]), tables, starts,
                                                             lens, slots],
                    {k: n.attrs[k] for k in ("num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved")
                     if k in n.attrs})
        node.unfused = []
    graph.paged_last = _last_positions(graph, rows, lambda: new_input("paged.last", [rows], i64))
    graph.paged_kv_refused = None
    return graph


_GQA_PLAIN = {"local_window_size": -1, "softcap": 0.0, "smooth_softmax": -1, "qk_output": 0, "causal": 1,
              "kv_cache_bit_width": 0, "k_quant_type": "NONE", "v_quant_type": "NONE"}


def _gqa_refusal(n, inputs: dict) -> str | None:
    """Why a GroupQueryAttention node cannot read the pool (None: it can)."""
    if len(n.inputs) < 7 or n.inputs[3] is None or n.inputs[4] is None:
        return f"GroupQueryAttention {n.name} has no past inputs"
    if n.inputs[3].name not in inputs or n.inputs[4].name not in inputs or n.inputs[3].shape is None \
            or len(n.inputs[3].shape) != 4:
        return f"GroupQueryAttention {n.name} reads pasts that are not graph inputs"
    extra = [i for i in range(9, len(n.inputs)) if n.inputs[i] is not None]
    odd = {k: n.attrs[k] for k, v in _GQA_PLAIN.items() if k in n.attrs and n.attrs[k] != v}
    if extra or odd or len([o for o in n.outputs if o is not None]) > 3:
        return f"GroupQueryAttention {n.name} uses inputs {extra}, attributes {odd} or outputs the paged form lacks"
    return None


# the LM heads PagedLast goes before: a product of each position by constant weights (the inputs named),
# RMSNormLinear's norm included (CUDA's fuse_norm_linear: the norm is each position's own, so picking a
# row's last position before it is the same as after)
LAST_PRODUCTS = {"MatMul": (1,), "Linear": (1,), "RMSNormLinear": (1, 2)}


def _last_positions(graph: Graph, rows, last_input) -> int:
    """The LM head's product over each row's ``last`` token only (PagedLast before it: its index among
    the run's tokens flattened), [rows, 1, ...]; how many outputs were so (``last_input()`` makes the
    ``paged.last`` input at the first)."""
    last, done = None, 0
    for out in graph.outputs:
        n = out.producer
        if out.name.startswith("present") or n is None or n.op_type not in LAST_PRODUCTS \
                or len(n.inputs) <= max(LAST_PRODUCTS[n.op_type]):
            continue
        x = n.inputs[0]
        if not all(n.inputs[i] is not None and n.inputs[i].is_const for i in LAST_PRODUCTS[n.op_type]) \
                or x.shape is None or len(x.shape) != 3 or out.shape is None or len(out.shape) != 3:
            continue
        last = last or last_input()
        picked = Value(f"{x.name}.last", x.elem_type, PartialShape([rows, 1, x.shape[2]]))
        graph.values[picked.name] = picked
        node = Node("PagedLast", FUSED_DOMAIN, f"PagedLast_{out.name}", [x, last], [picked], {}, 1)
        node.opdef = lookup("PagedLast", FUSED_DOMAIN, 1)
        node.unfused = []
        node.shape_of = False
        graph.nodes.insert(graph.nodes.index(n), node)
        n.inputs[0] = picked
        out.shape = PartialShape([rows, 1, out.shape[2]])
        done += 1
    graph.rebuild_users()
    return done

"""Pass: matrix products of one input by several constant matrices become one product.

Attention's query, key and value projections, and an MLP's gate and up projections, multiply the
same activation by different weights: one product by the weights side by side
(``[in, out_1 + out_2 + ...]``, concatenated once, at load) does the same work in one kernel,
and each original result is a Slice (a view) of it; a Gemm without C (tf2onnx's projections,
weights [out, in]) is such a product too. Linear nodes (a product with a bias, from
``fuse_linear``) sharing an input merge the same way, their weights stacked along the output axis.
So do 8-bit products of one quantized activation (fuse_dynamic_quant's QMatMulCentered after one
DynQuantize, onnxruntime's MatMulIntegerToFloat): the weights side by side, their scales, zero
points and biases as per-column vectors, which gives every result bit for bit (a tiny quantized
BERT's three projections: one C call instead of three). So do onnxruntime's 4-bit MatMulNBits of one
activation (the model builder's gate and up projections) with the same K, bits, block size and
accuracy level: the packed weights, scales and zero points stacked along N, each output computed as
before (a 1B decoder's step: one kernel instead of two per layer on the GPU, one C call on the CPU).
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node, Value
from ..ops.registry import lookup
from .patterns import FUSED_DOMAIN, add_const


def _member(n: Node) -> tuple | None:
    """(the shared inputs, kind, the weight's dtype) of a product that can merge."""
    if n.op_type == "MatMul" and n.domain in ("", "ai.onnx"):
        x, w = n.inputs
        if w.is_const and w.const.dim() == 2 and w.const.is_floating_point() and x.shape is not None \
                and len(x.shape) >= 2:
            return (x,), "MatMul", w.const.dtype
    if n.op_type == "Gemm" and n.domain in ("", "ai.onnx") and len(n.inputs) == 2 and _plain(n):
        w = n.inputs[1]  # A @ B(.T) without C (beta says nothing then): a MatMul of a 2-D A
        if w.is_const and w.const.dim() == 2 and w.const.is_floating_point():
            return (n.inputs[0],), "MatMul", w.const.dtype
    if n.op_type == "Linear" and n.domain == FUSED_DOMAIN:
        x, w = n.inputs[0], n.inputs[1]
        bias = n.inputs[2] if len(n.inputs) > 2 else None
        return (x,), f"Linear{'b' if bias is not None else ''}", w.const.dtype
    q = _QUANT.get((n.op_type, n.domain))
    if q is not None:
        return _quant_member(n, *q)
    if n.op_type == "MatMulNBits" and n.domain == "com.microsoft":
        return _nbits_member(n)
    return None


def _nbits_member(n: Node) -> tuple | None:
    """A MatMulNBits whose packed weight, scales and (uint8) zero points are constants, without g_idx
    or bias: its kind holds the attributes that must agree (all but N)."""
    b, scales, zp = _at(n, 1), _at(n, 2), _at(n, 3)
    if any(_at(n, i) is not None for i in (4, 5)) or b is None or scales is None or not b.is_const \
            or not scales.is_const or (zp is not None and (not zp.is_const or zp.const.dtype != torch.uint8)):
        return None
    a = n.attrs
    if a.get("weight_prepacked") or any(k not in a for k in ("K", "N", "block_size")) \
            or b.const.shape[0] != a["N"] or b.const.dim() != 3:
        return None
    kind = (f"MatMulNBits:{a['K']}:{a.get('bits', 4)}:{a['block_size']}:{a.get('accuracy_level', 0)}"
            f":{'z' if zp is not None else ''}")
    return (n.inputs[0],), kind, scales.const.dtype


# 8-bit products of one activation by constant weights: (positions of the shared activation and its
# scale / zero point, of the weight, its scale, its zero point and the bias)
_QUANT = {
    ("QMatMulCentered", FUSED_DOMAIN): ((0, 1, 2), 3, 4, 5, 6),  # fuse_dynamic_quant's, after one DynQuantize
    ("MatMulIntegerToFloat", "com.microsoft"): ((0, 2, 4), 1, 3, 5, 6),  # onnxruntime's quantizer
}


def _plain(n: Node) -> bool:
    return n.attrs.get("alpha", 1.0) == 1.0 and not n.attrs.get("transA", 0)


def _in_out(n: Node) -> torch.Tensor:
    """A MatMul's or a Gemm's constant weight as [in, out]."""
    w = n.inputs[1].const
    return w.t() if n.op_type == "Gemm" and n.attrs.get("transB", 0) else w


def _at(n: Node, i: int) -> Value | None:
    return n.inputs[i] if i < len(n.inputs) else None


def _quant_member(n: Node, shared, wi: int, si: int, zi: int, bi: int) -> tuple | None:
    """A quantized product whose weight, scale, zero point and bias are constants (per tensor or per
    output column): merged, each becomes per column, the values unchanged, so that every result is
    the same bit for bit (the multiplier a_scale * b_scale is formed per column either way)."""
    w, ws, wz, bias = _at(n, wi), _at(n, si), _at(n, zi), _at(n, bi)
    if w is None or not w.is_const or w.const.dim() != 2 or w.const.dtype not in (torch.int8, torch.uint8):
        return None
    cols = w.const.shape[1]
    for v in (ws, wz, bias):
        if v is not None and not (v.is_const and v.const.numel() in (1, cols) and v.const.dim() <= 1):
            return None
    if ws is None or ws.const.dtype != torch.float32 or (bias is not None and bias.const.numel() != cols):
        return None
    kind = f"{n.op_type}:{'z' if wz is not None else ''}{'b' if bias is not None else ''}"
    return tuple(_at(n, i) for i in shared), kind, w.const.dtype


def fuse_parallel_matmul(graph: Graph) -> Graph:
    groups: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        m = _member(n)
        if m is not None:
            groups.setdefault((tuple(id(v) for v in m[0]), m[1], m[2]), []).append(n)
    for (_, kind, _), nodes in groups.items():
        if len(nodes) > 1:
            if kind.startswith("MatMulNBits:"):
                _merge_nbits(graph, nodes)
            elif ":" in kind:
                _merge_quant(graph, nodes)
            else:
                _merge(graph, nodes, kind)
    graph.rebuild_users()
    return graph


def _merge_quant(graph: Graph, nodes: list[Node]) -> None:
    """One quantized product by the weights side by side, their scales, zero points and biases
    as per-column vectors; each original result a Slice of it."""
    first = nodes[0]
    shared, wi, si, zi, bi = _QUANT[(first.op_type, first.domain)]

    def columns(i: int, n: Node) -> torch.Tensor:
        t = n.inputs[i].const.reshape(-1)
        cols = n.inputs[wi].const.shape[1]
        return t.expand(cols) if t.numel() == 1 else t

    ins = list(first.inputs) + [None] * (7 - len(first.inputs))
    ins[wi] = add_const(graph, f"{first.name}_merged_weight", first.inputs[wi],
                        torch.cat([n.inputs[wi].const for n in nodes], 1))
    for i, what in ((si, "scale"), (zi, "zero_point"), (bi, "bias")):
        if _at(first, i) is not None:
            ins[i] = add_const(graph, f"{first.name}_merged_{what}", first.inputs[i],
                               torch.cat([columns(i, n) for n in nodes]))
    while ins and ins[-1] is None:
        ins.pop()
    merged = Node(first.op_type, first.domain, f"{first.name}_merged", ins, [], dict(first.attrs), first.opset)
    _replace_by_slices(graph, nodes, merged, [n.inputs[wi].const.shape[1] for n in nodes])


def _merge_nbits(graph: Graph, nodes: list[Node]) -> None:
    """One MatMulNBits by the packed weights [N, blocks, bytes], scales and zero points stacked along N
    (each in its own layout, flat or not, as the first node's); each original result a Slice of it."""
    first = nodes[0]
    ns = [n.attrs["N"] for n in nodes]
    ins = list(first.inputs[:4]) + [None] * (4 - len(first.inputs[:4]))
    for i, what in ((1, "weight"), (2, "scales"), (3, "zero_points")):
        if ins[i] is None:
            continue
        parts = [n.inputs[i].const.reshape(size, -1) for n, size in zip(nodes, ns)]
        stacked = torch.cat(parts, 0).reshape(sum(ns), *first.inputs[i].const.shape[1:]) \
            if first.inputs[i].const.dim() > 1 else torch.cat(parts, 0).reshape(-1)
        ins[i] = add_const(graph, f"{first.name}_merged_{what}", first.inputs[i], stacked.contiguous())
    while ins and ins[-1] is None:
        ins.pop()
    merged = Node(first.op_type, first.domain, f"{first.name}_merged", ins, [], {**first.attrs, "N": sum(ns)},
                  first.opset)
    _replace_by_slices(graph, nodes, merged, ns)


def _merge(graph: Graph, nodes: list[Node], kind: str) -> None:
    x = nodes[0].inputs[0]
    first = nodes[0]
    out_axis = 1 if kind == "MatMul" else 0  # MatMul weights are [in, out]; Linear's [out, in]
    ws = [_in_out(n) if kind == "MatMul" else n.inputs[1].const for n in nodes]
    sizes = [w.shape[out_axis] for w in ws]
    w = add_const(graph, f"{first.name}_merged_weight", first.inputs[1], torch.cat(ws, out_axis).contiguous())
    ins = [x, w]
    if kind == "Linearb":
        ins.append(add_const(graph, f"{first.name}_merged_bias", nodes[0].inputs[2],
                          torch.cat([n.inputs[2].const.reshape(-1) for n in nodes])))
    domain = "" if kind == "MatMul" else FUSED_DOMAIN
    opset = (first.opset if first.op_type == "MatMul" else 13) if kind == "MatMul" else 1
    merged = Node(kind[:6] if kind != "MatMul" else "MatMul", domain, f"{first.name}_merged", ins, [], {}, opset)
    _replace_by_slices(graph, nodes, merged, sizes)


def _replace_by_slices(graph: Graph, nodes: list[Node], merged: Node, sizes: list[int]) -> None:
    """``merged`` (its inputs set, no outputs yet) in place of ``nodes``, whose results become Slices
    of its result along the last axis, ``sizes`` wide each."""
    first = nodes[0]
    x = first.inputs[0]
    out = Value(merged.name, first.outputs[0].elem_type, None, "tensor")
    graph.values[out.name] = out
    merged.outputs = [out]
    merged.opdef = lookup(merged.op_type, merged.domain, merged.opset)
    merged.shape_of = False
    slice_def = lookup("Slice", "", 13)
    new_nodes = [merged]
    start = 0
    axes = add_const(graph, f"{first.name}_merged_axes", x, torch.tensor([-1], dtype=torch.int64))
    axes.elem_type = 7
    for n, size in zip(nodes, sizes):
        starts = add_const(graph, f"{n.name}_start", x, torch.tensor([start], dtype=torch.int64))
        ends = add_const(graph, f"{n.name}_end", x, torch.tensor([start + size], dtype=torch.int64))
        starts.elem_type = ends.elem_type = 7
        s = Node("Slice", "", f"{n.name}_part", [out, starts, ends, axes], list(n.outputs), {}, 13)
        s.opdef = slice_def
        s.shape_of = False
        new_nodes.append(s)
        start += size
    gone = {id(n) for n in nodes}
    at = graph.nodes.index(first)
    graph.nodes = [n for n in graph.nodes[:at] if id(n) not in gone] + new_nodes + \
                  [n for n in graph.nodes[at:] if id(n) not in gone]

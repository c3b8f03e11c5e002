"""Pass: matrix products of one input by several constant matrices become one product.

Attention's query, key and value projections, and an MLP's gate and up projections, multiply the
same activation by different weights: one product by the weights side by side
(``[in, out_1 + out_2 + ...]``, concatenated once, at load) does the same work in one kernel,
and each original result is a Slice (a view) of it. Linear nodes (a product with a bias, from
``fuse_linear``) sharing an input merge the same way, their weights stacked along the output axis.
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node, Value
from ..ops.registry import lookup
from .patterns import FUSED_DOMAIN, add_const


def _member(n: Node) -> tuple | None:
    """(input, kind, the output-axis sizes' source weight, bias) of a product that can merge."""
    if n.op_type == "MatMul" and n.domain in ("", "ai.onnx"):
        x, w = n.inputs
        if w.is_const and w.const.dim() == 2 and w.const.is_floating_point() and x.shape is not None \
                and len(x.shape) >= 2:
            return x, "MatMul", w.const.dtype
    if n.op_type == "Linear" and n.domain == FUSED_DOMAIN:
        x, w = n.inputs[0], n.inputs[1]
        bias = n.inputs[2] if len(n.inputs) > 2 else None
        return x, f"Linear{'b' if bias is not None else ''}", w.const.dtype
    return None


def fuse_parallel_matmul(graph: Graph) -> Graph:
    groups: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        m = _member(n)
        if m is not None:
            groups.setdefault((id(m[0]), m[1], m[2]), []).append(n)
    for (_, kind, _), nodes in groups.items():
        if len(nodes) > 1:
            _merge(graph, nodes, kind)
    graph.rebuild_users()
    return graph


def _merge(graph: Graph, nodes: list[Node], kind: str) -> None:
    x = nodes[0].inputs[0]
    first = nodes[0]
    out_axis = 1 if kind == "MatMul" else 0  # MatMul weights are [in, out]; Linear's [out, in]
    ws = [n.inputs[1].const for n in nodes]
    sizes = [w.shape[out_axis] for w in ws]
    w = add_const(graph, f"{first.name}_merged_weight", first.inputs[1], torch.cat(ws, out_axis))
    ins = [x, w]
    if kind == "Linearb":
        ins.append(add_const(graph, f"{first.name}_merged_bias", nodes[0].inputs[2],
                          torch.cat([n.inputs[2].const.reshape(-1) for n in nodes])))
    out = Value(f"{first.name}_merged", first.outputs[0].elem_type, None, "tensor")
    graph.values[out.name] = out
    domain = "" if kind == "MatMul" else FUSED_DOMAIN
    opset = first.opset if kind == "MatMul" else 1
    merged = Node(kind[:6] if kind != "MatMul" else "MatMul", domain, out.name, ins, [out], {}, opset)
    merged.opdef = lookup(merged.op_type, domain, opset)
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

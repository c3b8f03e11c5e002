"""Pass: a MatMul by a constant matrix followed by a bias Add becomes one Linear.

``Add(MatMul(x, W), b)`` with W a constant [in, out] and b a constant [out] is ``F.linear(x, W.T,
b)``: one call (addmm under the hood) instead of two. The weight is stored transposed once, at
load, in the layout F.linear takes ([out, in], row-major, as nn.Linear keeps it): the
update_weights step of the design notes, done when the graph is compiled, not per call.
"""

from __future__ import annotations

from ..ir import Graph, Value
from .patterns import fuse


def _transposed(graph: Graph, w: Value) -> Value:
    name = f"{w.name}_T"
    t = graph.values.get(name)
    if t is None:
        t = Value(name, w.elem_type, None, "tensor", w.const.t().contiguous())
        graph.values[name] = t
    return t


def fuse_linear(graph: Graph) -> Graph:
    for mm in [n for n in graph.nodes if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]:
        x, w = mm.inputs
        out = mm.outputs[0]
        if not w.is_const or w.const.dim() != 2 or not w.const.is_floating_point() or x.shape is None \
                or len(x.shape) < 2 or len(out.users) != 1 or any(out is o for o in graph.outputs):
            continue
        add = out.users[0]
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
            continue
        b = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
        if not b.is_const or b.const.numel() != w.const.shape[1] or b.const.dtype != w.const.dtype or (
                b.const.dim() > 1 and any(d != 1 for d in b.const.shape[:-1])) or b.const.dim() > len(x.shape):
            continue  # (a bias of more dims than the product would add axes to the result)
        if b.const.dim() != 1:
            flat = Value(f"{b.name}_flat", b.elem_type, None, "tensor", b.const.reshape(-1).contiguous())
            graph.values[flat.name] = flat
            b = flat
        fuse(graph, [mm, add], "Linear", [x, _transposed(graph, w), b], {})
    return graph

"""Passes: the residual add joins the product before it, the SwiGLU gate joins its SiLU.

``Add(MatMul(x, W), r)`` (or ``Add(Linear(x, W), r)`` without a bias), W a constant matrix and
``r`` a tensor of the product's shape, becomes ``MatMulAdd(x, W, r)``: BLAS adds ``r`` in the
product's epilogue. A decoder layer ends both of its branches so (attention output projection,
MLP down projection): two kernels fewer per layer in a decode step, where each is a few
microseconds of a step bound by kernel latencies. Runs after ``linear_layout`` (the weight in
the layout chosen for the device; ``transposed`` says which).

``Mul(Silu(a), b)`` with ``a`` and ``b`` of one shape becomes ``SiluMul(a, b)`` (one kernel).
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from .patterns import FUSED_DOMAIN, fuse, only_feeds, producer


def _fused(v: Value, op_type: str) -> Node | None:
    """The node of our fused op ``op_type`` producing ``v``, if any."""
    n = v.producer if v is not None else None
    return n if n is not None and n.op_type == op_type and n.domain == FUSED_DOMAIN else None


def _same_shape(a: Value, b: Value) -> bool:
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(x.known_equal(y) for x, y in zip(a.shape, b.shape))


def fuse_matmul_add(graph: Graph) -> Graph:
    for add in [n for n in graph.nodes if n.op_type == "Add" and n.domain in ("", "ai.onnx")]:
        for p, r in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            mm = producer(p, "MatMul") or _fused(p, "Linear")
            if mm is None or p is r or r.is_const or not only_feeds(p, [add], graph) or not _same_shape(p, r):
                continue
            if r.elem_type != p.elem_type:
                continue
            x, w = mm.inputs[0], mm.inputs[1]
            if mm.op_type == "Linear" and (len(mm.inputs) > 2 and mm.inputs[2] is not None):
                continue  # a bias already rides the product's epilogue
            if w is None or not w.is_const or w.const.dim() != 2 or not w.const.is_floating_point():
                continue
            if x.shape is None or len(x.shape) < 2:
                continue
            fuse(graph, [mm, add], "MatMulAdd", [x, w, r], {"transposed": int(mm.op_type == "Linear")})
            break
    return graph


def fuse_silu_mul(graph: Graph) -> Graph:
    for mul in [n for n in graph.nodes if n.op_type == "Mul" and n.domain in ("", "ai.onnx")]:
        for s, b in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            silu = _fused(s, "Silu")
            if silu is None or s is b or not only_feeds(s, [mul], graph) or not _same_shape(s, b):
                continue
            if silu.inputs[0].elem_type != b.elem_type:
                continue
            fuse(graph, [silu, mul], "SiluMul", [silu.inputs[0], b], {})
            break
    return graph

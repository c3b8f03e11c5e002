"""Passes: the residual add joins the product before it, the SwiGLU gate joins its SiLU.

``Add(MatMul(x, W), r)`` (or ``Add(Linear(x, W), r)`` without a bias), W a constant matrix and
``r`` a tensor of the product's shape, becomes ``MatMulAdd(x, W, r)``: BLAS adds ``r`` in the
product's epilogue. A decoder layer ends both of its branches so (attention output projection,
MLP down projection): two kernels fewer per layer in a decode step, where each is a few
microseconds of a step bound by kernel latencies. Runs after ``linear_layout`` (the weight in
the layout chosen for the device; ``transposed`` says which).

``Mul(Silu(a), b)`` with ``a`` and ``b`` of one shape becomes ``SiluMul(a, b)`` (one kernel), and a
``MatMulAdd`` over it ``GatedMatMulAdd`` (the gate computed as the product reads its input).

``Linear(RMSNorm(x, g), W)`` (W in the [out, in] layout, float32, bfloat16 or float16 as g is, no
bias, the norm read by nothing else) becomes ``RMSNormLinear(x, g, W)``: for a single row (a
batch-1 decode step) one Triton kernel normalises the row and multiplies it (the norm's kernel
gone, the product read faster than cuBLAS reads it at one row: benchmarks/gemv_triton.py); for
more rows the two kernels as before.
"""

from __future__ import annotations

from ..ir import Graph
from ..ops.residual import TRITON_DTYPES
from .patterns import FUSED_DOMAIN, fuse, fused_producer, only_feeds, producer, same_shape


def fuse_matmul_add(graph: Graph) -> Graph:
    for add in [n for n in graph.nodes if n.op_type == "Add" and n.domain in ("", "ai.onnx")]:
        for p, r in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            mm = producer(p, "MatMul") or fused_producer(p, "Linear")
            if mm is None or p is r or r.is_const or not only_feeds(p, [add], graph) or not same_shape(p, r):
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
            silu = fused_producer(s, "Silu")
            if silu is None or s is b or not only_feeds(s, [mul], graph) or not same_shape(s, b):
                continue
            if silu.inputs[0].elem_type != b.elem_type:
                continue
            fuse(graph, [silu, mul], "SiluMul", [silu.inputs[0], b], {})
            break
    return graph


def fuse_gated_matmul_add(graph: Graph) -> Graph:
    """``MatMulAdd(SiluMul(a, b), W, r)``, the gate read by nothing else, becomes
    ``GatedMatMulAdd(a, W, r, b)``: at one row (a batch-1 decode step) one kernel for the gate, the
    down projection and the residual. Runs after ``fuse_silu_mul`` and ``fuse_matmul_add``."""
    for mm in [n for n in graph.nodes if n.op_type == "MatMulAdd" and n.domain == FUSED_DOMAIN]:
        x = mm.inputs[0]
        gate = fused_producer(x, "SiluMul")
        if gate is None or not only_feeds(x, [mm], graph):
            continue
        fuse(graph, [gate, mm], "GatedMatMulAdd", [gate.inputs[0], mm.inputs[1], mm.inputs[2], gate.inputs[1]],
             dict(mm.attrs))
    return graph


def fuse_norm_linear(graph: Graph) -> Graph:
    for lin in [n for n in graph.nodes if n.op_type == "Linear" and n.domain == FUSED_DOMAIN]:
        x, w = lin.inputs[0], lin.inputs[1]
        norm = fused_producer(x, "RMSNorm")
        if norm is None or (len(lin.inputs) > 2 and lin.inputs[2] is not None) or not only_feeds(x, [lin], graph):
            continue
        if not w.is_const or w.const.dim() != 2 or w.const.dtype not in TRITON_DTYPES:  # the one-row kernel's
            continue
        g = norm.inputs[1] if len(norm.inputs) > 1 else None
        if g is None or not g.is_const or g.const.dtype != w.const.dtype:
            continue
        fuse(graph, [norm, lin], "RMSNormLinear", [norm.inputs[0], g, w], {"epsilon": norm.attrs.get("epsilon", 1e-5)})
    return graph

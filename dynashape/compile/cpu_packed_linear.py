"""Pass (CPU): products by a constant float32 matrix become ``PackedLinear``: oneDNN with the
weight packed once at load (``ops/packed_linear.py`` says why: MKL's products on the
AMD CPU measured were 1.2-6x slower at 1-256 rows).

``MatMul(x, W)`` with W a constant [in, out], ``Linear(x, W.T, b)`` (fuse_linear's) and a plain
``Gemm(x, W, b)`` (alpha and beta 1, W either way; ddddocr's classifier, 1024 -> 8210, took 56% of
its CPU time in MKL's product) are rewritten, all reading W as the model has it (fuse_linear's
transposed copy goes: the plain weight is held once, shared with the unfused graph, plus its packed
copy); the weight is packed here, so the first call does not pay for it. x must have at least 2
dims (a 1-D x is a vector product the MatMul keeps).
"""

from __future__ import annotations

from ..ir import Graph
from ..ops import packed_linear
from .patterns import FUSED_DOMAIN, fuse


def cpu_packed_linear(graph: Graph) -> Graph:
    if not packed_linear.available():
        return graph
    for node in list(graph.nodes):
        std = node.domain in ("", "ai.onnx")
        if node.op_type == "MatMul" and std:
            x, w = node.inputs
            bias, transposed = None, 1
        elif node.op_type == "Linear" and node.domain == FUSED_DOMAIN:
            x, w = node.inputs[:2]
            bias, transposed = (node.inputs[2] if len(node.inputs) > 2 else None), 0
            mm = next((n for n in getattr(node, "unfused", ()) if n.op_type == "MatMul"), None)
            if mm is not None and mm.inputs[1] is not None and mm.inputs[1].is_const:
                # the weight as the model has it ([in, out], shared with the unfused graph):
                # fuse_linear's transposed copy is then read by nothing and goes
                w, transposed = mm.inputs[1], 1
        elif node.op_type == "Gemm" and std and _plain_gemm(node):
            x, w = node.inputs[:2]
            bias, transposed = (node.inputs[2] if len(node.inputs) > 2 else None), 1 - node.attrs.get("transB", 0)
        else:
            continue
        gemm = node.op_type == "Gemm"  # its A is 2-D, whatever static inference could say of it
        if x is None or (not gemm and (x.shape is None or len(x.shape) < 2)) or w is None or not w.is_const:
            continue
        if not packed_linear.packable(w.const) or (bias is not None and not (
                bias.is_const and bias.const.dim() == 1 and bias.const.dtype == w.const.dtype)):
            continue
        packed_linear.pack(w.const, bool(transposed))  # at load: the first call finds it ready
        old = node.inputs[1]
        fused = fuse(graph, [node], "PackedLinear", [x, w, bias] if bias is not None else [x, w],
                     {"transposed": transposed})
        if node.op_type == "Linear":
            fused.unfused = list(getattr(node, "unfused", [node]))  # the MatMul and Add it replaced
            if old is not w and not old.users and not any(old is o for o in graph.outputs):
                graph.values.pop(old.name, None)
    return graph


def _plain_gemm(node) -> bool:
    """A Gemm that is ``A @ B(.T) + C``: alpha 1, A not transposed, C absent (beta then says
    nothing: tf2onnx writes beta 0 there) or, with beta 1, a vector of the output's columns (the
    product's bias)."""
    a = node.attrs
    b, c = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    if b is None or not b.is_const or b.const.dim() != 2:
        return False
    cols = b.const.shape[0] if a.get("transB", 0) else b.const.shape[1]
    return (a.get("alpha", 1.0) == 1.0 and not a.get("transA", 0)
            and (c is None or (a.get("beta", 1.0) == 1.0 and c.is_const and c.const.dim() == 1
                               and c.const.shape[0] == cols)))

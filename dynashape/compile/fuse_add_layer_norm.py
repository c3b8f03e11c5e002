"""Pass: a residual add and the LayerNormalization after it become ``AddLayerNorm`` (one kernel).

``LayerNormalization(Add(y, r))`` over the last axis, the sum read by the norm only, ``y`` and ``r``
of one shape and element type, only the norm's ``Y`` output read (its mean and inverse deviation
are training's), becomes ``AddLayerNorm(y, r, gamma, beta)``: a post-norm transformer layer (BERT,
RoBERTa, the exports of transformers' encoders) ends both of its branches so. On CUDA the op is one
Triton kernel where the dynamic path ran three (ops/add_layer_norm.py); CUDA only, as the other
kernel-count fusions (pipeline.py). A scale or bias that is not one constant per column (an input,
or one that broadcasts) keeps the nodes.
"""

from __future__ import annotations

from ..ir import Graph
from .patterns import fuse, only_feeds, producer, rank, same_shape

_FLOATS = (1, 10, 16)  # onnx float32, float16, bfloat16


def _per_column(v, h) -> bool:
    return v is not None and v.is_const and v.const.dim() == 1 and h is not None and v.const.shape[0] == h


def fuse_add_layer_norm(graph: Graph) -> Graph:
    for ln in [n for n in graph.nodes if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx")]:
        x = ln.inputs[0]
        r = rank(x)
        if r is None or r < 1 or ln.attrs.get("axis", -1) not in (-1, r - 1):
            continue
        if ln.attrs.get("stash_type", 1) != 1 and x.elem_type != 1:  # half statistics: not the kernel's
            continue
        if any(o is not None and o.users for o in ln.outputs[1:]) or any(
                o is not None and o in graph.outputs for o in ln.outputs[1:]):
            continue
        add = producer(x, "Add")
        if add is None or not only_feeds(x, [ln], graph):
            continue
        a, b = add.inputs[0], add.inputs[1]
        if a is b or not same_shape(a, b) or not same_shape(a, x) or a.elem_type != b.elem_type \
                or a.elem_type not in _FLOATS:
            continue
        h = int(x.shape[-1]) if x.shape[-1].is_static else None
        gamma, beta = ln.inputs[1], ln.inputs[2] if len(ln.inputs) > 2 else None
        if not _per_column(gamma, h) or (beta is not None and not _per_column(beta, h)):
            continue
        node = fuse(graph, [add, ln], "AddLayerNorm", [a, b, gamma, beta],
                    {"epsilon": float(ln.attrs.get("epsilon", 1e-5))})
        node.outputs = node.outputs[:1]
    return graph

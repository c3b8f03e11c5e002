"""Pass: a BatchNormalization (inference) right after a Conv is folded into the Conv's weights.

``BN(Conv(x, W, b))`` with constant scale, bias, mean and variance is ``Conv(x, W', b')`` with
``W' = W * s`` (per output channel) and ``b' = (b - mean) * s + bias``, ``s = scale / sqrt(var +
eps)``: one kernel and one buffer fewer, at no cost per call.
"""

from __future__ import annotations

import torch

from ..ir import Graph
from .patterns import add_const, fold_into


def fold_conv_bn(graph: Graph) -> Graph:
    for bn in [n for n in graph.nodes if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")]:
        conv = bn.inputs[0].producer if bn.inputs[0] is not None else None
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
            continue
        if len(bn.inputs[0].users) != 1 or any(bn.inputs[0] is o for o in graph.outputs):
            continue
        if sum(v is not None for v in bn.outputs) != 1 or bn.attrs.get("training_mode", 0):
            continue
        w = conv.inputs[1]
        b = conv.inputs[2] if len(conv.inputs) > 2 else None
        params = bn.inputs[1:5]
        if not w.is_const or (b is not None and not b.is_const) or \
                not all(p is not None and p.is_const for p in params):
            continue
        scale, bias, mean, var = (p.const.to(torch.float64) for p in params)
        wt = w.const
        if not wt.is_floating_point():
            continue
        s = scale / torch.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        w2 = (wt.to(torch.float64) * s.reshape(-1, *([1] * (wt.dim() - 1)))).to(wt.dtype)
        b0 = b.const.to(torch.float64) if b is not None else torch.zeros_like(mean)
        b2 = ((b0 - mean) * s + bias).to(wt.dtype)
        fold_into(graph, conv, bn, [conv.inputs[0], add_const(graph, f"{w.name}_bn_{bn.name}", w, w2),
                                    add_const(graph, f"{bn.name}_folded_bias", w, b2)])
    return graph

"""Pass: a constant per-channel Mul right after a Conv is folded into the Conv's weights.

``Mul(Conv(x, W, b), c)`` (either operand order) with ``c`` a constant that broadcasts along the
output channels only ([1, C, 1, 1], [C, 1, 1], or one value) is ``Conv(x, W * c, b * c)``, the
scale applied per output channel. PaddleOCR's PP-LCNetV3 backbones (the v4 det/rec models) scale
every convolution so ("mobile one" blocks: Conv, Mul, Add): at batch 6 the recogniser's Mul and Add
passes took a quarter of its CPU time. The Add after it then becomes the bias (``fold_conv_add``,
which runs next). ``W * c`` and ``b * c`` are rounded once at load: values move by an ulp or so.
"""

from __future__ import annotations

import torch

from ..ir import Graph
from .fold_conv_add import conv_operands
from .patterns import add_const, fold_into


def fold_conv_scale(graph: Graph) -> Graph:
    for mul, conv, vec, _ in conv_operands(graph, "Mul"):
        w, b = conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None
        s = vec.to(torch.float64)
        w2 = (w.const.to(torch.float64) * s.reshape(-1, *([1] * (w.const.dim() - 1)))).to(vec.dtype)
        ins = [conv.inputs[0], add_const(graph, f"{mul.name}_folded_weight", w, w2)]
        if b is not None:
            b2 = (b.const.to(torch.float64) * s).to(vec.dtype)
            ins.append(add_const(graph, f"{mul.name}_folded_bias", b, b2))
        fold_into(graph, conv, mul, ins)
    return graph

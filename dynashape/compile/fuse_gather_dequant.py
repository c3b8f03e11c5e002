"""Pass: a Gather of rows of a constant 8-bit table, read only by a DequantizeLinear of one
constant scale and zero point, becomes one ``GatherDequant`` (ops/fused_quant.py): the embedding
lookup of a model quantize_dynamic wrote (a tiny GPT-2's token and position tables: four calls of
a decode step become two, one C pass each on the CPU). The rows and their dequantization are the
two nodes' numbers bit for bit; where the fused kernel cannot serve, the op runs them as they were.
"""

from __future__ import annotations

import onnx
import torch

from ..ir import Graph
from .fuse_qdq import _scalar
from .patterns import fuse, only_feeds, producer

_FLOAT = onnx.TensorProto.FLOAT


def fuse_gather_dequant(graph: Graph) -> Graph:
    for dq in [n for n in graph.nodes if n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx")]:
        x = dq.inputs[0]
        scale = dq.inputs[1] if len(dq.inputs) > 1 else None
        zp = dq.inputs[2] if len(dq.inputs) > 2 else None
        g = producer(x, "Gather")
        if g is None or g.attrs.get("axis", 0) != 0 or not only_feeds(x, [dq], graph):
            continue
        table = g.inputs[0]
        if not (table.is_const and isinstance(table.const, torch.Tensor) and table.const.dim() == 2
                and table.const.dtype in (torch.uint8, torch.int8)):
            continue
        s, z = _scalar(scale), _scalar(zp)
        if s is None or s.dtype != torch.float32 or (zp is not None and (z is None or z.dtype != table.const.dtype)) \
                or dq.attrs.get("output_dtype", 0) not in (0, _FLOAT):
            continue
        fuse(graph, [g, dq], "GatherDequant", [table, g.inputs[1], scale, zp] if zp is not None
             else [table, g.inputs[1], scale], {})
    return graph

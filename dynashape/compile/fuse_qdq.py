"""Pass: the QDQ format's QuantizeLinear -> DequantizeLinear pairs become one FakeQuant.

onnxruntime.quantization.quantize_static(QuantFormat.QDQ) writes every quantized activation as

    QuantizeLinear(x, s, z) -> q -> DequantizeLinear(q, s, z) -> (one per reader)

and leaves the float ops between them. Run as written that is a division, a rounding, an add,
a clamp, a cast to 8 bits, a cast back, a subtraction and a multiplication: eight passes over
the activation. When the scale and zero point are one constant value each (per tensor), equal
in the Q and in all its DQs, the pair is ``FakeQuant(x, s, z)`` (ops/fused_quant.py): four
passes, no integer tensors, the same values bit for bit. Per-axis and blocked quantization,
float8 and int4 outputs, and a q that is read by anything else are left as they are.
"""

from __future__ import annotations

import itertools

import torch

from ..ir import Graph, Node
from ..ops.quant import _INT_RANGE
from ..ops.registry import lookup
from .patterns import FUSED_DOMAIN

_ONNX = ("", "ai.onnx")
_ids = itertools.count()


def _scalar(v) -> torch.Tensor | None:
    if v is None:
        return None
    t = v.const if isinstance(v.const, torch.Tensor) else None
    return t if t is not None and t.numel() == 1 else None


def _params(n: Node, scale_dtype: torch.dtype) -> tuple | None:
    """(scale, zero point or None) of a per-tensor Q or DQ, None otherwise."""
    if n.attrs.get("block_size", 0) or n.attrs.get("precision", 0):
        return None
    s = _scalar(n.inputs[1] if len(n.inputs) > 1 else None)
    if s is None or s.dtype != scale_dtype:
        return None
    zv = n.inputs[2] if len(n.inputs) > 2 else None
    z = _scalar(zv)
    if zv is not None and z is None:
        return None
    return s, z


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and bool(torch.equal(a.reshape(()), b.reshape(())))


def fuse_qdq(graph: Graph) -> Graph:
    outputs = {id(v) for v in graph.outputs}
    changed = False
    for qn in [n for n in graph.nodes if n.op_type == "QuantizeLinear" and n.domain in _ONNX]:
        x, q = qn.inputs[0], qn.outputs[0]
        if x is None or x.elem_type != 1 or id(q) in outputs or not q.users:
            continue  # float32 activations only
        p = _params(qn, torch.float32)
        if p is None or qn.attrs.get("saturate", 1) != 1:
            continue
        s, z = p
        to = qn.attrs.get("output_dtype", 0) or q.elem_type or (2 if z is None else 0)
        if to not in _INT_RANGE or to in (21, 22, 25, 26):  # 8- and 16-bit integers (not int4 / int2)
            continue
        if z is not None and z.dtype not in (torch.uint8, torch.int8, torch.uint16, torch.int16):
            continue
        dqs = q.users
        if not all(d.op_type == "DequantizeLinear" and d.domain in _ONNX and d.inputs[0] is q
                   and not d.attrs.get("output_dtype", 0) and d.outputs[0].elem_type in (0, 1)
                   and id(d.outputs[0]) not in outputs for d in dqs):
            continue
        dps = [_params(d, torch.float32) for d in dqs]
        if any(dp is None or not _same(dp[0], s) or not _same(dp[1], z) for dp in dps):
            continue
        lo, hi = _INT_RANGE[to]
        y = dqs[0].outputs[0]
        node = Node("FakeQuant", FUSED_DOMAIN, f"FakeQuant_{next(_ids)}_{qn.name}",
                    [x, qn.inputs[1], qn.inputs[2] if len(qn.inputs) > 2 else None], [y],
                    {"lo": lo, "hi": hi}, 1)
        node.opdef = lookup("FakeQuant", FUSED_DOMAIN, 1)
        node.unfused = []
        node.shape_of = False
        for d in dqs[1:]:  # every reader of every DQ now reads the one output
            other = d.outputs[0]
            for u in list(other.users):
                u.inputs = [y if i is other else i for i in u.inputs]
        gone = {id(qn), *(id(d) for d in dqs)}
        graph.nodes = [node if n is qn else n for n in graph.nodes if id(n) not in gone or n is qn]
        changed = True
    if changed:
        graph.rebuild_users()
    return graph

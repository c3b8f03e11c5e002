"""Pass: a constant per-channel scale and shift right before a Conv are folded into the Conv.

``Conv(h * s + t, W, b)`` with ``s``, ``t`` constants that broadcast along the input channels
only ([1, C, 1, 1], [C, 1, 1], or one value) is ``Conv(h, W * s, b + conv(t))``: each weight
scaled by its input channel's ``s``, and ``t``'s contribution, ``sum over the window of W * t``, a
constant per output channel. The scale folds for any padding (a padded zero stays zero); the
shift only where the convolution pads nothing (a window over the padding would see ``t`` where the
model saw zero). PaddleOCR's PP-LCNetV3 backbones end every activation so ("learnable affine
blocks": HardSwish, Mul, Add), and half their convolutions are 1x1 ones without padding.
Products and sums in float64, rounded once at load.
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node, Value
from .fold_conv_add import _channel_vector
from .patterns import add_const, only_feeds, producer


def _const_operand(node: Node) -> tuple[Value, Value] | None:
    """(the other operand, the constant) of a binary node with exactly one constant operand."""
    a, b = node.inputs
    if a is None or b is None or a.is_const == b.is_const:
        return None
    return (b, a) if a.is_const else (a, b)


def _unpadded(conv: Node) -> bool:
    auto = conv.attrs.get("auto_pad", "NOTSET")
    return auto == "VALID" or (auto in ("NOTSET", "") and not any(conv.attrs.get("pads") or []))


def _affine(conv: Node, graph: Graph) -> tuple[Value, list[Node], torch.Tensor | None, torch.Tensor | None] | None:
    """(h, the nodes folded, s, t) for the conv's input ``h * s + t`` (either part may be absent)."""
    v, nodes, s, t = conv.inputs[0], [], None, None
    add = producer(v, "Add")
    if add is not None and _unpadded(conv) and only_feeds(v, [conv], graph) and (pair := _const_operand(add)):
        t = _channel_vector(pair[1], conv, inputs=True)
        if t is not None:
            nodes.append(add)
            v = pair[0]
    mul = producer(v, "Mul")
    if mul is not None and only_feeds(v, [nodes[0] if nodes else conv], graph) and (pair := _const_operand(mul)):
        s = _channel_vector(pair[1], conv, inputs=True)
        if s is not None:
            nodes.append(mul)
            v = pair[0]
    w = conv.inputs[1].const
    if not nodes or v.shape is None or len(v.shape) != w.dim() or not v.shape[1].is_static \
            or v.shape[1].min != w.shape[1] * conv.attrs.get("group", 1):
        return None  # h of another rank or channel count: the constants would broadcast it
    return v, nodes, s, t


def _per_weight(vec: torch.Tensor, w: torch.Tensor, group: int) -> torch.Tensor:
    """``vec`` (one value per input channel) laid out as W's [out, in / group] entries."""
    cout, cin_g = w.shape[0], w.shape[1]
    idx = (torch.arange(cout) // (cout // group))[:, None] * cin_g + torch.arange(cin_g)[None, :]
    return vec.to(torch.float64)[idx].reshape(cout, cin_g, *([1] * (w.dim() - 2)))


def fold_conv_input_affine(graph: Graph) -> Graph:
    for conv in [n for n in graph.nodes if n.op_type == "Conv" and n.domain in ("", "ai.onnx")]:
        w, b = conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None
        if w is None or not w.is_const or not w.const.is_floating_point() or (b is not None and not b.is_const):
            continue
        found = _affine(conv, graph)
        if found is None:
            continue
        h, nodes, s, t = found
        if any(x is not None and x.dtype != w.const.dtype for x in (s, t)):
            continue
        w64, group = w.const.to(torch.float64), conv.attrs.get("group", 1)
        b64 = b.const.to(torch.float64) if b is not None else torch.zeros(w64.shape[0], dtype=torch.float64)
        if t is not None:
            b64 = b64 + (w64 * _per_weight(t, w64, group)).flatten(1).sum(1)
        if s is not None:
            w64 = w64 * _per_weight(s, w64, group)
        conv.inputs = [h, add_const(graph, f"{conv.name}_input_scaled_weight", w, w64.to(w.const.dtype)),
                       add_const(graph, f"{conv.name}_input_shifted_bias", w, b64.to(w.const.dtype))]
        gone = {id(n) for n in nodes}
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]
        graph.rebuild_users()
    return graph

"""Pass (CPU): a 2-D float Conv and the activation that alone reads it become ``ConvAct``; a 1-D one
and its Relu too (``_takes_1d``).

oneDNN applies an activation to the convolution's output block by block while it is still in
registers (a post-op; ``ops/cpu_conv.py conv2d_act``): one pass over the output, and its buffer,
fewer. Measured on this project's CPU (2 threads, channels-last, 6 x 64 x 24 x 160): a depthwise
3x3 with its HardSwish 226 us fused against 176 + 103 separately. Taken: Relu, Sigmoid, Tanh,
HardSwish, HardSigmoid (1/6, 1/2, as MobileNetV3 writes it), LeakyRelu, Clip of constant bounds,
and fuse_activations' SiLU and GELU (erf and tanh forms); in a float model a Mul and/or Add of
one-element constants after the activation too (``post_affine``: PP-LCNetV3's learnable affine
blocks, two more passes over each feature map of the OCR models otherwise). Runs after ``channels_last``, which
looks for Conv nodes; the activation's output keeps its layout. The convolutions left without an
activation become ``ConvAct`` too, with none: the op's bound kernel keeps oneDNN's reordered copies
of the weight (``ops/cpu_conv.py PackedWeight``), which torch's ``conv2d`` makes at every call.
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node
from ..ops.cpu_conv import onednn_fuses
from ..ops.elementwise import SIXTH
from .patterns import FUSED_DOMAIN, fuse, only_feeds, producer, scalar

_STD = ("", "ai.onnx")


def _clip_bounds(node: Node) -> list[float] | None:
    if node.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        ins = node.inputs + [None] * (3 - len(node.inputs))
        lo, hi = scalar(ins[1]), scalar(ins[2])
    return None if lo is None or hi is None else [float(lo), float(hi)]


def _post_op(node: Node) -> tuple[str, list[float], str] | None:
    """(oneDNN's name, its scalars, its algorithm) for the activation ``node``, or None."""
    op, std, fused = node.op_type, node.domain in _STD, node.domain == FUSED_DOMAIN
    a = node.attrs
    if std and op in ("Relu", "Sigmoid", "Tanh"):
        return op.lower(), [], ""
    if op == "HardSwish" and (std or fused):
        return "hardswish", [], ""
    if op == "HardSigmoid" and (fused or (std and abs(a.get("alpha", 0.2) - SIXTH) < 1e-7
                                          and a.get("beta", 0.5) == 0.5)):
        return "hardsigmoid", [], ""
    if fused and op == "Silu":
        return "swish", [], ""
    if op == "Gelu" and (fused or std) and a.get("approximate", "none") in ("none", "tanh"):
        return "gelu", [], a.get("approximate", "none")
    if std and op == "LeakyRelu":
        return "leaky_relu", [float(a.get("alpha", 0.01))], ""
    if std and op == "Clip" and (bounds := _clip_bounds(node)) is not None:
        return "hardtanh", bounds, ""
    return None


def _takes_1d(conv: Node | None) -> bool:
    """A 1-D float32 convolution of a constant weight: its Relu joins it (the C kernel applies it as it
    stores, ops/conv.py ``bound_conv1d``: silero-vad's encoder, four torch calls a call fewer)."""
    if conv is None or len(conv.outputs) != 1:
        return False
    w = conv.inputs[1]
    return w is not None and w.is_const and w.const.dim() == 3 and w.const.dtype == torch.float32


def _takes(conv: Node | None) -> bool:
    if conv is None or len(conv.outputs) != 1:
        return False
    w = conv.inputs[1]
    return w is not None and w.is_const and w.const.dim() == 4 and w.const.dtype == torch.float32


# ops that round a float to an integer step (or read one that did): where a model has any, the
# activations a convolution feeds them keep onnxruntime's bits (ops/cpu_conv.py ORT_ACTIVATIONS)
_INTEGER_OPS = frozenset({"MatMulInteger", "ConvInteger", "QGemm", "QAttention", "MatMulNBits", "DynamicQuantizeLSTM",
                          "GatherBlockQuantized", "QEmbedLayerNormalization"})


def _quantizes(graph: Graph) -> bool:
    """Whether the model rounds floats to integer steps anywhere (subgraphs included)."""
    for n in graph.nodes:
        op = n.op_type
        if "Quantize" in op or op.startswith("QLinear") or op in _INTEGER_OPS:
            return True
        if any(_quantizes(sub) for sub in n.subgraphs.values()):
            return True
    return False


def _scalar_operand(node: Node, v) -> float | None:
    """The one-element constant ``node`` (a Mul or Add of the standard domain) combines ``v`` with."""
    if node.domain not in _STD or len(node.inputs) != 2 or node.inputs.count(v) != 1:
        return None
    other = node.inputs[1] if node.inputs[0] is v else node.inputs[0]
    return scalar(other)


def _affine_after(v, graph: Graph) -> tuple[list[Node], float, float] | None:
    """``scale * v + shift`` by a Mul and/or an Add of one-element constants that alone read ``v``
    (the learnable affine blocks PP-LCNetV3 puts after each activation: two passes over a feature map
    each): the nodes, the scale and the shift."""
    nodes, scale, shift = [], 1.0, 0.0
    for op in ("Mul", "Add"):
        if len(v.users) != 1 or any(v is o for o in graph.outputs) or v.users[0].op_type != op:
            continue
        k = _scalar_operand(v.users[0], v)
        if k is None:
            continue
        if op == "Mul":
            scale = k
        else:
            shift = k
        nodes.append(v.users[0])
        v = v.users[0].outputs[0]
    return (nodes, scale, shift) if nodes else None


def _fuse(graph: Graph, conv: Node, act: Node | None, post: tuple[str, list[float], str], exact: bool,
          affine: bool = True) -> None:
    name, scalars, algorithm = post
    attrs = {**conv.attrs, "activation": name, "act_scalars": scalars, "act_algorithm": algorithm,
             "act_exact": int(exact)}
    ins = [conv.inputs[0], conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None]
    nodes = [conv] + ([act] if act is not None else [])
    # a float model's affine after the activation joins the convolution (a quantizing model keeps
    # onnxruntime's two roundings: the tile computes scale * y + shift in one)
    after = _affine_after(nodes[-1].outputs[0], graph) if affine and act is not None and not exact else None
    if after is not None:
        nodes += after[0]
        attrs["post_affine"] = [after[1], after[2]]
    fuse(graph, nodes, "ConvAct", ins, attrs)


def fuse_conv_activation(graph: Graph) -> Graph:
    if not onednn_fuses():
        return graph
    exact = _quantizes(graph)
    for act in list(graph.nodes):
        post = _post_op(act)
        if post is None or not act.inputs or act.inputs[0] is None:
            continue
        conv = producer(act.inputs[0], "Conv")
        if _takes(conv) and only_feeds(act.inputs[0], [act], graph):
            _fuse(graph, conv, act, post, exact)
        elif post[0] == "relu" and _takes_1d(conv) and only_feeds(act.inputs[0], [act], graph):
            _fuse(graph, conv, act, post, True, affine=False)  # (the C kernel applies no affine after it)
    # the others without a post-op: the op's bound kernel reorders the weight once per input shape
    for conv in [n for n in graph.nodes if n.op_type == "Conv" and n.domain in _STD]:
        if _takes(conv):
            _fuse(graph, conv, None, ("none", [], ""), exact)
    return graph

"""Pass: 2-D convolutions and what follows them run on channels-last (NHWC) tensors.

torch's CPU convolutions (oneDNN) are several times faster on channels-last tensors than on
NCHW ones, which they reorder on every call (measured on this project's machine: a 3x3 conv of
16 -> 32 channels at 160x160, 3.8 ms NCHW against 1.1 ms NHWC; a depthwise one 3.7 against 0.12).
On CUDA only half-precision convolutions take it (tensor cores read NHWC): fp32 cuDNN was measured
faster in NCHW (ResNet-50 on an H100 over batches 1, 8, 3, 16, 1: 17.8 ms with static impls against
19.8, batch 16 alone 6.4 against 7.5 ms; the dynamic path 21.0 against 26.2).

The conv weights are stored channels-last once, at load (the update_weights step for
convolutions), and every 4-D value that a conv, or an op that keeps the memory format of its input
(element-wise ops, pools, normalisations, Resize, Concat), produces from a channels-last value is
marked ``layout = "nhwc"`` (a QDQ model's Quantize/DequantizeLinear pairs between convolutions
too: cnn-qdq's convolutions had read NCHW activations and reordered them every call): the
generated code gives it arena memory with channels-last strides, so the kernels writing into it
keep the format instead of converting back and forth (an op across layouts is 4-6x slower on CPU
than within one). The values
are the same; only their strides differ.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

from ..ir import Graph, Value

NHWC = "nhwc"
# ops whose output keeps the memory format of a channels-last input (torch propagates it)
KEEPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Neg", "Abs", "Exp", "Sqrt", "Pow", "Erf", "Elu", "Selu", "Softplus", "Mish", "Where", "Max", "Min",
    "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize", "Upsample",
    "Concat", "Dropout", "Identity", "Cast", "Gelu", "Silu",
    # its parts are copied into their buffers: NHWC ones keep a YOLO C2f block's Split -> Concat
    # chain channels-last (else the Concat, whose inputs must all be NHWC, broke it)
    "Split",
    # a QDQ model's activations between convolutions (element-wise, per-tensor or per-channel)
    "QuantizeLinear", "DequantizeLinear", "FakeQuant",
})
CONVS = frozenset({"Conv", "ConvTranspose"})


def _rank(v: Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def channels_last_pass(device: str) -> Callable[[Graph], Graph]:
    """The pass for a session on ``device`` ('cpu' or 'cuda...'). DYNASHAPE_CHANNELS_LAST=0 / 1
    forces it off / on (to measure the layouts against each other)."""
    forced = os.environ.get("DYNASHAPE_CHANNELS_LAST")
    if forced is not None:
        wanted = (lambda w: True) if forced != "0" else (lambda w: False)
    elif str(device).startswith("cuda"):
        wanted = _half
    else:
        wanted = _floating
    return functools.partial(channels_last, wanted=wanted)


def _half(w: torch.Tensor) -> bool:
    return w.dtype in (torch.float16, torch.bfloat16)


def _floating(w: torch.Tensor) -> bool:
    return w.is_floating_point()


def channels_last(graph: Graph, wanted: Callable[[torch.Tensor], bool] = _floating) -> Graph:
    converted: set[int] = set()
    for node in graph.nodes:
        out = node.outputs[0] if node.outputs else None
        if out is None or _rank(out) != 4 or node.subgraphs:
            continue
        if node.op_type in CONVS and node.domain in ("", "ai.onnx"):
            w = node.inputs[1]
            if w is None or not w.is_const or w.const.dim() != 4 or not wanted(w.const):
                continue
            if id(w) not in converted:
                w.const = w.const.contiguous(memory_format=torch.channels_last)
                converted.add(id(w))
            out.layout = NHWC
        elif node.op_type in KEEPS and any(getattr(v, "layout", None) == NHWC for v in node.inputs if v is not None):
            if node.op_type == "Concat" and not all(getattr(v, "layout", None) == NHWC for v in node.inputs
                                                   if v is not None):
                continue
            for o in node.outputs:
                if o is not None and _rank(o) == 4:
                    o.layout = NHWC
    return graph

"""Pass (CPU): float32 constants below float32's smallest normal number become zero.

A subnormal operand or product costs an x86 core a microcode assist, ~100x a normal multiply-add,
in every kernel that does not set flush-to-zero itself (MKL's sgemm, torch's own loops). Pruned or
quantization-aware models ship such weights: 10% of PP-OCRv6 det's are subnormal, and its 1x1
convolutions ran 40-100x slower on them (14-34 ms a call for a 0.34 ms product); onnxruntime, which
keeps them, took 125 ms a 480x320 image where OpenVINO, which flushes them, took 21-40. A subnormal's
contribution to an output is below 2^-126 of the other terms' scale: the results move by nothing a
float32 comparison sees. The C convolution kernels also flush the subnormal activations they meet
(csrc/subnormal.h). Counted in stats() as ``subnormal_weights_flushed`` (values, process-wide).

The reference graph (the interpreter's) keeps the weights as the model has them.
"""

from __future__ import annotations

import torch

from ..ir import Graph

FLUSHED = [0]  # values set to zero in this process (stats' subnormal_weights_flushed)
_TINY = torch.finfo(torch.float32).tiny


def flush_subnormal_weights(graph: Graph) -> Graph:
    for v in graph.values.values():
        t = v.const
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() < 2:
            continue
        tiny = (t != 0) & (t.abs() < _TINY)
        n = int(tiny.sum())
        if n:
            v.const = t.masked_fill(tiny, 0.0)  # a new tensor: the reference graph's stays as it was
            FLUSHED[0] += n
    for node in graph.nodes:
        for sub in node.subgraphs.values():
            flush_subnormal_weights(sub)
    return graph

"""Pass (CUDA): a product by a constant fp32 matrix reads the matrix in torch's Linear layout.

``MatMul(x, W)`` with W a constant [in, out] becomes ``Linear(x, W.T)``, the weight stored
[out, in] once at load. For the few rows of a decode step cuBLAS's matrix-vector kernels read
the [out, in] layout faster in fp32: on an H200, 1 row by a 768 x 1280 weight took 2.7 us
against 5.5, 768 x 768 2.7 against 3.8, 2048 x 768 3.0 against 4.3 (``benchmarks/gemv_layouts.py``).
Not for wide outputs (a 768 x 32000 LM head: equal at 1 row, slower at 4), not in half
precision (no faster there), not on CPU (MKL: no faster, sometimes slower).
"""

from __future__ import annotations

import torch

from ..ir import Graph
from .fuse_linear import _transposed
from .patterns import fuse

MAX_OUT = 8192


def linear_layout(graph: Graph) -> Graph:
    for mm in [n for n in graph.nodes if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]:
        x, w = mm.inputs
        if not w.is_const or w.const.dim() != 2 or w.const.dtype != torch.float32 or w.const.shape[1] > MAX_OUT \
                or x.shape is None or len(x.shape) < 2:
            continue
        fuse(graph, [mm], "Linear", [x, _transposed(graph, w)], {})
    return graph

"""Pass: a product by a constant matrix reads the matrix in torch's Linear layout where that
layout was measured faster on the session's device.

``MatMul(x, W)`` with W a constant [in, out] becomes ``Linear(x, W.T)``, the weight stored
[out, in] once at load (the update_weights step of the design notes, done at compile time).
Which products, measured (``benchmarks/gemv_layouts.py``; CPU with 2 threads):
- CUDA, fp32, outputs up to 8192: cuBLAS's matrix-vector kernels read [out, in] faster at the
  few rows of a decode step (H200, 1 row: 768 x 1280 2.7 us against 5.5, 768 x 768 2.7 against
  3.8, 2048 x 768 3.0 against 4.3); not a 768 x 32000 LM head (equal at 1 row, slower at 4). Half
  precision too: cuBLAS alone was equal or slower there, but at one row the products that end in the
  residual or read a norm run as one Triton kernel that reads [out, in] (ops/residual.py), the norm's
  and the gate's kernels gone;
- CPU, fp16 / bf16: torch's kernels for [in, out] half-precision weights are 15-40x slower
  (bf16, 1 row by 768 x 32000: 48.9 ms against 3.2; fp16, 4 rows by 2048 x 768: 16.5 against
  0.55); fp32 stays (MKL: no faster, sometimes slower).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..ir import Graph
from ..ops.residual import TRITON_DTYPES
from .fuse_linear import _transposed
from .patterns import fuse

MAX_OUT_CUDA = 8192
HALF = (torch.float16, torch.bfloat16)


def _cuda(w: torch.Tensor) -> bool:
    return w.dtype in TRITON_DTYPES and w.shape[1] <= MAX_OUT_CUDA


def _cpu(w: torch.Tensor) -> bool:
    return w.dtype in HALF


def linear_layout_pass(device: str) -> Callable[[Graph], Graph]:
    """The pass for a session on ``device`` ('cpu' or 'cuda...')."""
    wanted = _cuda if str(device).startswith("cuda") else _cpu

    def linear_layout(graph: Graph) -> Graph:
        for mm in [n for n in graph.nodes if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]:
            x, w = mm.inputs
            if not w.is_const or w.const.dim() != 2 or not wanted(w.const) or x.shape is None or len(x.shape) < 2:
                continue
            fuse(graph, [mm], "Linear", [x, _transposed(graph, w)], {})
        return graph
    return linear_layout

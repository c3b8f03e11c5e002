"""Indices fed from the host, checked on the host before a CUDA session copies them over.

On CUDA an index out of range reaches torch's gather kernels, which assert on the device: the
error is untyped, comes at some later call, and leaves the CUDA context unusable for the rest of
the process. Checking every index tensor on the device would cost a synchronisation per kernel
(and could not be captured in a graph). Indices that the caller feeds from the host (numpy
arrays, CPU tensors: token ids, positions) are checked here instead, against the static size of
the axis they index, with the same IndexOutOfRangeError the CPU kernels raise. Indices fed as
CUDA tensors, or computed inside the model, are not checked on CUDA (docs/reliability.md).
"""

from __future__ import annotations

import numpy as np
import torch

from ..ir import Graph, Value
from ..ops.indexing import _check_indices, _check_nd

_AXIS = {"Gather": 1, "GatherElements": 1, "ScatterElements": 1}  # op -> position of its indices input
_ND = {"GatherND": 1, "ScatterND": 1}


def _static(v: Value, axis: int) -> int | None:
    if v.is_const and isinstance(v.const, torch.Tensor):
        return int(v.const.shape[axis]) if -v.const.dim() <= axis < v.const.dim() else None
    if v.shape is None or not -len(v.shape) <= axis < len(v.shape):
        return None
    d = v.shape[axis]
    return int(d.min) if d.is_static else None


class IndexFeedChecks:
    """Per graph input read directly as indices: the checks its host feeds get."""

    def __init__(self, graph: Graph) -> None:
        inputs = {v.name for v in graph.inputs}
        self.checks: dict[str, list[tuple]] = {}
        for node in graph.nodes:
            if node.domain not in ("", "ai.onnx") or len(node.inputs) < 2 or node.inputs[1] is None:
                continue
            idx, data = node.inputs[1], node.inputs[0]
            if idx.name not in inputs:
                continue
            if node.op_type in _AXIS:
                rank = None if data.shape is None else len(data.shape)
                axis = node.attrs.get("axis", 0)
                axis = axis + rank if axis < 0 and rank is not None else axis
                size = _static(data, axis)
                if size is not None:
                    self.checks.setdefault(idx.name, []).append(("axis", node.op_type, size, axis))
            elif node.op_type in _ND and data.shape is not None:
                b = node.attrs.get("batch_dims", 0)
                dims = [_static(data, a) for a in range(b, len(data.shape))]
                self.checks.setdefault(idx.name, []).append(("nd", node.op_type, dims, b))

    def __call__(self, feeds) -> None:
        if not isinstance(feeds, dict):
            return
        for name, checks in self.checks.items():
            x = feeds.get(name)
            if isinstance(x, np.ndarray):
                t = torch.from_numpy(np.ascontiguousarray(x)) if x.dtype.kind in "iu" else None
            elif isinstance(x, torch.Tensor) and x.device.type == "cpu" and not x.is_floating_point():
                t = x
            else:
                t = None  # a device tensor or something the feed check refuses anyway
            if t is None:
                continue
            t = t.to(torch.int64)
            for kind, op, size, axis in checks:
                if kind == "axis":
                    _check_indices(op, t, size, axis)
                elif t.dim() >= 1 and t.shape[-1] <= len(size) and all(s is not None for s in size[:t.shape[-1]]):
                    m = t.shape[-1]
                    _check_nd(op, t.reshape(-1, m), tuple(size[:m]), axis, tuple(t.shape))

"""Ops whose output shape depends on input values: NonZero, Unique, Compress.

They register no shape function (infer=None): the runtime calls them with out=None and takes
the shapes of what they return, which therefore must be exact, never padded.
"""

from __future__ import annotations

import torch

from .registry import op
from .shapes import norm_axis


@op("NonZero", 9, infer=None)
@op("NonZero", 13, infer=None)
def _nonzero(x, *, out=None):
    if x.dim() == 0:  # a scalar is treated as a 1-element vector, like numpy's nonzero of atleast_1d
        x = x.reshape(1)
    return torch.nonzero(x).t().contiguous()


@op("Unique", 11, infer=None)
@op("Unique", 28, infer=None)
def _unique(x, *, axis=None, sorted=1, out=None):
    if axis is None:
        src, a = x.reshape(-1), 0
        y, inverse, counts = torch.unique(src, sorted=True, return_inverse=True, return_counts=True)
    else:
        a = norm_axis(axis, x.dim())
        y, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=a)
    n = x.shape[a] if axis is not None else src.numel()
    nu = counts.numel()
    # index of the first occurrence of each unique value (or slice)
    first = torch.full((nu,), n, dtype=torch.int64, device=x.device)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=x.device), "amin")
    if not sorted:
        # ONNX's unsorted order is the order of first occurrence
        order = torch.argsort(first)
        y = y.index_select(a, order)
        first, counts = first[order], counts[order]
        rank = torch.empty_like(order)
        rank[order] = torch.arange(nu, device=x.device)
        inverse = rank[inverse]
    return y.contiguous(), first, inverse.reshape(-1), counts


@op("Compress", 9, infer=None)
@op("Compress", 11, infer=None)
@op("Compress", 28, infer=None)
def _compress(x, condition, *, axis=None, out=None):
    # the condition may be shorter than the axis: elements past its end are dropped
    idx = torch.nonzero(condition.reshape(-1).to(device=x.device, dtype=torch.bool)).reshape(-1)
    if axis is None:
        return x.reshape(-1).index_select(0, idx)
    return x.index_select(norm_axis(axis, x.dim()), idx)

"""Pools: MaxPool (with ONNX's flattened Indices), AveragePool, LpPool and the global pools.

Fast path: torch's max/avg pool kernels when pads are symmetric and within their limits
(pad <= kernel // 2, no dilation for averages). Everything else (asymmetric or large pads,
dilated averages, Lp pools) goes through explicit padding plus a window-sum convolution,
which handles every ONNX attribute combination exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .conv import spatial_attrs, window_out_sizes, window_pads
from .norm import SECONDARY, _put
from .registry import op

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _plan(shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, what):
    n = len(shape) - 2
    if n < 1 or n > 3:
        raise ShapeError(f"{what}: input must be (N, C, 1 to 3 spatial dims), got shape {tuple(shape)}")
    if not kernel_shape:
        raise ShapeError(f"{what}: kernel_shape is required")
    k, s, d, p = spatial_attrs(n, kernel_shape, strides, dilations, pads, what)
    sizes = window_out_sizes(list(shape[2:]), k, s, d, p, auto_pad, ceil_mode)
    return n, k, s, d, p, sizes


def _pool_infer(what: str, n_outputs: int = 1):
    def infer(shapes, values, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
              kernel_shape=None, pads=None, storage_order=0, strides=None, p=2, _n_outputs=1):
        x = shapes[0]
        *_, sizes = _plan(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, what)
        y = (x[0], x[1], *sizes)
        # MaxPool's Indices: the first shape only while the runtime cannot take more shapes than
        # the node has outputs (see norm.SECONDARY)
        return [y] * (1 + SECONDARY * (n_outputs - 1))
    return infer


def _explicit_pad(x, k, s, d, begin, end, sizes, value):
    """Pad so that a floor-mode window of padding 0 yields exactly ``sizes``: the ONNX pads at the
    begin, and at the end whatever the last window needs (ceil_mode overhang), cropped if less."""
    n = len(k)
    spec = []
    for i in reversed(range(n)):
        need = (sizes[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1  # extent the windows cover
        spec += [begin[i], need - begin[i] - x.shape[2 + i]]
    return F.pad(x, spec, value=value) if any(spec) else x


def _window_sum(xp, k, s, d):
    """Sum over every window: a depthwise convolution with a kernel of ones."""
    n = len(k)
    c = xp.shape[1]
    ones = torch.ones((c, 1, *k), dtype=xp.dtype, device=xp.device)
    return _CONV[n](xp, ones, None, s, 0, d, c)


# MaxPool ------------------------------------------------------------------------------------
def _onnx_indices(idx, in_spatial, padded_spatial, begin, storage_order):
    """torch's per-plane indices (over the padded plane) to ONNX's: flattened over the whole
    tensor, row-major, or column-major within each plane when storage_order is 1."""
    n = len(in_spatial)
    coords = []
    rem = idx
    for i in reversed(range(n)):  # unravel in the padded plane (row-major)
        coords.append(rem % padded_spatial[i] - begin[i])
        rem = rem // padded_spatial[i]
    coords.reverse()
    flat = torch.zeros_like(idx)
    if storage_order:
        for i in reversed(range(n)):
            flat = flat * in_spatial[i] + coords[i]
    else:
        for i in range(n):
            flat = flat * in_spatial[i] + coords[i]
    nb, c = idx.shape[:2]
    plane = math.prod(in_spatial)
    base = torch.arange(nb * c, device=idx.device, dtype=idx.dtype).reshape(nb, c, *([1] * n)) * plane
    return flat + base


def _separable_max(x, k, s):
    """2-D max pool of an unpadded x with dilation 1 as a max over rows, then over columns: (k - 1)
    element-wise maxima each way. torch's CPU kernel takes 16 ms for a 2x2 window at stride 1 over
    1x48x320x320 (PaddleOCR v5's stem) where this takes 2.2; a 3x3 one at stride 1 over 1x48x160x160
    1.3 against 0.5. NaN propagates as in torch's kernel."""
    oh, ow = (x.shape[2] - k[0]) // s[0] + 1, (x.shape[3] - k[1]) // s[1] + 1
    r = x[:, :, 0:(oh - 1) * s[0] + 1:s[0], :]
    for j in range(1, k[0]):
        r = torch.maximum(r, x[:, :, j:j + (oh - 1) * s[0] + 1:s[0], :])
    y = r[:, :, :, 0:(ow - 1) * s[1] + 1:s[1]]
    for j in range(1, k[1]):
        y = torch.maximum(y, r[:, :, :, j:j + (ow - 1) * s[1] + 1:s[1]])
    return y


def _pool_layout(x, n, want_idx):
    """On CPU, an NCHW input pooled in channels-last: torch's CPU max pool over NCHW is 4-10x
    slower than over the same values channels-last, the layout change included (2 threads,
    torch 2.13: ResNet's stem pool 1x64x112x112 3.2 ms against 0.8; 8x64x56x56 6.2 against
    1.5; a 5x5 SPP pool over 1x256x20x20 2.7 against 0.27). The values are the same (a max);
    the indices, where asked, are torch's own either way."""
    if (n == 2 and x.device.type == "cpu" and not want_idx and x.shape[1] > 1 and x.numel() >= 4096
            and x.is_contiguous()):
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _separable_pays(x, n, k, s, d) -> bool:
    # measured (CPU, 2 threads): stride 1 and windows up to 3x3 over a large plane; elsewhere
    # torch's kernel is as fast or faster (3x3 at stride 2, 5x5 over small planes)
    return (n == 2 and x.device.type == "cpu" and all(v == 1 for v in s) and all(v == 1 for v in d)
            and all(v <= 3 for v in k) and x.shape[2] * x.shape[3] * x.shape[1] * x.shape[0] >= 1 << 16)


def _maxpool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None, _n_outputs=2, out=None):
    n, k, s, d, p, sizes = _plan(x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, "MaxPool")
    begin, end = window_pads(list(x.shape[2:]), k, s, d, p, auto_pad)
    # out is a tensor when the node has Y only; a tuple (or None when folding) when Indices may be
    # asked; a node without an Indices output never computes them (the ONNX indices cost more than the pool)
    want_idx = _n_outputs > 1 and not isinstance(out, torch.Tensor)
    orig_dtype = x.dtype
    if not x.dtype.is_floating_point:  # int8/uint8 (opset 12): exact in float32, where torch pools
        x = x.float()
    if not want_idx and _separable_pays(x, n, k, s, d):
        r = _separable_max(_explicit_pad(x, k, s, d, begin, end, sizes, float("-inf")), k, s)
    elif begin == end and all(b <= kk // 2 for b, kk in zip(begin, k)):
        r = _MAX[n](_pool_layout(x, n, want_idx), k, s, begin, d, bool(ceil_mode), want_idx)
        padded, off = list(x.shape[2:]), [0] * n
    else:
        xp = _explicit_pad(x, k, s, d, begin, end, sizes, float("-inf"))
        r = _MAX[n](xp, k, s, 0, d, False, want_idx)
        padded, off = list(xp.shape[2:]), begin
    y, idx = r if want_idx else (r, None)
    if list(y.shape[2:]) != list(sizes):
        raise ShapeError(f"MaxPool: computed output {tuple(y.shape)} differs from expected sizes {sizes}")
    if not want_idx:  # torch has no max pool with out=: one copy into the buffer
        y = y if y.dtype == orig_dtype else y.to(orig_dtype)
        return out.copy_(y) if isinstance(out, torch.Tensor) else _put(out, [y])
    y = y.to(orig_dtype)
    ind = _onnx_indices(idx, list(x.shape[2:]), padded, off, storage_order)
    return _put(out, [y, ind])


op("MaxPool", (1, 8, 10, 11, 12, 22), infer=_pool_infer("MaxPool", 2))(_maxpool)


# AveragePool --------------------------------------------------------------------------------
def _avgpool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape=None,
             pads=None, strides=None, out=None):
    n, k, s, d, p, sizes = _plan(x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode,
                                 "AveragePool")
    begin, end = window_pads(list(x.shape[2:]), k, s, d, p, auto_pad)
    if (begin == end and all(dd == 1 for dd in d) and all(b <= kk // 2 for b, kk in zip(begin, k))
            and auto_pad in ("NOTSET", "", "VALID")):
        # torch's kernel; SAME_* may pad more than ONNX counts, so those go the general way
        y = _AVG[n](x, k, s, begin, bool(ceil_mode), bool(count_include_pad))
        if list(y.shape[2:]) == list(sizes):
            return y
    xp = _explicit_pad(x, k, s, d, begin, end, sizes, 0.0)
    sums = _window_sum(xp, k, s, d)
    # divisor: the window's elements inside the input, or inside input + pads with count_include_pad
    # (never the ceil_mode overhang beyond the end pads)
    mask = torch.zeros((1, 1, *xp.shape[2:]), dtype=x.dtype, device=x.device)
    region = [slice(None), slice(None)]
    for i in range(n):
        lo = 0 if count_include_pad else begin[i]
        hi = begin[i] + x.shape[2 + i] + (end[i] if count_include_pad else 0)
        region.append(slice(lo, hi))
    mask[tuple(region)] = 1
    counts = _window_sum(mask, k, s, d)
    return sums / counts


op("AveragePool", (1, 7, 10, 11, 19, 22), infer=_pool_infer("AveragePool"), writes_out=False)(_avgpool)


# LpPool -------------------------------------------------------------------------------------
def _lppool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None,
            out=None):
    n, k, s, d, pp, sizes = _plan(x.shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, "LpPool")
    begin, end = window_pads(list(x.shape[2:]), k, s, d, pp, auto_pad)
    xp = _explicit_pad(x.abs().pow(p), k, s, d, begin, end, sizes, 0.0)
    return _window_sum(xp, k, s, d).pow(1.0 / p)


op("LpPool", (1, 2, 11, 18, 22), infer=_pool_infer("LpPool"), writes_out=False)(_lppool)


# global pools -------------------------------------------------------------------------------
def _global_infer(shapes, values, **_attrs):
    x = shapes[0]
    if len(x) < 3:
        raise ShapeError(f"global pool: input must have rank >= 3, got shape {tuple(x)}")
    return [(x[0], x[1], *([1] * (len(x) - 2)))]


def _spatial(x):
    return list(range(2, x.dim()))


@op("GlobalAveragePool", (1, 22), infer=_global_infer)
def _global_avg(x, *, out=None):
    return torch.mean(x, _spatial(x), keepdim=True, out=out)


@op("GlobalMaxPool", (1, 22), infer=_global_infer)
def _global_max(x, *, out=None):
    return torch.amax(x, _spatial(x), keepdim=True, out=out)


@op("GlobalLpPool", (1, 2, 22), infer=_global_infer)
def _global_lp(x, *, p=2, out=None):
    return torch.linalg.vector_norm(x, float(p), _spatial(x), keepdim=True, out=out)

"""QLinearGlobalAveragePool / QLinearAveragePool (domain ``com.microsoft``), bit-exact with onnxruntime.

QLinearGlobalAveragePool: integer sum times one float32 scale. QLinearAveragePool dequantizes,
sums each window in float32 in window order, divides by the count and requantizes (falling back to
the global pool when a window covers the whole unpadded image, as onnxruntime does).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import ShapeError
from .conv import window_pads
from .pool import _plan
from .qlinear_arith import _F32, _RANGE, DOMAIN, _cvt, _eight_bit, _one, _put, _requant, _scale
from .registry import op


# ---- QLinearGlobalAveragePool / QLinearAveragePool -----------------------------------------------
def _spatial_axes(rank: int, channels_last: int) -> list[int]:
    return list(range(1, rank - 1)) if channels_last else list(range(2, rank))


def _qgap_infer(shapes, values, *, channels_last=0):
    x = shapes[0]
    if len(x) < 3:
        raise ShapeError(f"QLinearGlobalAveragePool: input must have rank >= 3, got shape {tuple(x)}")
    sp = set(_spatial_axes(len(x), channels_last))
    return [tuple(1 if i in sp else d for i, d in enumerate(x))]


def _global_average(x, xs, xz: int, ys, yz: int, spatial: list[int]) -> torch.Tensor:
    """MlasQLinearGlobalAveragePool: (sum - zp * size) as float32 times xs / (ys * size)."""
    lo, hi = _RANGE[x.dtype]
    size = math.prod(x.shape[i] for i in spatial)
    scale = _F32(_F32(xs) / _F32(_F32(ys) * _F32(size)))
    acc = x.to(torch.int64).sum(dim=spatial, keepdim=True) - xz * size
    y = _requant(acc.to(torch.float32) * float(scale), yz, lo, hi)
    return y.to(x.dtype)


@op("QLinearGlobalAveragePool", 1, DOMAIN, infer=_qgap_infer)
def _qlinear_global_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0, out=None):
    _eight_bit(x, "QLinearGlobalAveragePool")
    if x.dim() < 3:
        raise ShapeError(f"QLinearGlobalAveragePool: input must have rank >= 3, got shape {tuple(x.shape)}")
    y = _global_average(x, _scale(x_scale, "QLinearGlobalAveragePool x_scale"),
                        int(_one(x_zero_point, "QLinearGlobalAveragePool x_zero_point")),
                        _scale(y_scale, "QLinearGlobalAveragePool y_scale"),
                        int(_one(y_zero_point, "QLinearGlobalAveragePool y_zero_point")),
                        _spatial_axes(x.dim(), channels_last))
    return _put(out, y)


def _nchw(shape, channels_last):
    return (shape[0], shape[-1], *shape[1:-1]) if channels_last else tuple(shape)


def _qavg_infer(shapes, values, *, auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                kernel_shape=None, pads=None, strides=None):
    x = _nchw(shapes[0], channels_last)
    *_, sizes = _plan(x, kernel_shape, strides, None, pads, auto_pad, ceil_mode, "QLinearAveragePool")
    if channels_last:
        return [(x[0], *sizes, x[1])]
    return [(x[0], x[1], *sizes)]


@op("QLinearAveragePool", 1, DOMAIN, infer=_qavg_infer,
    notes="1 to 3 spatial dims, channels_last; onnxruntime's float32 window sums and global-pool fallback, "
          "bit-exact")
def _qlinear_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, auto_pad="NOTSET", ceil_mode=0,
                          channels_last=0, count_include_pad=0, kernel_shape=None, pads=None, strides=None, out=None):
    what = "QLinearAveragePool"
    lo, hi = _eight_bit(x, what)
    if channels_last:
        x = x.movedim(-1, 1)
    n, k, s, _, p, sizes = _plan(x.shape, kernel_shape, strides, None, pads, auto_pad, ceil_mode, what)
    begin, end = window_pads(list(x.shape[2:]), k, s, [1] * n, p, auto_pad)
    xs, ys = _scale(x_scale, f"{what} x_scale"), _scale(y_scale, f"{what} y_scale")
    xz, yz = int(_one(x_zero_point, f"{what} x_zero_point")), int(_one(y_zero_point, f"{what} y_zero_point"))
    if list(x.shape[2:]) == k and not any(begin) and not any(end):
        # onnxruntime takes its global pool here, which rounds differently
        y = _global_average(x, xs, xz, ys, yz, list(range(2, x.dim())))
    else:
        deq = (x.to(torch.int32) - xz).to(torch.float32) * float(xs)
        # zeros where windows leave the input (pads, ceil_mode overhang): adding 0.0 leaves a
        # float32 sum as it is, so each window sums its elements in onnxruntime's order
        spec = []
        for i in reversed(range(n)):
            need = (sizes[i] - 1) * s[i] + k[i]
            spec += [begin[i], max(need - begin[i] - x.shape[2 + i], 0)]
        xp = torch.nn.functional.pad(deq, spec)
        acc = torch.zeros((*x.shape[:2], *sizes), dtype=torch.float32, device=x.device)
        for offs in np.ndindex(*k):
            sl = tuple(slice(o, o + (sizes[i] - 1) * s[i] + 1, s[i]) for i, o in enumerate(offs))
            acc = acc + xp[(slice(None), slice(None)) + sl]
        if count_include_pad:
            count = torch.tensor(float(math.prod(k)), device=x.device)
        else:  # the window's elements inside the input
            count = torch.ones((), device=x.device)
            for i in range(n):
                start = torch.arange(sizes[i], device=x.device) * s[i] - begin[i]
                valid = (torch.clamp(start + k[i], max=x.shape[2 + i]) - start.clamp(min=0)).to(torch.float32)
                count = count * valid.reshape([-1] + [1] * (n - 1 - i))
        y = acc / count
        # quantize_value: nearbyintf(y / ys + zp), then a C cast to int32 and the clamp
        y = _cvt((y / float(ys)) + float(yz), lo, hi).to(x.dtype)
    if channels_last:
        y = y.movedim(1, -1)
    return _put(out, y)



"""Softmax, LogSoftmax, Hardmax.

Before opset 13 the input is coerced to 2-D at ``axis`` (default 1): (prod(shape[:axis]),
prod(shape[axis:])) and the op runs over the second dim; from 13 it runs over the one
dimension ``axis`` (default -1). Softmax and LogSoftmax write into the buffer with aten's
out= kernels; on the CPU, float32 Softmax is onnxruntime's own where this CPU runs MLAS's AVX-512F
kernels (csrc/elementwise.c softmax_f32, bit for bit: an attention's probabilities are quantized
next in dynamically quantized models, and one ulp can move a quantized value by a step).
"""

from __future__ import annotations

import ctypes
import math

import torch

from . import native, ort_math
from .registry import op
from .shapes import norm_axis, same_as_first


def _softmax_into(fn, x, dim, out):
    if x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cpu":
        r = fn(x.float(), dim, False).to(x.dtype)  # accumulate in float32 on the host
        return r if out is None else out.copy_(r)
    if out is None:
        return fn(x, dim, False)
    return fn.out(x, dim, False, out=out)


def _coerced(fn):
    """Opsets 1 and 11: the 2-D coercion at ``axis``."""
    def kernel(x, *, axis=1, out=None):
        a = norm_axis(axis, x.dim()) if x.dim() else 0
        rows = math.prod(x.shape[:a])
        x2 = x.reshape(rows, -1) if x.numel() else x.reshape(rows, math.prod(x.shape[a:]))
        o2 = None if out is None else out.view(x2.shape)
        r = fn(x2, 1, o2)
        return r.reshape(x.shape) if out is None else out
    return kernel


def _plain(fn):
    """Opset 13: along one axis."""
    def kernel(x, *, axis=-1, out=None):
        return fn(x, norm_axis(axis, x.dim()), out)
    return kernel


def _ort_softmax(x, dim, out):
    """onnxruntime's bits (rows along ``dim``, as it transposes a non-last axis to the end), or None
    where the C does not serve: not float32 on the CPU, a traced tensor, no AVX-512F build."""
    if type(x) is not torch.Tensor or x.device.type != "cpu" or x.dtype != torch.float32 or not x.numel():
        return None
    fn = native.function("elementwise", "softmax_f32", "ppiii", ctypes.c_int64, fallbacks="ort_softmax")
    if fn is None:
        return None
    last = dim == x.dim() - 1
    xr = (x if last else x.movedim(dim, -1)).contiguous()
    # the rows straight into the caller's buffer where it is laid out as they are (a copy of the
    # whole result fewer: PP-OCRv4 rec's 6,625-class head at batch 36, 72 MB)
    direct = (last and out is not None and out.shape == xr.shape and out.dtype == xr.dtype and out.is_contiguous()
              and out.data_ptr() != xr.data_ptr())
    y = out if direct else torch.empty_like(xr)
    d = xr.shape[-1]
    # one thread below ort_math's threshold (a second one's wake-up costs more than the work, and on a
    # loaded machine waiting for it cost milliseconds a call)
    threads = torch.get_num_threads() if xr.numel() >= ort_math.THREAD_MIN_ELEMENTS else 1
    if fn(xr.data_ptr(), y.data_ptr(), xr.numel() // d, d, threads):
        return None
    native.count("ort_softmax_native_calls")
    if not last:
        y = y.movedim(-1, dim)
    return y if out is None or direct else out.copy_(y)


def _softmax(x, dim, out):
    r = _ort_softmax(x, dim, out)
    return r if r is not None else _softmax_into(torch.ops.aten._softmax, x, dim, out)


def _log_softmax(x, dim, out):
    return _softmax_into(torch.ops.aten._log_softmax, x, dim, out)


def _hardmax(x, dim, out):
    # one-hot of the first maximum along dim (torch.argmax returns the first one)
    idx = torch.argmax(x, dim, keepdim=True)
    r = torch.zeros_like(x) if out is None else out.zero_()
    return r.scatter_(dim, idx, 1)


for _name, _fn in (("Softmax", _softmax), ("LogSoftmax", _log_softmax), ("Hardmax", _hardmax)):
    op(_name, (1, 11), infer=same_as_first)(_coerced(_fn))
    op(_name, 13, infer=same_as_first)(_plain(_fn))

"""Layer normalizations on the CPU in one C pass bound to their constant gamma, beta and bias
(csrc/elementwise.c ``skip_ln_f32``): onnxruntime's SkipLayerNormalization and
SkipSimplifiedLayerNormalization, ONNX's LayerNormalization over the last axis, and fuse_norms'
LayerNorm and RMSNorm.

torch takes three to six calls for each (the skip's add, the bias's, layer_norm, the copies into
the outputs' buffers): ~15 us a call at a tiny GPT-2's (1, 1, 64) rows, ~3 here. The generated CPU
runner calls these bound kernels (``registry.binder``); the interpreter keeps the ops themselves.
What the C pass does not serve (another dtype or device, rows that are not contiguous, the mean and
inverse deviation outputs only training reads, a skip that broadcasts other than over leading
dims, normalization over more than the last axis) runs the op, and ``native``'s counters tell
which ran.
"""

from __future__ import annotations

from functools import partial

import torch

from . import native
from .attention import _emit
from .contrib_transformer import (
    _layernorm_before_17,
    _skip_layer_norm,
    _skip_simplified_layer_norm,
    _wants,
    mlas_layer_norm,
)
from .fused import DOMAIN
from .fused import _layer_norm as _fused_layer_norm
from .fused import _rms_norm as _fused_rms_norm
from .norm import _layernorm
from .registry import COMPUTED, binder

_F32 = torch.float32
_THREAD_MIN = 1 << 16  # elements below which a second thread costs more than it saves


def _vector(t, h: int) -> bool:
    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype == _F32 and t.dim() == 1
            and t.shape[0] == h and t.is_contiguous())


def _rows(t) -> bool:
    return type(t) is torch.Tensor and t.is_cpu and t.dtype is _F32 and t.dim() > 0 and t.is_contiguous()


def _skip_rows(skip: torch.Tensor, x: torch.Tensor, h: int) -> int | None:
    """How many rows ``skip`` has where it broadcasts over ``x``'s leading dims only (its own
    leading ones dropped, the rest x's trailing dims), else None."""
    dims = list(skip.shape)
    while dims and dims[0] == 1 and len(dims) > 1:
        dims.pop(0)
    if not dims or dims[-1] != h or len(dims) > x.dim() or tuple(dims) != tuple(x.shape[x.dim() - len(dims):]):
        return None
    return skip.numel() // h


def layer_norm_bound(gamma, beta, bias, epsilon: float, simplified: bool | int):
    """``run(x, skip, with_sum, y, total=None)`` -> (y, x + skip + bias or None), written into
    ``y`` and ``total`` where they fit, or None for inputs the C pass does not serve; None where
    the constants themselves are not served. ``simplified``: False a layer norm; True (1)
    onnxruntime's SkipSimplifiedLayerNormalization order of the RMS norm, 2 its
    SimplifiedLayerNormalization order (csrc/elementwise.c ort_rms_row)."""
    if type(gamma) is not torch.Tensor or gamma.dim() != 1 or not gamma.shape[0]:
        return None
    h = gamma.shape[0]
    if not _vector(gamma, h) or any(t is not None and not _vector(t, h) for t in (beta, bias)):
        return None
    fn = native.function("elementwise", "skip_ln_f32", "ppipppiidippi", fallbacks="skip_ln")
    if fn is None:
        return None
    consts = (None if bias is None else bias.data_ptr(), gamma.data_ptr(), None if beta is None else beta.data_ptr())
    eps, simple = float(epsilon), int(simplified)

    def run(x, skip, with_sum: bool, y, total=None):
        if not _rows(x) or x.shape[-1] != h:
            return None
        srows = 1
        if skip is not None:
            if not _rows(skip):
                return None
            srows = x.numel() // h if skip.shape == x.shape else _skip_rows(skip, x, h)
            if not srows:
                return None
        y = native.buffer(y, x.shape, _F32)
        total = native.buffer(total, x.shape, _F32) if with_sum else None
        n = x.numel()
        if n:
            fn(x.data_ptr(), None if skip is None else skip.data_ptr(), srows, *consts, n // h, h, eps, simple,
               y.data_ptr(), None if total is None else total.data_ptr(),
               torch.get_num_threads() if n >= _THREAD_MIN else 1)
        native.count("skip_ln_native_calls")
        return y, total

    run.consts = (gamma, beta, bias)  # the tensors whose addresses it holds stay alive with it
    return run


def _put(results: list, out, n: int):
    """The first ``n`` results as the runtime wants them (attention's ``_emit``), with no copy of a
    result the pass wrote into its buffer already."""
    if isinstance(out, tuple):
        return tuple(r if r is None or o is None or r is o else o.copy_(r) for o, r in zip(out, results[:n]))
    if out is None or results[0] is not out:
        return _emit(results, out, n)
    return out


def _bind_skip(consts, attrs, op, simplified: bool):
    c = list(consts) + [None] * (5 - len(consts))
    gamma, beta, bias = (c[2], c[3], c[4]) if not simplified else (c[2], None, c[3])
    if any(t is COMPUTED for t in (gamma, beta, bias)):
        return None
    run = layer_norm_bound(gamma, beta, bias, attrs.get("epsilon", 1e-12), simplified)
    if run is None:
        return None
    full = partial(op, **attrs)
    n, present = attrs.get("_n_outputs", 1), attrs.get("_present")

    def kernel(x, skip, *rest, out=None):
        if not (_wants(out, n, 1, present) or _wants(out, n, 2, present)):  # (mean and inv_std: training's)
            bufs = out if isinstance(out, tuple) else (out,)
            got = run(x, skip, _wants(out, n, 3, present), bufs[0] if bufs else None,
                      bufs[3] if len(bufs) > 3 else None)
            if got is not None:
                return _put([got[0], None, None, got[1]], out, n)
        return full(x, skip, *rest, out=out)

    return kernel


@binder("SkipLayerNormalization", "com.microsoft")
def _bind_skip_layer_norm(consts, attrs):
    return _bind_skip(consts, attrs, _skip_layer_norm, False)


@binder("SkipSimplifiedLayerNormalization", "com.microsoft")
def _bind_skip_simplified_layer_norm(consts, attrs):
    return _bind_skip(consts, attrs, _skip_simplified_layer_norm, True)


@binder("LayerNormalization")
def _bind_layer_norm(consts, attrs):
    """Over the last axis, only Y read (the runner passes its buffer as ``out``)."""
    c = list(consts) + [None] * (3 - len(consts))
    if c[1] is COMPUTED or c[2] is COMPUTED:
        return None
    run = layer_norm_bound(c[1], c[2], None, attrs.get("epsilon", 1e-5), False)  # (its B is beta: after)
    if run is None:
        return None
    before_17 = "_n_outputs" in attrs  # (onnxruntime's schema below opset 17: its kernel may get no buffer)
    full = partial(_layernorm_before_17 if before_17 else _layernorm, **attrs)
    axis = attrs.get("axis", -1)
    y_only = before_17 and attrs["_n_outputs"] == 1

    def kernel(x, scale, bias=None, *, out=None):
        if (isinstance(out, torch.Tensor) or (out is None and y_only)) and (axis == -1 or axis == x.dim() - 1):
            got = run(x, None, False, out)
            if got is not None:
                return got[0] if out is None or got[0] is out else out.copy_(got[0])
        return full(x, scale, bias, out=out)

    return kernel



@binder("LayerNorm", DOMAIN)
def _bind_fused_layer_norm(consts, attrs):
    """fuse_norms' LayerNorm (over the last axis) of a constant weight and bias."""
    c = list(consts) + [None] * (3 - len(consts))
    if c[1] is COMPUTED or c[2] is COMPUTED or c[1] is None:
        return None
    run = layer_norm_bound(c[1], c[2], None, attrs.get("epsilon", 1e-5), False)
    if run is None:
        return None
    full = partial(_fused_layer_norm, **attrs)

    def kernel(x, weight=None, bias=None, *, out=None):
        got = run(x, None, False, None)
        return got[0] if got is not None else full(x, weight, bias, out=out)

    return kernel


@binder("RMSNorm", DOMAIN)
def _bind_rms_norm(consts, attrs):
    """fuse_norms' RMSNorm of a constant weight: the same C pass (``simplified``) with the weight
    checked once (fused.py's own native path checks it every call)."""
    c = list(consts) + [None] * (2 - len(consts))
    if c[1] is COMPUTED or c[1] is None:
        return None
    # onnxruntime fuses it into SimplifiedLayerNormalization: that kernel's order on this CPU
    run = layer_norm_bound(c[1], None, None, attrs.get("epsilon", 1e-5), 2 if mlas_layer_norm() else 1)
    if run is None:
        return None
    full = partial(_fused_rms_norm, **attrs)

    def kernel(x, weight=None, *, out=None):
        got = run(x, None, False, None)
        return got[0] if got is not None else full(x, weight, out=out)

    return kernel

"""onnxruntime's FastGelu on the CPU in one C pass bound to its constant bias
(csrc/elementwise.c ``bias_gelu_tanh_f32``): torch took the bias's add and a gelu, two calls.
The generated CPU runner calls the bound kernel (``registry.binder``); the interpreter keeps the
op. What the pass does not serve (another dtype or device, rows that are not contiguous, a bias
computed at run time) runs the op, and ``native``'s counters tell which ran."""

from __future__ import annotations

import torch

from . import native
from .contrib_transformer import _fast_gelu
from .registry import COMPUTED, binder

_F32 = torch.float32
_THREAD_MIN = 1 << 16  # elements below which a second thread costs more than it saves


@binder("FastGelu", "com.microsoft")
def _bind_fast_gelu(consts, attrs):
    bias = consts[1] if len(consts) > 1 else None
    if bias is COMPUTED or (bias is not None and not (
            type(bias) is torch.Tensor and bias.is_cpu and bias.dtype is _F32 and bias.dim() == 1
            and bias.is_contiguous())):
        return None
    fn = native.function("elementwise", "bias_gelu_tanh_f32", "ppiipi", fallbacks="gelu")
    if fn is None:
        return None
    h = None if bias is None else bias.shape[0]
    bias_p = None if bias is None else bias.data_ptr()

    def kernel(x, b=None, *, out=None):
        if type(x) is torch.Tensor and x.is_cpu and x.dtype is _F32 and x.dim() and x.is_contiguous() \
                and (h is None or x.shape[-1] == h):
            y = native.buffer(out, x.shape, _F32)
            n = x.numel()
            if n:
                w = x.shape[-1]
                fn(x.data_ptr(), bias_p, n // w, w, y.data_ptr(), torch.get_num_threads() if n >= _THREAD_MIN else 1)
            native.count("gelu_native_calls")
            return y
        return _fast_gelu(x, b, out=out)

    kernel.bias = bias  # the tensor whose address it holds stays alive with it
    return kernel

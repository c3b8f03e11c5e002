"""``SqueezeExcite``: a squeeze-and-excitation block as one op (``compile/fuse_squeeze_excite.py``).

``y = x * gate(conv1x1_2(act(conv1x1_1(GlobalAveragePool(x)))))``, the block MobileNetV3, PP-LCNet
and EfficientNet end their stages with: ``w1 [cr, c, 1, 1]``, ``w2 [c, cr, 1, 1]``, biases
optional; ``act1`` "relu" or "none"; ``gate`` "hardsigmoid" (``alpha``, ``beta``) or "sigmoid".
On the CPU one C call (``csrc/squeeze_excite.c``: the means, the two small products and the gate,
then the product with x) instead of five kernels and their calls; elsewhere, or where the C kernel
cannot be built (counted as ``squeeze_excite_torch_fallbacks``), the torch ops the block was made of.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .fused import DOMAIN
from .registry import op
from .shapes import same_as_first

GATES = {"hardsigmoid": 0, "sigmoid": 1}
ACTS = {"none": 0, "relu": 1}


def _torch(x, w1, b1, w2, b2, act1, gate, alpha, beta):
    m = x.mean(dim=(2, 3))
    h = F.linear(m, w1.reshape(w1.shape[0], -1), b1)
    if act1 == "relu":
        h = torch.relu(h)
    s = F.linear(h, w2.reshape(w2.shape[0], -1), b2)
    s = torch.sigmoid(s) if gate == "sigmoid" else torch.clamp(s * alpha + beta, 0.0, 1.0)
    return x * s[:, :, None, None]


@op("SqueezeExcite", 1, DOMAIN, infer=same_as_first,
    notes="x * gate(W2 act(W1 mean(x) + b1) + b2) (fuse_squeeze_excite); one C pass pair on the CPU")
def _squeeze_excite(x, w1, b1=None, w2=None, b2=None, *, act1="relu", gate="hardsigmoid", alpha=1.0 / 6, beta=0.5,
                    out=None):
    if not (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 4 and w1.dtype == x.dtype
            and w2.dtype == x.dtype and (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last))):
        return _torch(x, w1, b1, w2, b2, act1, gate, alpha, beta)
    fn = native.function("squeeze_excite", "se_forward", "ppiiiiiiippppiiddpi", fallbacks="squeeze_excite")
    if fn is None:
        return _torch(x, w1, b1, w2, b2, act1, gate, alpha, beta)
    n, c, h, w = x.shape
    cr = w1.shape[0]
    x, y = native.dense_pair(x, out, x.dtype)  # (x is dense: itself; y out where it is laid out as x)
    w1c, w2c = w1.reshape(cr, c).contiguous(), w2.reshape(c, cr).contiguous()
    b1c = b1.contiguous() if b1 is not None else None
    b2c = b2.contiguous() if b2 is not None else None
    scratch = torch.empty(max(n, 1) * (2 * c + cr), dtype=torch.float32)
    sn, sc, _, sw = x.stride()  # dense NCHW or channels-last: the pixels lie at one stride, sw
    threads = torch.get_num_threads()
    fn(x.data_ptr(), y.data_ptr(), n, h * w, c, cr, sn, sw, sc, w1c.data_ptr(),
       b1c.data_ptr() if b1c is not None else None, w2c.data_ptr(), b2c.data_ptr() if b2c is not None else None,
       ACTS[act1], GATES[gate], float(alpha), float(beta), scratch.data_ptr(), threads)
    native.count("squeeze_excite")
    return y

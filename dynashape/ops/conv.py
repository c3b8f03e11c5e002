"""Convolutions: Conv and ConvTranspose (1-D, 2-D, 3-D) on torch's convNd kernels.

The spatial helpers here (pads from auto_pad, output sizes) also serve the pools. They take
ints at run time and Dimensions at compile time, so a dynamic H or W keeps a range.
Kernels return torch's fresh result (writes_out=False): torch has no conv with out=, and its
generated ``convolution.out`` only copies, so adopting the result is the cheaper path.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..shape import dim_ceildiv
from . import cpu_conv, native, tuned_conv
from .registry import binder, op
from .weight_cache import WeightCache


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.conv1d``, but on CPU a tiny one (at most ``GEMM_ROWS`` output positions over the
    batch, no groups or dilation; at batch 1 not the very smallest, ``GEMM_MIN``) as one matrix
    product over its unfolded windows: oneDNN's convolution costs ~50 us per call at batch > 1
    however small the input, torch's batch-1 path 30-50 us for silero-vad's larger ones, where the
    product costs 20-50 (measured on this project's 2-core CPU: silero-vad's convolutions at batch
    4, 53-80 us -> 20-51 us each; at batch 1, 31-51 -> 24-29). Same result up to the order of the
    sums."""
    s, p, d = (v[0] if isinstance(v, (tuple, list)) else v for v in (stride, padding, dilation))
    n, c, length = x.shape
    o, _, k = w.shape
    out_len = (length + 2 * p - d * (k - 1) - 1) // s + 1
    if groups == c == o > 1 and d == 1 and out_len > 0 and x.device.type == "cpu" and not x.requires_grad \
            and k <= DW_TAPS and x.dtype in (torch.float32, torch.float64):  # (half: torch sums in float32)
        return _depthwise1d(x, w, b, s, p, out_len)
    if (groups == 1 and out_len > 0 and x.device.type == "cpu" and x.dtype == torch.float32 and w.dtype == x.dtype
            and not x.requires_grad and in_c(True, n, c, out_len, k, o) and (b is None or b.dtype == x.dtype)):
        y = _native1d(x, w, b, s, p, d, out_len)
        if y is not None:
            return y
    if (x.device.type != "cpu" or groups != 1 or d != 1 or n * out_len > GEMM_ROWS
            or not GEMM_MIN[n >= 2] <= n * out_len * c * k <= GEMM_COLS or out_len <= 0 or x.requires_grad):
        return F.conv1d(x, w, b, stride, padding, dilation, groups)
    xp = F.pad(x, (p, p)) if p else x
    cols = xp.unfold(2, k, s).permute(0, 2, 1, 3).reshape(n * out_len, c * k)  # a row per window
    w2 = w.reshape(o, c * k).t()
    y = torch.addmm(b, cols, w2) if b is not None else torch.mm(cols, w2)
    return y.view(n, out_len, o).transpose(1, 2).contiguous()


def _native1d(x, w, b, s: int, p: int, d: int, out_len: int):
    """A small dense conv1d in C (csrc/conv1d.c, one thread: it says why), its weight packed
    [c * k][o] once (``_PACKED``: remade if the weight is written), or None where the C kernel
    cannot be built (counted as ``conv1d_torch_fallbacks``: torch's forms serve)."""
    fn = native.function("conv1d", "conv1d_ncl", "ppppiiiiiiiiii", fallbacks="conv1d")
    if fn is None:
        return None
    n, c, length = x.shape
    o, _, k = w.shape
    packed = _packed(w)
    x = x.contiguous()
    bc = b.contiguous() if b is not None else None
    y = torch.empty((n, o, out_len), dtype=x.dtype)
    fn(x.data_ptr(), y.data_ptr(), packed.data_ptr(), bc.data_ptr() if bc is not None else None, n, c, length, o,
       k, s, p, d, out_len, 0)
    native.count(NATIVE_CONV1D)
    return y


def _depthwise1d(x, w, b, s: int, p: int, out_len: int):
    """A depthwise conv1d (one filter per channel): float32 up to ``DW_C`` multiply-adds in C
    (csrc/conv1d.c); else in torch ops: up to ``DW_UNFOLD`` unfolded elements the windows times
    the taps summed, beyond it one multiply-add per tap over shifted views. torch's own CPU kernel
    for it costs 47-67 us however small the input (silero-vad v4's four: ~300 us of a 1.1 ms call,
    where onnxruntime's whole call takes 0.11 ms) and 1.8 ms at 258 x 2000 (the taps: 0.56 ms);
    measured on this project's 2-core CPU (unfold 11-32 us below the bound, taps 35 us at 64 x 64)."""
    n, c, length = x.shape
    k = w.shape[-1]
    if x.dtype == torch.float32 and w.dtype == x.dtype and (b is None or b.dtype == x.dtype) \
            and in_c(False, n, c, out_len, k, c):
        fn = native.function("conv1d", "dw_conv1d_ncl", "ppppiiiiiiii", fallbacks="dw_conv1d")
        if fn is not None:
            x, wc = x.contiguous(), w.contiguous()
            bc = b.contiguous() if b is not None else None
            y = torch.empty((n, c, out_len), dtype=x.dtype)
            fn(x.data_ptr(), y.data_ptr(), wc.data_ptr(), bc.data_ptr() if bc is not None else None, n, c, length, k,
               s, p, out_len, 0)
            native.count(NATIVE_DW_CONV1D)
            return y
    xp = F.pad(x, (p, p)) if p else x
    if n * c * out_len * k <= DW_UNFOLD:
        y = (xp.unfold(2, k, s) * w.view(1, c, 1, k)).sum(-1)
    else:
        taps = w.view(c, k).t().unsqueeze(-1)  # [k, c, 1]
        span = s * (out_len - 1) + 1
        y = torch.mul(xp[:, :, 0:span:s], taps[0])
        for j in range(1, k):
            y.addcmul_(xp[:, :, j:j + span:s], taps[j])
    if b is not None:
        y += b.view(1, c, 1)
    return y


def bound_conv1d(w: torch.Tensor, b: torch.Tensor | None, s: int, p: int, d: int, group: int, relu: bool = False):
    """A 1-D Conv node's kernel with its weight and attributes read once (the generated CPU runner's,
    ``registry.binder``): at a dense or depthwise float32 convolution small enough for the C kernels
    (``_native1d``, ``_depthwise1d``), a call is a lookup of its input shape's argument array, the
    output's allocation and one foreign call of five arguments, where the op's path took ~24 us of
    Python a call (conv_plan, the checks, 13 ctypes arguments: silero-vad's six convolutions ~140 us
    of a 390 us call at batch 1 on a 2-core EPYC, onnxruntime's whole call ~95 us). Anything else
    takes ``conv1d`` (then ``relu_``). With ``relu`` the C kernels apply the Relu after it (a ``ConvAct``
    of fuse_conv_activation). None where nothing is gained (another dtype or layout, no C library)."""
    o, cw, k = w.shape
    dense = group == 1
    depthwise = group == o > 1 and cw == 1 and d == 1 and k <= DW_TAPS
    if not (dense or depthwise) or w.dtype != torch.float32 or w.device.type != "cpu" or (
            b is not None and (b.dtype != torch.float32 or b.shape != (o,))):
        return None
    run = native.function("conv1d", "conv1d_run" if dense else "dw_conv1d_run", "ppppp",
                          fallbacks="conv1d" if dense else "dw_conv1d")
    if run is None:
        return None
    bc = b.detach().contiguous() if b is not None else None
    b_ptr = bc.data_ptr() if bc is not None else None
    counter = NATIVE_CONV1D if dense else NATIVE_DW_CONV1D
    plans: dict = {}

    def plan(shape):
        n, c, length = shape
        lo = (length + 2 * p - d * (k - 1) - 1) // s + 1
        if c != cw * group or lo <= 0 or not in_c(dense, n, c, lo, k, o):
            return False
        ints = (n, c, length, o, k, s, p, d, lo, int(relu)) if dense else (n, c, length, k, s, p, lo, int(relu))
        args = (ctypes.c_int64 * len(ints))(*ints)
        if len(plans) >= 256:  # lengths that never repeat: forget them all at once
            plans.clear()
        return (n, o, lo), ctypes.addressof(args), args

    def torch_form(x, w_, b_):
        y = conv1d(x, w_, b_, s, p, d, group)
        return y.relu_() if relu else y

    def kernel(x, w_, b_=None, out=None):
        if w_ is not w or b_ is not b or type(x) is not torch.Tensor or x.dtype != torch.float32 or x.dim() != 3 \
                or x.device.type != "cpu" or x.requires_grad:
            return torch_form(x, w_, b_)
        got = plans.get(x.shape)
        if got is None:
            got = plans[x.shape] = plan(x.shape)
        if got is False:
            return torch_form(x, w_, b_)
        if not x.is_contiguous():
            x = x.contiguous()
        wp = _packed(w) if dense else w
        y = torch.empty(got[0], dtype=torch.float32)
        run(x.data_ptr(), y.data_ptr(), wp.data_ptr(), b_ptr, got[1])
        native.count(counter)
        return y
    return kernel


def in_c(dense: bool, n: int, c: int, lo: int, k: int, o: int) -> bool:
    """Whether a float32 conv1d of this size runs in C: a dense one up to ``C_MACS`` multiply-adds,
    a depthwise one (``o`` = ``c``) up to ``DW_C``."""
    return n * lo * c * k * (o if dense else 1) <= (C_MACS if dense else DW_C)


def _packed(w: torch.Tensor) -> torch.Tensor:
    """A dense conv1d weight [o][c][k] as the C kernel reads it, [c * k][o]: made once, again after a
    write to the weight (``_PACKED``)."""
    return _PACKED.get(w, lambda: w.detach().reshape(w.shape[0], -1).t().contiguous())


# a dense float32 conv1d of up to this many multiply-adds runs in C (``_native1d``); beyond, torch's
C_MACS = 1 << 20
_PACKED = WeightCache()  # each weight's [c * k][o] copy for the C kernel
NATIVE_CONV1D = "conv1d_native_calls"
NATIVE_DW_CONV1D = "dw_conv1d_native_calls"
# a depthwise float32 conv1d of up to this many multiply-adds in C (a scalar loop over the taps: ~1-2
# multiply-adds a ns; the torch forms cost 15-50 us a call before their arithmetic)
DW_C = 1 << 16
DW_TAPS = 16  # depthwise conv1d of up to this many taps in torch ops (``_depthwise1d``)
DW_UNFOLD = 1 << 14
GEMM_ROWS = 32  # conv1d as a product up to this many output positions (batch x length)...
GEMM_COLS = 1 << 16  # ... and this many unfolded elements (beyond, oneDNN is as fast or faster)
# ... and at batch 1 from 512 unfolded elements: torch's batch-1 path (slow_conv2d) costs 30-50 us
# for silero-vad's STFT and first encoder convolutions (the product: 24-29), ~5-11 us for the
# smallest ones (the product: 9-16)
GEMM_MIN = {False: 512, True: 0}
_CONV = {1: conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def spatial_attrs(n: int, kernel: list, strides, dilations, pads, what: str):
    """Defaults filled in and lengths checked: (kernel, strides, dilations, pads[2n])."""
    strides = list(strides) if strides else [1] * n
    dilations = list(dilations) if dilations else [1] * n
    pads = list(pads) if pads else [0] * (2 * n)
    if len(kernel) != n or len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ShapeError(f"{what}: {n} spatial dims but kernel_shape={kernel}, strides={strides}, "
                         f"dilations={dilations}, pads={pads}")
    return [int(k) for k in kernel], strides, dilations, pads


def window_pads(in_sizes, kernel, strides, dilations, pads, auto_pad: str):
    """Begin and end pads per spatial dim. SAME_* depend on the input size, so they are
    computed here at run time; at compile time they may be Dimensions (only sizes need them)."""
    n = len(in_sizes)
    if auto_pad in ("", "NOTSET"):
        return list(pads[:n]), list(pads[n:])
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ShapeError(f"unknown auto_pad {auto_pad!r}")
    begin, end = [], []
    for i in range(n):
        ek = (kernel[i] - 1) * dilations[i] + 1
        out = dim_ceildiv(in_sizes[i], strides[i])
        total = (out - 1) * strides[i] + ek - in_sizes[i]
        if not isinstance(total, int):
            raise ShapeError("SAME pads of a dynamic dim are known at run time only")
        total = max(total, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return begin, end


def window_out_sizes(in_sizes, kernel, strides, dilations, pads, auto_pad: str, ceil_mode: int = 0):
    """Output size per spatial dim of a sliding window (Conv, pools)."""
    n = len(in_sizes)
    out = []
    for i in range(n):
        size, s = in_sizes[i], strides[i]
        ek = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(dim_ceildiv(size, s))
            continue
        pb, pe = (0, 0) if auto_pad == "VALID" else (pads[i], pads[n + i])
        span = size + (pb + pe) - ek
        if isinstance(span, int) and span < 0:
            raise ShapeError(f"input spatial size {size} (pads {pb}+{pe}) is smaller than the window {ek} "
                             f"of dim {i}")
        o = (dim_ceildiv(span, s) if ceil_mode else span // s) + 1
        # ceil_mode: a last window that starts in the end padding is dropped (ONNX, as torch)
        if ceil_mode and isinstance(o, int) and (o - 1) * s >= size + pb:
            o -= 1
        out.append(o)
    return out


def _conv_params(x_shape, w_shape, kernel_shape, strides, dilations, pads, what):
    n = len(x_shape) - 2
    if n < 1:
        raise ShapeError(f"{what}: input must have rank >= 3 (N, C, spatial...), got shape {tuple(x_shape)}")
    kernel = list(kernel_shape) if kernel_shape else list(w_shape[2:])
    return n, *spatial_attrs(n, kernel, strides, dilations, pads, what)


# Conv ---------------------------------------------------------------------------------------
def _conv_infer(shapes, values, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                strides=None):
    x, w = shapes[0], shapes[1]
    n, k, s, d, p = _conv_params(x, w, kernel_shape, strides, dilations, pads, "Conv")
    if len(w) != n + 2:
        raise ShapeError(f"Conv: weight shape {tuple(w)} does not match input shape {tuple(x)}")
    if isinstance(x[1], int) and isinstance(w[1], int) and x[1] != w[1] * group:
        raise ShapeError(f"Conv: input has {x[1]} channels but weight {tuple(w)} with group={group} "
                         f"expects {w[1] * group}")
    return [(x[0], w[0], *window_out_sizes(x[2:], k, s, d, p, auto_pad))]


def _split_pads(begin, end):
    """Symmetric part for the conv call, and an F.pad list for the rest (None when symmetric)."""
    sym = [min(b, e) for b, e in zip(begin, end)]
    if list(begin) == list(end):
        return sym, None
    extra = []
    for b, e, m in zip(reversed(begin), reversed(end), reversed(sym)):  # F.pad wants the last dim first
        extra += [b - m, e - m]
    return sym, extra


def conv_plan(x, w, kernel_shape, strides, dilations, pads, auto_pad):
    """(torch's convNd, x padded where the pads are not symmetric, strides, symmetric pads,
    dilations) for a Conv node's attributes at this input."""
    n, k, s, d, p = _conv_params(x.shape, w.shape, kernel_shape, strides, dilations, pads, "Conv")
    fn = _CONV.get(n)
    if fn is None:
        raise NotImplementedError(f"Conv with {n} spatial dims (torch has 1-D to 3-D)")
    begin, end = window_pads(list(x.shape[2:]), k, s, d, p, auto_pad)
    sym, extra = _split_pads(begin, end)
    if extra is not None:
        x = F.pad(x, extra)
    return fn, x, list(s), sym, list(d)


@op("Conv", (1, 11, 22), infer=_conv_infer, writes_out=False)
def _conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
          strides=None, out=None):
    fn, x, s, p, d = conv_plan(x, w, kernel_shape, strides, dilations, pads, auto_pad)
    if fn is _CONV[2] and tuned_conv.serves(x, w, group, d):  # a static impl's build
        return tuned_conv.conv2d(x, w, b, s, p, d, group)
    if fn is _CONV[2] and cpu_conv.serves(x, w, b, p, group):
        return cpu_conv.pooled_1x1(x, w, b)
    return fn(x, w, b, s, p, d, group)


def bind_conv1d(consts, attrs, relu: bool = False):
    """A 1-D Conv (or ConvAct with a Relu) node's bound kernel (``bound_conv1d``) for its constants and
    attributes, or None: explicit symmetric pads only (auto_pad's depend on the input), a constant
    bias or none."""
    w = consts[1]
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        return None
    pads = list(attrs.get("pads") or [0, 0])
    if len(pads) != 2 or pads[0] != pads[1]:
        return None
    if len(consts) > 2 and consts[2] is not None and not isinstance(consts[2], torch.Tensor):
        return None  # a computed bias
    b = consts[2] if len(consts) > 2 else None
    s, d = (list(attrs.get(key) or [1])[0] for key in ("strides", "dilations"))
    return bound_conv1d(w, b, int(s), int(pads[0]), int(d), int(attrs.get("group", 1)), relu)


@binder("Conv")
def _bind_conv(consts, attrs):
    """A 1-D convolution's weight and attributes read once; 2-D and 3-D ones keep the op."""
    return bind_conv1d(consts, attrs)


# ConvTranspose ------------------------------------------------------------------------------
def _convt_plan(x_shape, w_shape, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads,
                strides):
    """(n, kernel, strides, dilations, output_padding, pads begin, pads end, output sizes)."""
    n, k, s, d, p = _conv_params(x_shape, w_shape, kernel_shape, strides, dilations, pads, "ConvTranspose")
    op_ = list(output_padding) if output_padding else [0] * n
    ins = list(x_shape[2:])
    full = [s[i] * (ins[i] - 1) + op_[i] + (k[i] - 1) * d[i] + 1 for i in range(n)]
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(output_shape)[-n:] if output_shape else [ins[i] * s[i] for i in range(n)]
        begin, end = [], []
        for i in range(n):
            total = full[i] - target[i]
            if not isinstance(total, int):
                begin.append(None)
                end.append(None)
                continue
            if total < 0:  # an output_shape beyond the full result: zeros (+ bias) at the end,
                op_[i] -= total  # as onnxruntime does; that is more output_padding
                total = 0
            small, big = total // 2, total - total // 2
            # ONNX: SAME_UPPER puts the odd pad at the end; SAME_LOWER and NOTSET (an explicit
            # output_shape) at the begin
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        return n, k, s, d, op_, begin, end, target
    if auto_pad == "VALID":
        p = [0] * (2 * n)
    return n, k, s, d, op_, p[:n], p[n:], [full[i] - p[i] - p[n + i] for i in range(n)]


def _convt_infer(shapes, values, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
    x, w = shapes[0], shapes[1]
    if isinstance(x[1], int) and isinstance(w[0], int) and x[1] != w[0]:
        raise ShapeError(f"ConvTranspose: input has {x[1]} channels but weight has shape {tuple(w)}")
    *_, sizes = _convt_plan(x, w, auto_pad, dilations, group, kernel_shape, output_padding, output_shape,
                            pads, strides)
    return [(x[0], w[1] * group, *sizes)]


@op("ConvTranspose", (1, 11, 22), infer=_convt_infer, writes_out=False)
def _conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                    output_padding=None, output_shape=None, pads=None, strides=None, out=None):
    n, k, s, d, op_, begin, end, sizes = _convt_plan(x.shape, w.shape, auto_pad, dilations, group, kernel_shape,
                                                     output_padding, output_shape, pads, strides)
    fn = _CONV_T.get(n)
    if fn is None:
        raise NotImplementedError(f"ConvTranspose with {n} spatial dims (torch has 1-D to 3-D)")
    # torch takes symmetric pads and an output_padding added at the end; asymmetric pads are the
    # symmetric part plus a crop of the result (a copy only in that uncommon case)
    sym = [min(bb, e) for bb, e in zip(begin, end)]
    op_t = [max(0, op_[i] - (end[i] - sym[i])) for i in range(n)]
    if n == 2:
        y = cpu_conv.patch_transpose(x, w, b, k, s, d, begin + end, op_, group)
        if y is not None:
            return y
    limit = [max(s[i], d[i]) for i in range(n)]
    if any(op_t[i] >= limit[i] for i in range(n)):
        # torch refuses an output_padding this large: compute without it and pad zeros (+ bias) on
        y = fn(x, w, None, s, sym, [0] * n, group, d)
        grow = []
        for i in reversed(range(n)):
            grow += [0, op_t[i]]
        y = F.pad(y, grow)
        if b is not None:
            y = y + b.reshape(1, -1, *([1] * n))
    else:
        y = fn(x, w, b, s, sym, op_t, group, d)
    if sym != list(begin) or list(y.shape[2:]) != list(sizes):
        for i in range(n):
            y = y.narrow(2 + i, begin[i] - sym[i], sizes[i])
        y = y.contiguous()
    return y

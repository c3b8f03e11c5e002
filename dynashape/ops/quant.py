"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv and ConvInteger (MatMulInteger lives with the matrix products in linalg.py).

Quantized values of every type are handled as their *values*: an int4 / float4 tensor is held
unpacked in an int8 / float8 tensor (ir/dtypes.py), so reading one is a plain conversion. Writing
one needs the target's rules: integers round half to even and saturate to the type's range,
float types go through ir.dtypes.cast_tensor (round to nearest even, saturation per the Cast
spec). Integer products go through integer_gemm.qmatmul (float32 GEMMs split along K so that every
partial sum is an exact integer, see integer_gemm.py); QLinearConv's convolution runs in float64 (exact
below 2**53), ConvInteger's in float32 on the CPU when its partial sums provably stay below 2**24.

DynamicQuantizeLinear and QLinearMatMul follow onnxruntime's arithmetic bit for bit: the scale and
zero point in float32 (scale 1 for an all-zero input), x / scale in float32 rounded half to even;
the requantization float32(acc) * (a_scale * b_scale / y_scale) in float32.

The type written is the node's output type: ``_out_types`` (the graph's element types of the
outputs, passed in by the runtime) names an INT4 that the held int8 of a zero point cannot.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.dtypes import SUBBYTE_INT, TP, cast_tensor, onnx_elem_type, torch_dtype
from . import byte_tables, qgemm
from .conv import _conv, _conv_infer
from .integer_gemm import _amax, _saturates, prepared_b, qmatmul
from .linalg import _matmul_shape
from .registry import COMPUTED, binder, op
from .shapes import norm_axis, same_as_first
from .weight_cache import ConstantsCache, WeightCache

# Integer quantized types: (lowest, highest) value.
_INT_RANGE = {
    TP.UINT8: (0, 255), TP.INT8: (-128, 127), TP.UINT16: (0, 65535), TP.INT16: (-32768, 32767),
    **{t: ((-(1 << (b - 1)), (1 << (b - 1)) - 1) if signed else (0, (1 << b) - 1))
       for t, (b, signed) in SUBBYTE_INT.items()},
}
_FLOATS = (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16, TP.DOUBLE)


def _out_type(out_types, k: int = 0) -> int:
    """The graph's element type of output k, 0 when the runtime did not say."""
    return out_types[k] if out_types and len(out_types) > k and out_types[k] else 0


def _param(p: torch.Tensor, x: torch.Tensor, axis: int, block_size: int, what: str) -> torch.Tensor:
    """A scale or zero point shaped to broadcast against ``x``: per tensor (one element), per
    axis (1-D along ``axis``) or blocked (x's rank, each element covering ``block_size``
    consecutive elements along ``axis``, the last block possibly shorter)."""
    if p.numel() == 1:
        return p.reshape(())
    ax = norm_axis(axis, x.dim())
    if block_size > 0:
        if p.dim() != x.dim() or any(p.shape[i] != x.shape[i] for i in range(x.dim()) if i != ax):
            raise ShapeError(f"{what} of shape {tuple(p.shape)} does not fit blocked quantization of input "
                             f"{tuple(x.shape)} along axis {axis}")
        if p.shape[ax] != -(-x.shape[ax] // block_size):
            raise ShapeError(f"{what} has {p.shape[ax]} blocks along axis {axis}, but an input of size "
                             f"{x.shape[ax]} in blocks of {block_size} has {-(-x.shape[ax] // block_size)}")
        return p.repeat_interleave(block_size, dim=ax).narrow(ax, 0, x.shape[ax])
    if p.dim() != 1 or p.shape[0] != x.shape[ax]:
        raise ShapeError(f"{what} of shape {tuple(p.shape)}: per-axis quantization along axis {axis} of input "
                         f"{tuple(x.shape)} needs a 1-D tensor of {x.shape[ax]} elements")
    shape = [1] * x.dim()
    shape[ax] = -1
    return p.reshape(shape)


def _requantize(v: torch.Tensor, to: int, saturate: bool = True) -> torch.Tensor:
    """Values (already divided by the scale, zero point added) written as type ``to``."""
    rng = _INT_RANGE.get(to)
    if rng is None:
        return cast_tensor(v, to, saturate)  # float8 / float4: the Cast rules round and saturate
    return torch.round(v).clamp_(*rng).to(torch_dtype(to))  # torch.round: half to even


# QuantizeLinear -----------------------------------------------------------------------------
def _division_dtype(precision: int, scale: torch.Tensor) -> torch.dtype:
    """The precision of x / y_scale: the ``precision`` attribute, else the scale's type; float32
    for an int32 or float8e8m0 scale, whose own type cannot hold a quotient."""
    et = precision or onnx_elem_type(scale)
    return torch_dtype(et) if et in _FLOATS else torch.float32


def _quantize(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, precision=0, saturate=1,
              _out_types=None, out=None):
    # output_dtype, else the graph's type of y (an INT4 zero point is held as int8: only the
    # graph tells), else the zero point's type, else uint8
    to = output_dtype or _out_type(_out_types)
    if not to:
        to = TP.UINT8 if y_zero_point is None else onnx_elem_type(y_zero_point)
    dt = _division_dtype(precision, y_scale)
    if to in (TP.UINT8, TP.INT8) and dt == torch.float32 and x.dtype == torch.float32 and x.device.type == "cpu" \
            and y_scale.numel() == 1 and y_scale.dtype == torch.float32 and y_scale.device.type == "cpu" \
            and (y_zero_point is None or (y_zero_point.numel() == 1 and y_zero_point.device.type == "cpu")):
        r = byte_tables.quantize(x, y_scale.item(), 0 if y_zero_point is None else int(y_zero_point.item()),
                                 torch_dtype(to), out)  # one C pass
        if r is not None:
            return r if out is None or r is out else out.copy_(r)
    q = x.to(dt) / _param(y_scale, x, axis, block_size, "y_scale").to(dt)
    if to in _INT_RANGE:
        q = torch.round(q)  # rounded in the division's precision, before the zero point is added
    q = q.to(torch.float32)  # exact for every integer a quantized type holds
    if y_zero_point is not None:
        q = q + _param(y_zero_point, x, axis, block_size, "y_zero_point").to(q.dtype)
    r = _requantize(q, to, bool(saturate))
    return r if out is None else out.copy_(r)


op("QuantizeLinear", (10, 13, 19, 21, 23, 24, 25, 28), infer=same_as_first)(_quantize)

_SMALL_INTS = (torch.uint8, torch.int8, torch.int16, torch.uint16)


@binder("QuantizeLinear")
def _bind_quantize(consts, attrs):
    """One constant float32 scale and zero point, to uint8 / int8 with a float32 division: the
    numbers read once and the C pass called straight (the op read both back every call)."""
    c = list(consts) + [None] * (3 - len(consts))
    scale, zp = c[1], c[2]
    if not _one_number(scale) or scale.dtype != torch.float32 or (zp is not None and not _one_number(zp)):
        return None
    to = attrs.get("output_dtype") or _out_type(attrs.get("_out_types"))
    if not to:
        to = TP.UINT8 if zp is None else onnx_elem_type(zp)
    if to not in (TP.UINT8, TP.INT8) or _division_dtype(attrs.get("precision", 0), scale) != torch.float32:
        return None
    sc, z, dt = scale.item(), 0 if zp is None else int(zp.item()), torch_dtype(to)
    full = partial(_quantize, **attrs)

    def kernel(x, y_scale, y_zero_point=None, *, out=None):
        r = byte_tables.quantize(x, sc, z, dt, out) if x.dtype == torch.float32 else None
        if r is not None:
            return r if out is None or r is out else out.copy_(r)
        return full(x, y_scale, y_zero_point, out=out)

    return kernel


# DequantizeLinear ---------------------------------------------------------------------------
def _dequantize(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0, _out_types=None,
                out=None):
    to = output_dtype or _out_type(_out_types) or onnx_elem_type(x_scale)
    if to not in _FLOATS:
        to = TP.FLOAT  # a float8e8m0 scale is no output type (T3 lacks it): without output_dtype, float
    if (x.dtype in (torch.uint8, torch.int8, torch.int16, torch.uint16) and to == TP.FLOAT and x_scale.numel() == 1
            and x_scale.dtype == torch.float32 and (x_zero_point is None or x_zero_point.numel() == 1)):
        # one scale and zero point, values of at most 16 bits: x - zp is exact in float32 too, so
        # two in-place steps give the integer path's float32 numbers (a tiny model's embeddings:
        # six calls were most of the node)
        # (host numbers where the parameters live on the host: a float32 scale as a Python float
        # multiplies in float32 all the same, and no reshape / to() a call)
        on_host = x_scale.device.type == "cpu" and (x_zero_point is None or x_zero_point.device.type == "cpu")
        zp = (int(x_zero_point.item()) if on_host else x_zero_point.reshape(()).to(torch.float32)) \
            if x_zero_point is not None else 0
        sc = x_scale.item() if on_host else x_scale.reshape(())
        if on_host:
            r = byte_tables.dequantize(x, zp, sc, out)  # one C pass
            if r is not None:
                return r if out is None or r is out else out.copy_(r)
        v = x.to(torch.float32)
        if x_zero_point is not None:
            v = v.sub_(zp)
        return v.mul_(sc) if out is None else torch.mul(v, sc, out=out)
    if x.dtype.is_floating_point:  # float8 / float4 values: exact in float32
        v = x.to(torch.float32)
        if x_zero_point is not None:
            v = v - _param(x_zero_point, x, axis, block_size, "x_zero_point").to(torch.float32)
    else:  # the difference in integers (int32 inputs), then to float
        v = x.to(torch.int64)
        if x_zero_point is not None:
            v = v - _param(x_zero_point, x, axis, block_size, "x_zero_point").to(torch.int64)
        v = v.to(torch.float32)
    r = (v * _param(x_scale, x, axis, block_size, "x_scale").to(torch.float32)).to(torch_dtype(to))
    return r if out is None else out.copy_(r)


op("DequantizeLinear", (10, 13, 19, 21, 23, 24, 25, 28), infer=same_as_first)(_dequantize)


def _one_number(t) -> bool:
    return type(t) is torch.Tensor and t.numel() == 1 and t.device.type == "cpu"


@binder("DequantizeLinear")
def _bind_dequantize(consts, attrs):
    """One constant float32 scale and zero point to float32: read once (each call read both back
    with ``item()``, ~5 us of a tiny model's embedding lookup), the C pass called straight."""
    c = list(consts) + [None] * (3 - len(consts))
    scale, zp = c[1], c[2]
    if not _one_number(scale) or scale.dtype != torch.float32 or (zp is not None and not _one_number(zp)) \
            or (attrs.get("output_dtype") or _out_type(attrs.get("_out_types")) or TP.FLOAT) != TP.FLOAT:
        return None
    sc, z = scale.item(), 0 if zp is None else int(zp.item())
    full = partial(_dequantize, **attrs)

    def kernel(x, x_scale, x_zero_point=None, *, out=None):
        r = byte_tables.dequantize(x, z, sc, out) if x.dtype in _SMALL_INTS else None
        if r is not None:
            return r if out is None or r is out else out.copy_(r)
        return full(x, x_scale, x_zero_point, out=out)

    return kernel


# DynamicQuantizeLinear ----------------------------------------------------------------------
def _dql_infer(shapes, values):
    return [shapes[0], (), ()]


_F32_MAX = 3.4028234663852886e38


def dynamic_qparams(lo: float, hi: float) -> tuple[float, int] | None:
    """onnxruntime's GetQuantizationParameter for uint8, in float32: the range [min(lo, 0),
    max(hi, 0)], scale = range / 255 (1 for an all-zero input, whose values all quantize to
    0 then), zero point = round-half-even(clamp(0 - min / scale, 0, 255)). None when the range is
    not finite or the scale underflows (the tensor path then gives what the formula gives)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi == lo:
        return (1.0, 0) if hi == 0.0 else None
    if not (hi - lo <= _F32_MAX):  # also catches inf and nan
        return None
    f32 = np.float32
    lo32 = f32(lo)
    scale = f32(f32(hi) - lo32) / f32(255.0)
    if scale == 0:
        return None
    zp = float(f32(0.0) - lo32 / scale)
    return float(scale), round(0.0 if zp < 0.0 else 255.0 if zp > 255.0 else zp)  # round(): half to even


def host_qparams(xf: torch.Tensor) -> tuple[float, int] | None:
    """DynamicQuantizeLinear's (scale, zero point) of a float32 CPU tensor as host numbers; None
    on a device (no host round trip there) or for a range the formula cannot take on the host."""
    if xf.device.type != "cpu":
        return None
    if not xf.numel():
        return 1.0, 0
    lo, hi = torch.aminmax(xf)
    return dynamic_qparams(lo.item(), hi.item())


def quantize_u8(x: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    """MlasQuantizeLinear: x / scale in float32, round half to even, clamped to [-zp, 255 - zp]:
    the quantized value minus its zero point, as float32 (exact small integers)."""
    q = torch.div(x, scale) if x.dtype == torch.float32 else torch.div(x.to(torch.float32), scale)
    return q.round_().clamp_(-zp, 255 - zp)


def _dql_tensor_path(xf: torch.Tensor):
    """The same formula in tensor ops, for devices (no host round trip) and odd ranges. Every
    divisor is a tensor on the device: CUDA divides by a host scalar as a multiplication by its
    reciprocal, which rounds differently."""
    if xf.numel():
        lo, hi = torch.aminmax(xf)
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    else:
        lo = hi = torch.zeros((), device=xf.device)
    scale = torch.where(hi == lo, torch.ones_like(hi), (hi - lo) / torch.full((), 255.0, device=xf.device))
    zp = (0 - lo / scale).clamp(0, 255).round()
    y = torch.round(xf / scale).add_(zp).clamp_(0, 255)
    return y, scale, zp


@op("DynamicQuantizeLinear", 11, infer=_dql_infer)
def _dynamic_quantize(x, *, out=None):
    """uint8 over [min(0, x), max(0, x)], as onnxruntime computes it (bit for bit)."""
    xf = x if x.dtype == torch.float32 else x.to(torch.float32)
    r = qgemm.quantized(xf, None if out is None else out[0])  # one C pass on the CPU
    if r is not None:
        q, scale, zp = r
        if out is None:
            return q, torch.tensor(scale, dtype=torch.float32), torch.tensor(zp, dtype=torch.uint8)
        if q is not out[0]:
            out[0].copy_(q)
        out[1].fill_(scale)
        out[2].fill_(zp)
        return out
    qp = host_qparams(xf)
    if qp is None:
        y, scale, zp = _dql_tensor_path(xf)
        res = (y.to(torch.uint8), scale.to(torch.float32), zp.to(torch.uint8))
        return res if out is None else tuple(o.copy_(r) for o, r in zip(out, res))
    scale, zp = qp
    q = quantize_u8(xf, scale, zp).add_(zp)
    if out is None:
        return (q.to(torch.uint8), torch.tensor(scale, dtype=torch.float32, device=x.device),
                torch.tensor(zp, dtype=torch.uint8, device=x.device))
    out[0].copy_(q)
    out[1].fill_(scale)
    out[2].fill_(zp)
    return out


# QLinearMatMul ------------------------------------------------------------------------------
def _qmm_infer(shapes, values, **_attrs):
    return [_matmul_shape(shapes[0], shapes[3], "QLinearMatMul")]


def _per_row(p: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A's scale / zero point: one per row (1-D of A's rows) or one for all."""
    if p.numel() == 1:
        return p.reshape(())
    if p.dim() != 1 or a.dim() < 2 or p.shape[0] != a.shape[-2]:
        raise ShapeError(f"a's scale / zero point of shape {tuple(p.shape)} is neither one value nor one per "
                         f"row of a {tuple(a.shape)}")
    return p.reshape(-1, 1)


def _per_col(p: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """B's scale / zero point: one per column (1-D of B's columns) or one for all."""
    if p.numel() == 1:
        return p.reshape(())
    if p.dim() != 1 or p.shape[0] != b.shape[-1]:
        raise ShapeError(f"b's scale / zero point of shape {tuple(p.shape)} is neither one value nor one per "
                         f"column of b {tuple(b.shape)}")
    return p


def _centered(x: torch.Tensor, zp: torch.Tensor | None) -> torch.Tensor:
    v = x.to(torch.float64)
    return v if zp is None else v - zp.to(torch.float64)


def _qlinear_out(acc, multiplier, y_zero_point, to: int) -> torch.Tensor:
    """acc * multiplier + y_zero_point written as ``to`` (the multiplier in float32, as the
    scales are; the product in float64 so a large accumulator keeps its low digits)."""
    v = acc * multiplier.to(torch.float64)
    if y_zero_point is not None:
        v = v + y_zero_point.to(torch.float64).reshape(())  # per tensor only
    return _requantize(v, to)


def _requant_f32(acc: torch.Tensor, multiplier: torch.Tensor, y_zero_point, to: int) -> torch.Tensor:
    """MlasRequantizeOutput: float32(acc) * multiplier in float32, rounded half to even, plus the
    zero point, saturated to ``to`` (onnxruntime's QLinearMatMul)."""
    v = acc.to(torch.float32) * multiplier
    v = torch.round(v)
    if y_zero_point is not None:
        v = v + y_zero_point.to(torch.float32).reshape(())  # per tensor only
    return _requantize(v, to)


@op("QLinearMatMul", (10, 21), infer=_qmm_infer)
def _qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *,
                    _out_types=None, out=None):
    za = None if a_zero_point is None else _per_row(a_zero_point, a)
    zb = None if b_zero_point is None else _per_col(b_zero_point, b)
    to = _out_type(_out_types) or onnx_elem_type(y_zero_point if y_zero_point is not None else a)
    r = _qlinear_native(a, za, a_scale, b, zb, b_scale, y_scale, y_zero_point, to, out)
    if r is not None:
        return r if out is None or r is out else out.copy_(r)
    f32 = torch.float32
    # onnxruntime: a_scale * b_scale / y_scale in float32, in that order
    multiplier = _per_row(a_scale, a).to(f32) * _per_col(b_scale, b).to(f32) / y_scale.to(f32).reshape(())
    acc = qmatmul(a, b, za, zb)  # exact (float32 / float64 holding the integers)
    r = _requant_f32(acc, multiplier, y_zero_point, to)
    return r if out is None else out.copy_(r)


def _qlinear_native(a, za, a_scale, b, zb, b_scale, y_scale, y_zero_point, to, out):
    """The product and its requantization in one qgemm.c call (a 2-D B, one scale and zero point
    of A, B's scale per tensor or per column, uint8 / int8 out), or None."""
    if a.device.type != "cpu" or a.dtype not in (torch.uint8, torch.int8) or b.dim() < 2 \
            or to not in (TP.UINT8, TP.INT8) or (za is not None and za.numel() != 1) or a_scale.numel() != 1 \
            or (y_zero_point is not None and y_zero_point.numel() != 1) or _saturates(a, b):
        return None
    requant = (0 if y_zero_point is None else int(y_zero_point.item()), torch_dtype(to))
    if b.dim() > 2:  # B changes every call (attention): both operands as they come
        m = _host_multiplier(a_scale, b_scale, y_scale)
        if m is None or (zb is not None and zb.numel() != 1):
            return None
        return qgemm.batched(a, b, 0 if za is None else int(za.item()), 0 if zb is None else int(zb.item()),
                             requant=requant, mult=m, out=out)
    multiplier = _b_multiplier(a_scale, b_scale, y_scale, b)
    if multiplier is None:
        return None
    return qgemm.product(a, qgemm.byte_kind(a), prepared_b(b, zb),
                         a_zp=0 if za is None else int(za.item()), b_scale=multiplier, out=out, requant=requant)


@binder("QLinearMatMul")
def _bind_qlinear_matmul(consts, attrs):
    """QLinearMatMul of a constant 2-D B whose scales and zero points (A's and Y's too) are
    constants: the multiplier, the requantization and qgemm.c's B read once (qgemm.bind), where
    the op reads eight tensors every call. Anything it does not serve goes to the op itself."""
    c = list(consts) + [None] * (8 - len(consts))
    a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = c[1:8]
    if any(t is COMPUTED or t is None for t in (a_scale, b, b_scale, y_scale, y_zp)) or a_zp is COMPUTED \
            or b_zp is COMPUTED or b.dim() != 2 or b.dtype not in (torch.uint8, torch.int8):
        return None
    to = _out_type(attrs.get("_out_types")) or onnx_elem_type(y_zp)
    if to not in (TP.UINT8, TP.INT8) or a_scale.numel() != 1 or y_zp.numel() != 1 \
            or (a_zp is not None and a_zp.numel() != 1) or any(t.device.type != "cpu" for t in (a_scale, b, b_scale)):
        return None
    try:
        zb = None if b_zp is None else _per_col(b_zp, b)
        multiplier = _b_multiplier(a_scale, b_scale, y_scale, b)
    except ShapeError:
        return None
    if multiplier is None:
        return None
    run = qgemm.bind(prepared_b(b, zb), b_scale=multiplier, requant=(int(y_zp.item()), torch_dtype(to)))
    if run is None:
        return None
    za = 0 if a_zp is None else int(a_zp.item())
    full = partial(_qlinear_matmul, **attrs)

    def kernel(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, out=None):
        if a.dtype in (torch.uint8, torch.int8) and not _saturates(a, b):
            r = run(a, qgemm.byte_kind(a), 1.0, za, out)
            if r is not None:
                return r if out is None or r is out else out.copy_(r)
        return full(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, out=out)

    return kernel


def _b_multiplier(a_scale, b_scale, y_scale, b) -> torch.Tensor | None:
    """a_scale * b_scale / y_scale as qgemm.c's epilogue reads it for a 2-D B: one float32 value
    (kept per the three scale tensors) or one per column; None where it is not finite."""
    if b_scale.numel() == 1:
        return _multiplier_tensor(a_scale, b_scale, y_scale)
    m = a_scale.reshape(()).to(torch.float32) * _per_col(b_scale, b).to(torch.float32) \
        / y_scale.to(torch.float32).reshape(())
    return m if m.dim() == 1 and bool(torch.isfinite(m).all()) else None


_MULTIPLIERS = ConstantsCache()


def _multiplier_tensor(a_scale, b_scale, y_scale) -> torch.Tensor | None:
    """_host_multiplier as the one-element float32 tensor the kernel reads, kept per the three scale
    tensors (a static model's constants; the same tensor each call also lets qgemm.product find its
    kept epilogue)."""
    def make():
        m = _host_multiplier(a_scale, b_scale, y_scale)
        return None if m is None else torch.tensor([m])
    return _MULTIPLIERS.get((a_scale, b_scale, y_scale), make)


def _host_multiplier(a_scale, b_scale, y_scale) -> float | None:
    """a_scale * b_scale / y_scale in float32, in that order (onnxruntime's), of per-tensor scales on
    the host; None when one is not per tensor or the result is not finite."""
    if b_scale.numel() != 1 or y_scale.numel() != 1:
        return None
    f32 = np.float32
    m = f32(f32(f32(a_scale.item()) * f32(b_scale.item())) / f32(y_scale.item()))
    return float(m) if np.isfinite(m) else None


# QLinearConv, ConvInteger -------------------------------------------------------------------
def _per_out_channel(p: torch.Tensor, n_out: int, trailing: int, what: str) -> torch.Tensor:
    """A weight scale / zero point: one value, or one per output channel shaped (M, 1, ...) with
    ``trailing`` ones, to broadcast over a weight (channel first) or an output (channel second)."""
    if p.numel() == 1:
        return p.reshape(())
    if p.dim() != 1 or p.shape[0] != n_out:
        raise ShapeError(f"{what} of shape {tuple(p.shape)} is neither one value nor one per output channel "
                         f"({n_out})")
    return p.reshape(-1, *([1] * trailing))


def _int_conv(x, x_zero_point, w, w_zero_point, attrs, what: str) -> torch.Tensor:
    """The exact integer convolution of (x - x_zero_point) and (w - w_zero_point), in float64;
    padding adds zeros to the centered input, as ONNX pads with the zero point."""
    if x_zero_point is not None and x_zero_point.numel() != 1:
        raise ShapeError(f"{what}: x_zero_point must be one value, got shape {tuple(x_zero_point.shape)}")
    wz = None if w_zero_point is None else _per_out_channel(w_zero_point, w.shape[0], w.dim() - 1,
                                                             f"{what} w_zero_point")
    return _conv(_centered(x, None if x_zero_point is None else x_zero_point.reshape(())), _centered(w, wz), **attrs)


def _qconv_infer(shapes, values, **attrs):
    return _conv_infer([shapes[0], shapes[3]], values, **attrs)


@op("QLinearConv", 10, infer=_qconv_infer)
def _qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point=None, B=None, *,
                  auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                  out=None):
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    acc = _int_conv(x, x_zero_point, w, w_zero_point, attrs, "QLinearConv")
    if B is not None:
        acc = acc + B.to(torch.float64).reshape(-1, *([1] * (acc.dim() - 2)))
    f32 = torch.float32
    w_s = _per_out_channel(w_scale, w.shape[0], acc.dim() - 2, "QLinearConv w_scale").to(f32)
    multiplier = x_scale.to(f32).reshape(()) * w_s / y_scale.to(f32).reshape(())
    to = onnx_elem_type(y_zero_point if y_zero_point is not None else x)
    r = _qlinear_out(acc, multiplier, y_zero_point, to)
    return r if out is None else out.copy_(r)


_CONV_PLANS = WeightCache()  # per weight: the L1 bound of a ConvInteger's products


def _conv_weight_l1(w: torch.Tensor, w_zero_point) -> float:
    """max over output channels of sum |w - w_zero_point| (cached per weight tensor object)."""
    zk = None if w_zero_point is None else (id(w_zero_point), w_zero_point._version)

    def make():
        wf = w.to(torch.float64)
        if w_zero_point is not None:
            wf = wf - _per_out_channel(w_zero_point, w.shape[0], w.dim() - 1, "ConvInteger w_zero_point").to(
                torch.float64)
        return float(wf.abs().reshape(w.shape[0], -1).sum(1).max()) if w.numel() else 0.0
    return _CONV_PLANS.get(w, make, tag=zk)


@op("ConvInteger", 10, infer=_conv_infer)
def _conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                  kernel_shape=None, pads=None, strides=None, out=None):
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    if x_zero_point is not None and x_zero_point.numel() != 1:
        raise ShapeError(f"ConvInteger: x_zero_point must be one value, got shape {tuple(x_zero_point.shape)}")
    # float32 on the CPU when every partial sum stays below 2**24 (max |x - zx| times the largest
    # sum of |w - zw| of an output channel): exact, and 2-4x faster than float64. (On CUDA, cuDNN
    # may pick FFT / Winograd algorithms, exact for no float type: float64, then rounding.)
    if x.device.type == "cpu" and x.dtype in (torch.uint8, torch.int8) and w.dtype in (torch.uint8, torch.int8):
        amax = _amax(x, None if x_zero_point is None else x_zero_point.reshape(()))
        if amax is not None and amax * _conv_weight_l1(w, w_zero_point) < float(1 << 24):
            xf = x.to(torch.float32)
            if x_zero_point is not None:
                xf = xf.sub_(x_zero_point.reshape(()).to(torch.float32))
            wf = w.to(torch.float32)
            if w_zero_point is not None:
                wf = wf - _per_out_channel(w_zero_point, w.shape[0], w.dim() - 1,
                                           "ConvInteger w_zero_point").to(torch.float32)
            r = _conv(xf, wf, **attrs)
            return r.to(torch.int32) if out is None else out.copy_(r)
    r = _int_conv(x, x_zero_point, w, w_zero_point, attrs, "ConvInteger").round().to(torch.int32)
    return r if out is None else out.copy_(r)

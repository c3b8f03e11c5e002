"""QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul (domain ``com.microsoft``).

Exact integer products (integer_gemm.qmatmul, or qgemm.c in one call on the CPU), then the float32
scale (and bias) onnxruntime's output processors apply; DynamicQuantizeMatMul quantizes A to
uint8 as onnxruntime does first.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ShapeError
from . import qgemm
from .integer_gemm import prepared_b, qmatmul
from .linalg import _matmul_shape
from .qlinear_arith import _F32, _RANGE, DOMAIN, _eight_bit, _one, _put, _requant, _scale
from .registry import COMPUTED, binder, op
from .u8s8 import u8s8_saturation


# ---- integer products ---------------------------------------------------------------------------
def _exact_matmul(a: torch.Tensor, a_zp, b: torch.Tensor, b_zp) -> torch.Tensor:
    """(a - a_zp) @ (b - b_zp) exactly (int32, or float32 / float64 holding integers). a_zp: None,
    one value, or one per row of a; b_zp: None, one value, or one per column of b. Through
    integer_gemm.qmatmul: its float32 / _int_mm fast paths and the u8s8 saturation switch."""
    if a_zp is not None and a_zp.numel() > 1:
        a_zp = a_zp.reshape(-1)  # one per row: the form qmatmul takes
    return qmatmul(a, b, a_zp, b_zp)


def _per_row_zp(p, a, what):
    if p is None or p.numel() == 1:
        return None if p is None else p.reshape(())
    if p.dim() == 1 and a.dim() >= 2 and p.shape[0] == a.shape[-2]:
        return p.reshape(-1, 1)
    raise ShapeError(f"{what} of shape {tuple(p.shape)} is neither one value nor one per row of A {tuple(a.shape)}")


def _per_column(p, b, what):
    """A B-side scale or zero point: one value, or one per column of B (shape (N,) or B's batch
    dims with a 1 for K)."""
    if p is None or p.dim() == 0:
        return p  # (as it comes: prepared_b knows a constant by its identity)
    if p.numel() == 1:
        return p.reshape(())
    n = b.shape[-1]
    if p.dim() == 1 and p.shape[0] == n:
        return p
    if p.dim() == b.dim() and p.shape[-1] == n and p.shape[-2] == 1:
        return p
    raise ShapeError(f"{what} of shape {tuple(p.shape)} is neither one value nor one per column of B "
                     f"{tuple(b.shape)}")


# ---- QGemm --------------------------------------------------------------------------------------
def _gemm_dims(a_shape, b_shape, trans_a, trans_b):
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ShapeError(f"QGemm: A and B must be 2-D, got shapes {tuple(a_shape)} and {tuple(b_shape)}")
    m, ka = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    kb, n = (b_shape[1], b_shape[0]) if trans_b else (b_shape[0], b_shape[1])
    if isinstance(ka, int) and isinstance(kb, int) and ka != kb:
        raise ShapeError(f"QGemm: inner dimensions differ: A {tuple(a_shape)} (transA={trans_a}) has K={ka}, "
                         f"B {tuple(b_shape)} (transB={trans_b}) has K={kb}")
    return m, n


def _qgemm_infer(shapes, values, *, alpha=1.0, transA=0, transB=0):
    return [tuple(_gemm_dims(shapes[0], shapes[3], transA, transB))]


@op("QGemm", 1, DOMAIN, infer=_qgemm_infer,
    notes="exact integer products (onnxruntime's AVX2 kernels without VNNI saturate uint8 x int8 pairs)")
def _qgemm(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None, *,
           alpha=1.0, transA=0, transB=0, out=None):
    _eight_bit(a, "QGemm A")
    _eight_bit(b, "QGemm B")
    m, n = _gemm_dims(a.shape, b.shape, transA, transB)
    a2 = a.t() if transA else a
    b2 = b.t() if transB else b
    za = None if a_zero_point is None else torch.tensor(int(_one(a_zero_point, "QGemm a_zero_point")),
                                                        device=a.device)
    zb = None if b_zero_point is None else _per_column(b_zero_point.reshape(-1), b2, "QGemm b_zero_point")
    acc = _exact_matmul(a2, za, b2, zb)
    if c is not None:
        acc = acc + c.to(torch.float64)  # int32 bias, accumulated before the scaling
    # output scale per column: alpha * a_scale * b_scale (/ y_scale), in float32 in that order
    sa = _F32(_F32(alpha) * _scale(a_scale, "QGemm a_scale"))
    bs = b_scale.reshape(-1).to(torch.float32)
    if bs.numel() not in (1, n):
        raise ShapeError(f"QGemm: b_scale must be one value or one per column ({n}), got shape "
                         f"{tuple(b_scale.shape)}")
    scale = bs * float(sa)
    if y_scale is not None:
        scale = scale / float(_scale(y_scale, "QGemm y_scale"))
    v = acc.to(torch.float32) * scale
    if y_zero_point is None:  # onnxruntime requantizes only with a zero point (y_scale alone still divides)
        return _put(out, v)
    lo, hi = _eight_bit(y_zero_point, "QGemm y_zero_point")
    y = _requant(v, int(_one(y_zero_point, "QGemm y_zero_point")), lo, hi).to(y_zero_point.dtype)
    return _put(out, y)


# ---- MatMulIntegerToFloat / DynamicQuantizeMatMul ------------------------------------------------
def _mm_infer(shapes, values, **_attrs):
    return [_matmul_shape(shapes[0], shapes[1], "MatMulIntegerToFloat")]


def _scaled_output(acc, multiplier, bias, out_scale=None, dtype=torch.float32):
    """MLAS's scale-bias output processor: float32(acc) * multiplier (+ bias); a scale that is not
    per tensor / per column is applied to the result afterwards (onnxruntime's ScaleOutput)."""
    y = acc.to(torch.float32) * multiplier
    if bias is not None:
        y = y + bias.to(torch.float32)
    if out_scale is not None:
        y = y * out_scale.to(torch.float32)
    return y.to(dtype)


def _b_multiplier(a_scale_value, b_scale, b, what):
    """a_scale * b_scale in float32, per tensor or per column; a b_scale of another shape
    comes back as the second item, to scale the output with."""
    try:
        bs = _per_column(b_scale, b, what)
    except ShapeError:
        return torch.tensor(float(a_scale_value), device=b.device), b_scale
    bs = b_scale.reshape(()) if bs is None else bs
    return bs.to(torch.float32) * float(a_scale_value), None


@op("MatMulIntegerToFloat", 1, DOMAIN, infer=_mm_infer, notes="exact integer products, per-tensor or per-column B")
def _matmul_integer_to_float(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *, out=None):
    _eight_bit(a, "MatMulIntegerToFloat A")
    _eight_bit(b, "MatMulIntegerToFloat B")
    _matmul_shape(tuple(a.shape), tuple(b.shape), "MatMulIntegerToFloat")
    # onnxruntime swaps the scales when a fusion left them the wrong way round
    if a_scale.numel() != 1:
        if a_scale.dim() == 1 or a_scale.shape[-1] != 1:
            a_scale, b_scale = b_scale, a_scale
    elif b_scale.numel() != 1 and b_scale.dim() > 1 and b_scale.shape[-2] != 1:
        a_scale, b_scale = b_scale, a_scale
    za_value = None if a_zero_point is None else int(_one(a_zero_point, "MatMulIntegerToFloat a_zero_point"))
    zb = _per_column(b_zero_point, b, "MatMulIntegerToFloat b_zero_point")
    a_is_scalar = a_scale.numel() == 1
    sa = _F32(a_scale.item()) if a_is_scalar else _F32(1.0)
    dt = a_scale.dtype if a_scale.dtype.is_floating_point else torch.float32
    y = _native(a, za_value or 0, b, zb, sa, b_scale, bias, out=out) if a_is_scalar else None
    if y is not None:
        return _put(out, y if y.dtype == dt else y.to(dt))
    za = None if za_value is None else torch.tensor(za_value, device=a.device)
    acc = _exact_matmul(a, za, b, zb)
    mult, rest = _b_multiplier(sa, b_scale, b, "MatMulIntegerToFloat b_scale")
    y = _scaled_output(acc, mult, bias, None, torch.float32)
    if not a_is_scalar:
        y = y * a_scale.to(torch.float32)
    if rest is not None:
        y = y * rest.to(torch.float32)
    return _put(out, y.to(dt))


def _native(a, za: int, b, zb, a_scale, b_scale, bias, kind=None, out=None):
    """float32(exact (A - za) @ (B - zb)) * float32(a_scale * b_scale) [+ bias] in one qgemm.c call
    (A uint8 / int8, or float32 to quantize with ``kind`` A_DYNAMIC), or None where it does not
    serve: a b_scale other than per tensor / per column, the u8s8 saturation switch, not the CPU.
    Into ``out`` where it is a float32 buffer of the result's shape."""
    if a.device.type != "cpu" or (u8s8_saturation() and b.dtype == torch.int8 and a.dtype != torch.int8):
        return None
    if not (b_scale.numel() == 1 or (b_scale.dim() == 1 and b_scale.shape[0] == b.shape[-1])):
        return None
    return qgemm.product(a, qgemm.byte_kind(a) if kind is None else kind, prepared_b(b, zb), a_scale=float(a_scale),
                         a_zp=za, b_scale=b_scale, bias=bias,
                         out=out if out is not None and out.dtype == torch.float32 else None)


def _dynamic_quant_params(a: torch.Tensor) -> tuple[np.float32, int]:
    """onnxruntime's GetQuantizationParameter for uint8: the range [min(a, 0), max(a, 0)]."""
    if a.numel():
        lo, hi = torch.aminmax(a.to(torch.float32))
        lo, hi = _F32(min(lo.item(), 0.0)), _F32(max(hi.item(), 0.0))
    else:
        lo = hi = _F32(0.0)
    scale = _F32(1.0) if hi == lo else _F32(_F32(hi - lo) / _F32(255.0))
    zp = np.rint(np.clip(_F32(_F32(0.0) - _F32(lo / scale)), _F32(0), _F32(255)))
    return scale, int(zp)


@op("DynamicQuantizeMatMul", 1, DOMAIN, infer=_mm_infer,
    notes="A quantized to uint8 as onnxruntime does; exact integer products")
def _dynamic_quantize_matmul(a, b, b_scale, b_zero_point=None, bias=None, *, out=None):
    _eight_bit(b, "DynamicQuantizeMatMul B")  # (the shapes: checked by its shape function, _mm_infer)
    zb = _per_column(b_zero_point, b, "DynamicQuantizeMatMul b_zero_point")
    y = _native(a, 0, b, zb, 1.0, b_scale, bias, qgemm.A_DYNAMIC, out)
    if y is not None:
        return _put(out, y if y.dtype == a.dtype else y.to(a.dtype))
    scale, zp = _dynamic_quant_params(a)
    # MlasQuantizeLinear: a / scale in float32, clamped to [0 - zp, 255 - zp], rounded, + zp
    qa = _requant(a.to(torch.float32) / float(scale), zp, 0, 255)
    acc = _exact_matmul(qa.to(torch.uint8), torch.tensor(zp, device=a.device), b, zb)
    mult, rest = _b_multiplier(scale, b_scale, b, "DynamicQuantizeMatMul b_scale")
    y = _scaled_output(acc, mult, bias, rest, torch.float32)
    return _put(out, y.to(a.dtype))


def _bound_product(b, b_scale, b_zp, bias, what: str):
    """qgemm.bind for a contrib product's constant B side (_native's conditions), or None."""
    if any(t is COMPUTED for t in (b, b_scale, b_zp, bias)) or b is None or b_scale is None \
            or b.device.type != "cpu" or b.dim() != 2 or b.dtype not in _RANGE \
            or not (b_scale.numel() == 1 or (b_scale.dim() == 1 and b_scale.shape[0] == b.shape[-1])):
        return None
    try:
        zb = _per_column(b_zp, b, f"{what} b_zero_point")
    except ShapeError:
        return None
    return qgemm.bind(prepared_b(b, zb), b_scale=b_scale, bias=bias)


@binder("DynamicQuantizeMatMul", DOMAIN)
def _bind_dynamic_quantize_matmul(consts, attrs):
    """DynamicQuantizeMatMul of constant B, scale, zero point and bias: qgemm.c's B and epilogue read
    once (qgemm.bind) where the op checks and looks them up every call; the op itself elsewhere."""
    c = list(consts) + [None] * (5 - len(consts))
    run = _bound_product(c[1], c[2], c[3], c[4], "DynamicQuantizeMatMul")
    if run is None:
        return None
    int8 = c[1].dtype == torch.int8

    def kernel(a, b, b_scale, b_zero_point=None, bias=None, *, out=None):
        if not (int8 and u8s8_saturation()):
            y = run(a, qgemm.A_DYNAMIC, 1.0, 0, out if out is not None and out.dtype == torch.float32 else None)
            if y is not None:
                return _put(out, y if y.dtype == a.dtype else y.to(a.dtype))
        return _dynamic_quantize_matmul(a, b, b_scale, b_zero_point, bias, out=out)

    return kernel


@binder("MatMulIntegerToFloat", DOMAIN)
def _bind_matmul_integer_to_float(consts, attrs):
    """MatMulIntegerToFloat of constant B, b_scale (per tensor or per column: no swap of the scales
    then), zero point and bias, A's scale one value: as DynamicQuantizeMatMul's bound form."""
    c = list(consts) + [None] * (7 - len(consts))
    run = _bound_product(c[1], c[3], c[5], c[6], "MatMulIntegerToFloat")
    if run is None:
        return None
    int8 = c[1].dtype == torch.int8

    def kernel(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *, out=None):
        if a.dtype in _RANGE and a_scale.numel() == 1 and a_scale.dtype == torch.float32 \
                and (a_zero_point is None or a_zero_point.numel() == 1) \
                and not (int8 and u8s8_saturation() and a.dtype != torch.int8):
            za = 0 if a_zero_point is None else int(a_zero_point.item())
            y = run(a, qgemm.byte_kind(a), float(_F32(a_scale.item())), za,
                    out if out is not None and out.dtype == torch.float32 else None)
            if y is not None:
                return _put(out, y)
        return _matmul_integer_to_float(a, b, a_scale, b_scale, a_zero_point, b_zero_point, bias, out=out)

    return kernel



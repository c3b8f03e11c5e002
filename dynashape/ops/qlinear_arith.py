"""What onnxruntime's quantization contrib ops share: their parameters read as numbers, float32
arithmetic done as onnxruntime does it, and the lookup tables built from them.

onnxruntime does not compute these ops with the textbook formula but in float32, with fused
multiply-adds, 256-entry lookup tables and sequential sums; the result differs from the formula
at and near ties, so the kernels (``contrib_quant.py`` lists them) redo its arithmetic with these.
Where onnxruntime converts a float to int32 before clamping (SSE's cvtps2dq), a NaN or a value
beyond int32 becomes INT_MIN and then saturates to the type's lowest value; ``_cvt`` does the same.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from ..errors import ShapeError
from . import byte_tables

DOMAIN = "com.microsoft"
_F32 = np.float32
_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}
_INT_MIN = -(2 ** 31)


# ---- parameters -------------------------------------------------------------------------------
def _eight_bit(x: torch.Tensor, what: str) -> tuple[int, int]:
    rng = _RANGE.get(x.dtype)
    if rng is None:
        raise ShapeError(f"{what}: expected a uint8 or int8 tensor, got {x.dtype}")
    return rng


def _one(t: torch.Tensor | None, what: str, default=0):
    """A per-tensor parameter as a Python number (onnxruntime reads it on the host too)."""
    if t is None:
        return default
    if t.numel() != 1:
        raise ShapeError(f"{what} must be a scalar or a 1-element tensor, got shape {tuple(t.shape)}")
    return t.item()  # one element: item() directly (indexing first costs ~3 us a call)


def _scale(t: torch.Tensor | None, what: str) -> np.float32:
    if t is None:
        raise ShapeError(f"{what} is required")
    return _F32(_one(t, what))


def _put(out, r: torch.Tensor) -> torch.Tensor:
    return r if out is None or r is out else out.copy_(r)


# ---- float32 arithmetic as onnxruntime does it --------------------------------------------------
def _fma(a, b, c) -> np.ndarray:
    """float32 a * b + c with one rounding (vfmadd), exactly: the product is exact in float64,
    the sum rounded to odd in float64 (TwoSum gives the error), then to nearest float32."""
    a64 = np.asarray(a, _F32).astype(np.float64)
    b64 = np.asarray(b, _F32).astype(np.float64)
    c64 = np.asarray(c, _F32).astype(np.float64)
    p = a64 * b64
    s = p + c64
    bp = s - p
    err = (p - (s - bp)) + (c64 - bp)
    with np.errstate(invalid="ignore"):
        odd = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
        s = np.where(odd, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(_F32)


def _np_cvt(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """cvtps2dq then saturating packs: round half to even, NaN / beyond int32 to ``lo``."""
    r = np.rint(v).astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = np.isnan(r) | (r >= 2.0 ** 31) | (r < -(2.0 ** 31))
    return np.where(bad, lo, np.clip(np.nan_to_num(r), lo, hi)).astype(np.int32)


def _cvt(v: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The torch twin of :func:`_np_cvt` (float result, integral values)."""
    r = torch.round(v)
    bad = torch.isnan(r) | (r >= 2.0 ** 31) | (r < -(2.0 ** 31))
    return torch.where(bad, torch.full_like(r, lo), r.clamp(lo, hi))


def _requant(v: torch.Tensor, zp: int, lo: int, hi: int) -> torch.Tensor:
    """MLAS's requantization: clamp to [lo - zp, hi - zp] first (NaN to the low end), round half
    to even, add the zero point."""
    lo_f, hi_f = float(lo - zp), float(hi - zp)
    v = torch.where(torch.isnan(v), torch.full_like(v, lo_f), v.clamp(lo_f, hi_f))
    return torch.round(v) + zp


def _np_quantize(v: np.ndarray, y_scale, y_zp: int, lo: int, hi: int) -> np.ndarray:
    """MlasQuantizeLinear: v / scale in float32, clamped, rounded half to even, plus the zero point."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = (np.asarray(v, _F32) / _F32(y_scale)).astype(_F32)
        q = np.where(np.isnan(q), _F32(lo - y_zp), np.clip(q, _F32(lo - y_zp), _F32(hi - y_zp)))
    return np.rint(q).astype(np.int32) + y_zp


def _byte_values(signed: bool) -> np.ndarray:
    """The value of each byte pattern 0..255 (a table is indexed by the raw byte)."""
    b = np.arange(256, dtype=np.uint8)
    return (b.view(np.int8) if signed else b).astype(np.int32)


# MLAS's logistic: Eigen's rational approximation, clamped to [-18, 18], FMA3 kernel
_LOGISTIC = {k: _F32(v) for k, v in dict(
    a9=4.37031012579801e-11, a7=1.15627324459942e-07, a5=6.08574864600143e-05, a3=8.51377133304701e-03,
    a1=2.48287947061529e-01, b10=6.10247389755681e-13, b8=5.76102136993427e-09, b6=6.29106785017040e-06,
    b4=1.70198817374094e-03, b2=1.16817656904453e-01, b0=9.93151921023180e-01).items()}


def _np_logistic(x: np.ndarray) -> np.ndarray:
    c = _LOGISTIC
    x = np.where(np.isnan(x), x, np.clip(x, _F32(-18), _F32(18))).astype(_F32)
    x2 = (x * x).astype(_F32)
    p = _fma(x2, c["a9"], c["a7"])
    for k in ("a5", "a3", "a1"):
        p = _fma(x2, p, c[k])
    q = _fma(x2, c["b10"], c["b8"])
    for k in ("b6", "b4", "b2", "b0"):
        q = _fma(x2, q, c[k])
    with np.errstate(invalid="ignore", divide="ignore"):
        r = ((x * p).astype(_F32) / q).astype(_F32) + _F32(0.5)
    return np.where(r > 0, r, np.where(np.isnan(r), r, _F32(0))).astype(_F32)


# ---- tables -----------------------------------------------------------------------------------
_TABLES: OrderedDict = OrderedDict()
_MAX_TABLES = 512


def _table(key: tuple, device: torch.device, build) -> torch.Tensor:
    """A lookup table built on the host by ``build()`` once per parameters (and device)."""
    k = key + (str(device),)
    t = _TABLES.get(k)
    if t is None:
        t = torch.from_numpy(np.ascontiguousarray(build())).to(device)
        _TABLES[k] = t
        while len(_TABLES) > _MAX_TABLES:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(k)
    return t


def _lookup(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y = byte_tables.single(table, x.view(torch.uint8))
    return y if y is not None else table[x.view(torch.uint8).to(torch.int64)]


def _np_dtype(signed: bool):
    return np.int8 if signed else np.uint8


def _requant_table(kind: str, xs, xz: int, ys, yz: int, signed: bool, alpha=0.0) -> np.ndarray:
    """onnxruntime's QlinearBuildLookupTable: dequantize each byte, transform, quantize."""
    lo, hi = (-128, 127) if signed else (0, 255)
    deq = (_F32(xs) * (_byte_values(signed) - xz).astype(_F32)).astype(_F32)
    if kind == "sigmoid":
        v = _np_logistic(deq)
    elif kind == "leaky_relu":
        v = np.where(deq >= 0, deq, (_F32(alpha) * deq).astype(_F32)).astype(_F32)
    else:
        v = deq
    return _np_quantize(v, ys, yz, lo, hi).astype(_np_dtype(signed))


def _requant_lookup(x, xs, xz, ys, yz, kind="identity", alpha=0.0) -> torch.Tensor:
    signed = x.dtype == torch.int8
    key = (kind, float(xs), int(xz), float(ys), int(yz), signed, float(alpha))
    table = _table(key, x.device, lambda: _requant_table(kind, xs, int(xz), ys, int(yz), signed, alpha))
    return _lookup(table, x)



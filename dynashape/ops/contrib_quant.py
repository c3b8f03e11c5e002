"""onnxruntime's quantization contrib ops (domain ``com.microsoft``), matched to its CPU kernels.

Integer outputs are bit-exact with onnxruntime's CPU execution provider on x86-64 with AVX2 and
FMA (what quantized models run on). onnxruntime does not compute these ops with the textbook
formula but in float32, with fused multiply-adds, 256-entry lookup tables and sequential sums;
the result differs from the formula at and near ties, so these kernels redo its arithmetic:

* QLinearAdd / QLinearMul: each output depends on one pair of input bytes, so a 65536-entry table
  is built on the host per set of quantization parameters and gathered. Add follows MLAS's AVX2
  kernel, ``fma(a, ra, fma(b, rb, zc - fma(ra, za, rb * zb)))`` with ``ra = sa / sc``, a and b
  swapped where onnxruntime's broadcaster hands A as the scalar of a span.
* QLinearSigmoid / QLinearLeakyRelu / QLinearConcat / QLinearWhere: onnxruntime's 256-entry table
  (dequantize, transform in float32, MlasQuantizeLinear); Sigmoid uses MLAS's rational logistic
  evaluated with its FMA chain.
* QLinearSoftmax: onnxruntime's exp table (shifted by a margin that depends on the reduced
  length), the row sum accumulated in float32 in order, its rounding and clamp.
* QLinearGlobalAveragePool: integer sum times one float32 scale. QLinearAveragePool dequantizes,
  sums each window in float32 in window order, divides by the count and requantizes (falling back
  to the global pool when a window covers the whole unpadded image, as onnxruntime does).
* QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul: exact integer products, then the float32
  scale (and bias) onnxruntime's output processors apply.
* MatMulNBits: the weights are unpacked and dequantized once, cached by tensor identity, and one
  float matmul runs per call. accuracy_level 4 with 4-bit weights in blocks of 32 and float32 A
  on the CPU (what onnxruntime-genai's builder makes) is onnxruntime's int8-activation kernel to
  the bit (nbits_int8.py: its quantization of A, lanes, fused multiply-adds and order); other
  level-4 cases quantize A to int8 per block the same way, then run the float matmul.
* GatherBlockQuantized: gather first, then (q - zero point) * scale per block of the gathered rows.

Where onnxruntime converts a float to int32 before clamping (SSE's cvtps2dq), a NaN or a value
beyond int32 becomes INT_MIN and then saturates to the type's lowest value; ``_cvt`` does the same.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.dtypes import TP
from . import byte_tables, nbits_int8, qgemm
from .conv import window_pads
from .linalg import _matmul_shape, prepared_b, qmatmul, u8s8_saturation
from .pool import _plan
from .quant import _dequantize, _quantize
from .registry import COMPUTED, binder, op
from .shapes import broadcast, norm_axis, same_as_first
from .weight_cache import ConstantsCache

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


# ---- QLinearAdd / QLinearMul --------------------------------------------------------------------
def _a_is_span_scalar(sa: tuple, sb: tuple) -> bool:
    """Whether onnxruntime's Broadcaster hands input 0 as one value per span (its innermost
    non-trivial dim, where the span is cut, has size 1 in A): QLinearAdd then runs MLAS with
    the roles of A and B swapped, which rounds differently."""
    if len(sa) == 0:
        return True
    if len(sb) == 0:
        return sa[-1] <= 1
    n = min(len(sa), len(sb))
    for k in range(1, n + 1):
        a, b = sa[-k], sb[-k]
        dim = min(a, b) if min(a, b) == 0 else max(a, b)
        if dim <= 1 and k < n:
            continue
        return a <= 1
    return False


def _add_table(sa, za, sb, zb, sc, zc, signed: bool, swapped: bool) -> np.ndarray:
    lo, hi = (-128, 127) if signed else (0, 255)
    v = _byte_values(signed).astype(_F32)
    a, b = v[:, None], v[None, :]
    ra, rb = _F32(_F32(sa) / _F32(sc)), _F32(_F32(sb) / _F32(sc))
    if swapped:  # MLAS(A := B, B := A as the span's scalar)
        fixed = _F32(zc) - _fma(rb, _F32(zb), _F32(ra * _F32(za)))
        r = _fma(b, rb, _fma(a, ra, fixed))
    else:
        fixed = _F32(zc) - _fma(ra, _F32(za), _F32(rb * _F32(zb)))
        r = _fma(a, ra, _fma(b, rb, fixed))
    return _np_cvt(r, lo, hi).astype(_np_dtype(signed)).reshape(-1)


def _mul_table(sa, za, sb, zb, sc, zc, signed: bool) -> np.ndarray:
    lo, hi = (-128, 127) if signed else (0, 255)
    v = _byte_values(signed)
    prod = ((v[:, None] - za) * (v[None, :] - zb)).astype(_F32)  # exact: |prod| < 2**17
    ratio = _F32(_F32(_F32(sa) * _F32(sb)) / _F32(sc))
    r = ((prod * ratio).astype(_F32) + _F32(zc)).astype(_F32)
    return _np_cvt(r, lo, hi).astype(_np_dtype(signed)).reshape(-1)


def _binary_infer(shapes, values, **_attrs):
    return broadcast([shapes[0], shapes[3]])


def _qlinear_binary(kind, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, out):
    what = f"QLinear{kind.capitalize()}"
    _eight_bit(a, what)
    if b.dtype != a.dtype:
        raise ShapeError(f"{what}: A is {a.dtype} but B is {b.dtype}")
    signed = a.dtype == torch.int8
    p = _binary_params(what, (a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point))
    swapped = kind == "add" and _a_is_span_scalar(tuple(a.shape), tuple(b.shape))
    key = (kind,) + tuple(float(v) for v in p) + (signed, swapped)
    y = None
    if a.device.type == "cpu":
        op_kind, ra, rb, c0, za, zb = _coefficients(key, p)
        y = byte_tables.arithmetic(op_kind, a, b, ra, rb, c0, za, zb)
    if y is not None:  # the tables' arithmetic in one C pass (csrc/lut.c)
        return _put(out, y)
    if kind == "add":
        table = _table(key, a.device, lambda: _add_table(*p, signed, swapped))
    else:
        table = _table(key, a.device, lambda: _mul_table(*p, signed))
    y = byte_tables.pairs(table, a.view(torch.uint8), b.view(torch.uint8))  # one C pass on the CPU
    if y is None:
        a, b = torch.broadcast_tensors(a, b)
        y = table[(a.view(torch.uint8).to(torch.int64) << 8) | b.view(torch.uint8).to(torch.int64)]
    return _put(out, y)


_PARAMS = ConstantsCache(_MAX_TABLES)


def _binary_params(what: str, params: tuple) -> tuple:
    """(sa, za, sb, zb, sc, zc) as numbers from the six parameter tensors (None: a zero point of 0),
    kept per the tensors (reading six costs ~10 us a call)."""
    sa, za, sb, zb, sc, zc = params
    return _PARAMS.get(params, lambda: (
        _scale(sa, f"{what} A_scale"), int(_one(za, f"{what} A_zero_point")),
        _scale(sb, f"{what} B_scale"), int(_one(zb, f"{what} B_zero_point")),
        _scale(sc, f"{what} C_scale"), int(_one(zc, f"{what} C_zero_point"))))


_COEFFICIENTS: dict = {}


def _coefficients(key: tuple, p: tuple) -> tuple:
    """(kind, ra, rb, c0, za, zb) of byte_tables.arithmetic for a QLinearAdd / QLinearMul's parameters
    p = (sa, za, sb, zb, sc, zc): the constants _add_table / _mul_table compute, once per key."""
    got = _COEFFICIENTS.get(key)
    if got is not None:
        return got
    sa, za, sb, zb, sc, zc = p
    if key[0] == "add":
        ra, rb = _F32(_F32(sa) / _F32(sc)), _F32(_F32(sb) / _F32(sc))
        if key[-1]:  # swapped (_add_table says why)
            got = (byte_tables.ADD_SWAPPED, ra, rb, _F32(zc) - _fma(rb, _F32(zb), _F32(ra * _F32(za))), 0, 0)
        else:
            got = (byte_tables.ADD, ra, rb, _F32(zc) - _fma(ra, _F32(za), _F32(rb * _F32(zb))), 0, 0)
    else:
        got = (byte_tables.MUL, _F32(_F32(_F32(sa) * _F32(sb)) / _F32(sc)), 0.0, _F32(zc), int(za), int(zb))
    got = tuple(float(v) if i in (1, 2, 3) else v for i, v in enumerate(got))
    if len(_COEFFICIENTS) >= _MAX_TABLES:
        _COEFFICIENTS.clear()
    _COEFFICIENTS[key] = got
    return got


@op("QLinearAdd", 1, DOMAIN, infer=_binary_infer,
    notes="bit-exact with onnxruntime's AVX2 kernel (its FMA chain, and the swapped form where A broadcasts "
          "along the innermost dim): a 65536-entry table per parameter set")
def _qlinear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None, *, out=None):
    return _qlinear_binary("add", a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, out)


@op("QLinearMul", 1, DOMAIN, infer=_binary_infer,
    notes="bit-exact with onnxruntime: a 65536-entry table per parameter set")
def _qlinear_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None, *, out=None):
    return _qlinear_binary("mul", a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, out)


@binder("QLinearAdd", DOMAIN)
def _bind_qlinear_add(consts, attrs):
    return _bind_binary("add", _qlinear_add, consts)


@binder("QLinearMul", DOMAIN)
def _bind_qlinear_mul(consts, attrs):
    return _bind_binary("mul", _qlinear_mul, consts)


_BOUND_LAYOUTS = 16  # layouts of (A, B) a bound kernel keeps the walk of (a model shows a few)


def _bind_binary(kind: str, full, consts):
    """QLinearAdd / QLinearMul whose six scales and zero points are constants: their numbers and
    the arithmetic's coefficients read once, and per layout of the two inputs the C pass's walk
    (byte_tables.binary_walk), where the op reads six tensors and checks them every call (~20 us
    a call against ~5 for the pass at a tiny BERT's sizes). Anything else (another device or
    dtype, a layout past those kept) goes to the op itself, which says what is wrong."""
    params = tuple(consts[i] if i < len(consts) else None for i in (1, 2, 4, 5, 6, 7))
    if any(p is COMPUTED for p in params) or any(p is not None and p.device.type != "cpu" for p in params):
        return None
    try:
        p = _binary_params(f"QLinear{kind.capitalize()}", params)
    except ShapeError:
        return None  # the op raises it at the first call
    fn = byte_tables._arithmetic_kernel()
    if fn is None:
        return None
    walks: dict = {}

    def kernel(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None, *, out=None):
        dt = a.dtype
        key = (dt, b.dtype, a.device.type, b.device.type, a.shape, a.stride(), b.shape, b.stride())
        got = walks.get(key)
        if got is None:
            if dt != b.dtype or dt not in _RANGE or a.device.type != "cpu" or b.device.type != "cpu" \
                    or len(walks) >= _BOUND_LAYOUTS:
                return full(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, out=out)
            walk = byte_tables.binary_walk(a, b)
            if walk is None:
                return full(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, out=out)
            swapped = kind == "add" and _a_is_span_scalar(tuple(a.shape), tuple(b.shape))
            signed = dt == torch.int8
            got = walks[key] = (walk, _coefficients((kind,) + tuple(float(v) for v in p) + (signed, swapped), p))
        walk, (op_kind, ra, rb, c0, za, zb) = got
        return _put(out, byte_tables.run_arithmetic(fn, walk, op_kind, a, b, ra, rb, c0, za, zb))

    return kernel


# ---- QLinearSigmoid / QLinearLeakyRelu ----------------------------------------------------------
def _activation(kind, x, x_scale, x_zero_point, y_scale, y_zero_point, alpha, out):
    what = "QLinearSigmoid" if kind == "sigmoid" else "QLinearLeakyRelu"
    _eight_bit(x, what)
    y = _requant_lookup(x, _scale(x_scale, f"{what} X_scale"), _one(x_zero_point, f"{what} X_zero_point"),
                        _scale(y_scale, f"{what} Y_scale"), _one(y_zero_point, f"{what} Y_zero_point"), kind, alpha)
    return _put(out, y)


@op("QLinearSigmoid", 1, DOMAIN, infer=same_as_first,
    notes="onnxruntime's 256-entry table with MLAS's rational logistic (FMA), bit-exact")
def _qlinear_sigmoid(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, out=None):
    return _activation("sigmoid", x, x_scale, x_zero_point, y_scale, y_zero_point, 0.0, out)


@op("QLinearLeakyRelu", 1, DOMAIN, infer=same_as_first, notes="onnxruntime's 256-entry table, bit-exact")
def _qlinear_leaky_relu(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, alpha=0.01, out=None):
    return _activation("leaky_relu", x, x_scale, x_zero_point, y_scale, y_zero_point, alpha, out)


# ---- QLinearConcat ------------------------------------------------------------------------------
def _qconcat_infer(shapes, values, *, axis):
    xs = shapes[2:]
    if len(xs) == 0 or len(xs) % 3:
        raise ShapeError(f"QLinearConcat: expects Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) "
                         f"triples; got {len(shapes)} inputs")
    xs = xs[::3]
    rank = len(xs[0])
    a = norm_axis(axis, rank)
    out = list(xs[0])
    total = 0
    for s in xs:
        if len(s) != rank:
            raise ShapeError(f"QLinearConcat: inputs of ranks {[len(t) for t in xs]} differ")
        for i, (d, e) in enumerate(zip(out, s)):
            if i != a and isinstance(d, int) and isinstance(e, int) and d != e:
                raise ShapeError(f"QLinearConcat: shapes {[tuple(t) for t in xs]} differ outside axis {axis}")
        total = total + s[a]
    out[a] = total
    return [tuple(out)]


@op("QLinearConcat", 1, DOMAIN, infer=_qconcat_infer)
def _qlinear_concat(y_scale, y_zero_point, *inputs, axis, out=None):
    if len(inputs) == 0 or len(inputs) % 3:
        raise ShapeError(f"QLinearConcat: expects (X, X_scale, X_zero_point) triples after Y_scale and "
                         f"Y_zero_point; got {len(inputs)} inputs")
    ys = _scale(y_scale, "QLinearConcat Y_scale")
    yz = _one(y_zero_point, "QLinearConcat Y_zero_point")
    parts = []
    for i in range(0, len(inputs), 3):
        x, xs, xz = inputs[i:i + 3]
        _eight_bit(x, "QLinearConcat")
        if x.dtype != y_zero_point.dtype:
            raise ShapeError(f"QLinearConcat: input {i // 3} is {x.dtype} but Y_zero_point is {y_zero_point.dtype}")
        parts.append(_requant_lookup(x, _scale(xs, "QLinearConcat X_scale"), _one(xz, "QLinearConcat X_zero_point"),
                                     ys, yz))
    a = norm_axis(axis, parts[0].dim())
    if out is None:
        return torch.cat(parts, a)
    return torch.cat(parts, a, out=out)


# ---- QLinearWhere -------------------------------------------------------------------------------
def _qwhere_infer(shapes, values, **_attrs):
    return broadcast([shapes[0], shapes[1], shapes[4]])


@op("QLinearWhere", 1, DOMAIN, infer=_qwhere_infer)
def _qlinear_where(condition, x, x_scale, x_zero_point, y, y_scale, y_zero_point, z_scale, z_zero_point, *,
                   out=None):
    _eight_bit(x, "QLinearWhere")
    if y.dtype != x.dtype or z_zero_point.dtype != x.dtype:
        raise ShapeError(f"QLinearWhere: X ({x.dtype}), Y ({y.dtype}) and z_zero_point ({z_zero_point.dtype}) "
                         f"must have one type")
    zs = _scale(z_scale, "QLinearWhere z_scale")
    zz = _one(z_zero_point, "QLinearWhere z_zero_point")
    xq = _requant_lookup(x, _scale(x_scale, "QLinearWhere x_scale"), _one(x_zero_point, "QLinearWhere x_zero_point"),
                         zs, zz)
    yq = _requant_lookup(y, _scale(y_scale, "QLinearWhere y_scale"), _one(y_zero_point, "QLinearWhere y_zero_point"),
                         zs, zz)
    return _put(out, torch.where(condition.to(torch.bool), xq, yq))


# ---- QLinearSoftmax -----------------------------------------------------------------------------
def _softmax_table(x_scale, reduce_len: int) -> np.ndarray:
    """exp((i - 255 + shift) * x_scale) for i in 0..255, in double rounded to float32; the shift
    keeps the sum of reduce_len terms below FLT_MAX (onnxruntime's QlinearBuildLookupTableUint32)."""
    quotient = float(_F32(np.finfo(_F32).max) / _F32(reduce_len))
    shift = max(0.0, math.log(quotient) - 5.0) / float(x_scale)
    xs = float(x_scale)
    return np.array([math.exp((float(i) - 255.0 + shift) * xs) for i in range(256)], dtype=_F32)


def _sequential_sum(v: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis in float32, left to right (onnxruntime's loop): numpy's accumulate
    on the CPU, one add per column elsewhere."""
    if v.device.type == "cpu":
        acc = np.add.accumulate(v.numpy(), axis=-1, dtype=_F32)
        return torch.from_numpy(np.ascontiguousarray(acc[..., -1]))
    s = torch.zeros(v.shape[:-1], dtype=torch.float32, device=v.device)
    for j in range(v.shape[-1]):
        s = s + v[..., j]
    return s


@op("QLinearSoftmax", 1, DOMAIN, infer=same_as_first,
    notes="onnxruntime's exp table and in-order float32 row sum, bit-exact; opset < 13 coerces to 2-D")
def _qlinear_softmax(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, axis=-1, opset, out=None):
    _eight_bit(x, "QLinearSoftmax")
    if x.numel() == 0:
        return _put(out, torch.empty_like(x))
    shape = x.shape
    a = norm_axis(axis, x.dim())
    if opset < 13:  # the dims from axis on coerced into one (Softmax-1 semantics)
        rows = x.reshape(math.prod(shape[:a]), math.prod(shape[a:]))
    else:
        rows = x.movedim(a, -1)
    d = rows.shape[-1]
    xs = _scale(x_scale, "QLinearSoftmax X_scale")
    table = _table(("softmax", float(xs), d), x.device, lambda: _softmax_table(xs, d))
    y_inv = _F32(math.floor(_F32(1.0) / _scale(y_scale, "QLinearSoftmax y_scale")))
    yz = int(_one(y_zero_point, "QLinearSoftmax y_zero_point"))
    y = byte_tables.softmax(rows, table, float(y_inv), yz)  # one C pass on the CPU
    if y is None:
        xi = rows.to(torch.int32)
        # only distances to the row's max matter (x_zero_point cancels): entry 255 - dist of the table
        dist = xi.amax(dim=-1, keepdim=True) - xi
        vt = table[(255 - dist).to(torch.int64)]
        vsum = _sequential_sum(vt).to(x.device).unsqueeze(-1)
        q = torch.round((vt * float(y_inv)) / vsum)
        # onnxruntime clamps only above (the quotient is >= 0), at 255 for uint8 and 127 for int8
        y = (q + yz).clamp(max=255 if x.dtype == torch.uint8 else 127).to(x.dtype)
    y = y.reshape(shape) if opset < 13 else y.movedim(-1, a)
    return _put(out, y)


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


# ---- integer products ---------------------------------------------------------------------------
def _exact_matmul(a: torch.Tensor, a_zp, b: torch.Tensor, b_zp) -> torch.Tensor:
    """(a - a_zp) @ (b - b_zp) exactly (int32, or float32 / float64 holding integers). a_zp: None,
    one value, or one per row of a; b_zp: None, one value, or one per column of b. Through
    linalg.qmatmul: its float32 / _int_mm fast paths and the u8s8 saturation switch."""
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


# ---- MatMulNBits --------------------------------------------------------------------------------
def _nbits_infer(shapes, values, *, K, N, **_attrs):
    a = shapes[0]
    if len(a) < 1:
        raise ShapeError("MatMulNBits: A must have rank >= 1")
    if isinstance(a[-1], int) and a[-1] != K:
        raise ShapeError(f"MatMulNBits: A's last dim is {a[-1]}, attribute K is {K}")
    return [tuple(a[:-1]) + (N,)]


def _unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Values stored ``bits`` at a time along the last axis, lowest bits first, as uint8."""
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    v = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return v.reshape(*packed.shape[:-1], packed.shape[-1] * per)[..., :count]


_DEQUANT: OrderedDict = OrderedDict()  # key -> (source tensors, dequantized weight)
_DEQUANT_BYTES = [0]
_DEQUANT_BUDGET = 8 << 30


def _ident(t: torch.Tensor | None):
    return None if t is None else (t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))


def _cached_weight(key, sources, build) -> torch.Tensor:
    """The dequantized weight of ``key`` (the weight tensors' identities: data pointer and version
    counter), built on first use. An entry keeps its source tensors alive, so that their memory
    cannot come back under another tensor with the same pointer and a fresh version while it exists."""
    hit = _DEQUANT.get(key)
    if hit is not None:
        _DEQUANT.move_to_end(key)
        return hit[1]
    w = build()
    _DEQUANT[key] = (sources, w)
    _DEQUANT_BYTES[0] += _nbytes(w)
    while _DEQUANT_BYTES[0] > _DEQUANT_BUDGET and len(_DEQUANT) > 1:
        _, (_, old) = _DEQUANT.popitem(last=False)
        _DEQUANT_BYTES[0] -= _nbytes(old)
    return w


def _nbytes(w) -> int:
    """A cached weight's size: a tensor, or nbits_int8.PackedB (several, counted by itself)."""
    return w.nbytes if isinstance(w, nbits_int8.PackedB) else w.numel() * w.element_size()


def _nbits_packed(b, scales, zero_points, k, n, bits, block_size) -> nbits_int8.PackedB:
    """The weight as onnxruntime's int8-activation kernel reads it (nbits_int8.py)."""
    nb = -(-k // block_size)
    raw = _unpack_bits(b.reshape(n, nb, -1), bits, block_size)
    zp = None if zero_points is None else _unpack_bits(zero_points.reshape(n, -1), bits, nb)
    return nbits_int8.PackedB(raw, scales, zp)


def _nbits_weight(b, scales, zero_points, g_idx, k, n, bits, block_size, dtype) -> torch.Tensor:
    """(N, K) weights: (q - zero point) * scale per block of K."""
    nb = -(-k // block_size)
    q = _unpack_bits(b.reshape(n, nb, -1), bits, block_size).reshape(n, nb * block_size)[:, :k]
    s = scales.reshape(n, nb).to(torch.float32)
    if zero_points is None:
        z = torch.full((n, nb), float(1 << (bits - 1)), device=b.device)
    elif zero_points.dtype == torch.uint8:
        z = _unpack_bits(zero_points.reshape(n, -1), bits, nb).to(torch.float32)
    else:
        z = zero_points.reshape(n, nb).to(torch.float32)
    if g_idx is not None:
        blk = g_idx.to(torch.int64).reshape(-1)
        if blk.numel() != k:
            raise ShapeError(f"MatMulNBits: g_idx must have K={k} elements, got {blk.numel()}")
        sk, zk = s[:, blk], z[:, blk]
    else:
        sk = s.repeat_interleave(block_size, dim=1)[:, :k]
        zk = z.repeat_interleave(block_size, dim=1)[:, :k]
    return ((q.to(torch.float32) - zk) * sk).to(dtype)


def _int8_blocks(a: torch.Tensor, block_size: int) -> torch.Tensor:
    """A as onnxruntime's CompInt8 path sees it: per row and block of K, q = round(a * 127 / amax)
    (half to even), a = q * amax / 127."""
    k = a.shape[-1]
    nb = -(-k // block_size)
    af = torch.nn.functional.pad(a.to(torch.float32), (0, nb * block_size - k))
    blocks = af.reshape(*a.shape[:-1], nb, block_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127.0
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv)
    return (q * scale).reshape(*a.shape[:-1], nb * block_size)[..., :k]


@op("MatMulNBits", 1, DOMAIN, infer=_nbits_infer,
    notes="bits 2, 4, 8; weights dequantized once and cached by tensor identity, one float matmul; "
          "accuracy_level 4 quantizes A per block to int8 as onnxruntime, and with 4 bits, blocks of 32 "
          "and float32 A on the CPU gives its bits (its AVX-512 VNNI kernel's order); no weight_prepacked")
def _matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                  accuracy_level=0, weight_prepacked=0, out=None):
    what = "MatMulNBits"
    if weight_prepacked:
        raise ShapeError(f"{what}: weight_prepacked={weight_prepacked} (an execution provider's layout) is not "
                         f"supported; only 0")
    if bits not in (2, 4, 8):
        raise ShapeError(f"{what}: bits must be 2, 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ShapeError(f"{what}: block_size must be a power of 2 >= 16, got {block_size}")
    if a.shape[-1] != K:
        raise ShapeError(f"{what}: A's last dim is {a.shape[-1]}, attribute K is {K}")
    nb = -(-K // block_size)
    shape = (*a.shape[:-1], N)
    if b.numel() == 0:  # an omitted projection: zeros, or the bias
        y = torch.zeros(shape, dtype=a.dtype, device=a.device)
        return _put(out, y if bias is None else y + bias.to(a.dtype))
    if b.numel() != N * nb * (block_size * bits // 8):
        raise ShapeError(f"{what}: B of shape {tuple(b.shape)} does not hold N={N} x {nb} blocks of "
                         f"{block_size * bits // 8} bytes (K={K}, block_size={block_size}, bits={bits})")
    if scales.numel() != N * nb:
        raise ShapeError(f"{what}: scales of shape {tuple(scales.shape)} must hold N x k_blocks = {N} x {nb}")
    if (accuracy_level == 4 and bits == 4 and block_size == nbits_int8.BLOCK and g_idx is None
            and a.device.type == "cpu" and a.dtype == torch.float32
            and (zero_points is None or zero_points.dtype == torch.uint8)):
        # onnxruntime's int8-activation kernel, its roundings in its order (a one-ulp difference
        # here flips an int8 activation of the next product and drifts a decode loop)
        key = ("int8", _ident(b), _ident(scales), _ident(zero_points), K, N)
        w = _cached_weight(key, (b, scales, zero_points),
                           lambda: _nbits_packed(b, scales, zero_points, K, N, bits, block_size))
        return _put(out, nbits_int8.matmul(a, w, bias))
    # matmuls in float32 on the CPU (its half-precision GEMM is slow), in A's type elsewhere
    dtype = torch.float32 if a.device.type == "cpu" else a.dtype
    key = (_ident(b), _ident(scales), _ident(zero_points), _ident(g_idx), K, N, bits, block_size, dtype)
    w = _cached_weight(key, (b, scales, zero_points, g_idx),
                       lambda: _nbits_weight(b, scales, zero_points, g_idx, K, N, bits, block_size, dtype))
    x = a
    if accuracy_level == 4 and g_idx is None and (zero_points is None or zero_points.dtype == torch.uint8):
        x = _int8_blocks(a, block_size)
    y = torch.matmul(x.to(dtype), w.t())
    if bias is not None:
        y = y + bias.to(dtype)
    return _put(out, y.to(a.dtype))


# ---- GatherBlockQuantized -----------------------------------------------------------------------
def _gbq_components(data_shape, scales_shape, zp_shape, bits, gather_axis, quantize_axis, block_size) -> int:
    """How many values a data element holds: 8 // bits for uint8 data packed along the last
    axis, else 1. The element type does not reach the kernel (a UINT4 is held in uint8 as a
    UINT8 is), so the shapes decide: packing is possible only for bits < 8, gather_axis 0 and
    the last axis quantized, and the scales (and zero points) must count the blocks of the
    unpacked row."""
    rank = len(data_shape)
    if bits >= 8 or block_size <= 0 or rank < 2 or gather_axis != 0 or quantize_axis != rank - 1:
        return 1
    comp = 8 // bits
    d, s = data_shape[-1], scales_shape[-1]
    if not all(isinstance(v, int) for v in (d, s)):
        return comp
    if bits == 2:  # no 2-bit type is held: uint8 data
        return comp
    packed_blocks, plain_blocks = -(-(d * comp) // block_size), -(-d // block_size)
    if packed_blocks != plain_blocks:
        return comp if s == packed_blocks else 1
    packed_zp = -(-s // comp)
    if zp_shape is not None and isinstance(zp_shape[-1], int) and packed_zp != s:
        return comp if zp_shape[-1] == packed_zp else 1
    return comp  # rows of at most half a block: nothing tells, take onnxruntime's usual uint8 layout


def _gbq_infer(shapes, values, *, bits=4, block_size=128, gather_axis=0, quantize_axis=1):
    data, idx = shapes[0], shapes[1]
    rank = len(data)
    ga, qa = norm_axis(gather_axis, rank, "gather_axis"), norm_axis(quantize_axis, rank, "quantize_axis")
    comp = _gbq_components(data, shapes[2], shapes[3] if len(shapes) > 3 else None, bits, ga, qa, block_size)
    out = list(data[:ga]) + list(idx) + list(data[ga + 1:])
    if comp > 1:
        out[-1] = out[-1] * comp
    return [tuple(out)]


@op("GatherBlockQuantized", 1, DOMAIN, infer=_gbq_infer,
    notes="int4, uint4, uint8 (2, 4, 8 bits packed), float8; uint8 vs uint4 told apart by the scales' shape")
def _gather_block_quantized(data, indices, scales, zero_points=None, *, bits=4, block_size=128, gather_axis=0,
                            quantize_axis=1, out=None):
    what = "GatherBlockQuantized"
    rank = data.dim()
    ga, qa = norm_axis(gather_axis, rank, "gather_axis"), norm_axis(quantize_axis, rank, "quantize_axis")
    if scales.dim() != rank:
        raise ShapeError(f"{what}: data {tuple(data.shape)} and scales {tuple(scales.shape)} must have one rank")
    is_float = data.dtype.is_floating_point
    comp = 1 if is_float else _gbq_components(tuple(data.shape), tuple(scales.shape),
                                              None if zero_points is None else tuple(zero_points.shape),
                                              bits, ga, qa, block_size)
    if is_float and zero_points is not None:
        raise ShapeError(f"{what}: zero_points must not be given for float8 / float4 data")
    if not is_float and data.dtype not in (torch.int8, torch.uint8):
        raise ShapeError(f"{what}: data must be int4, uint4, uint8 or a float8 / float4 type, got {data.dtype}")
    qdim = data.shape[qa] * comp
    block = qdim if (is_float and block_size == 0) else block_size
    if block <= 0:
        raise ShapeError(f"{what}: block_size must be positive for integer data, got {block_size}")
    nblocks = -(-qdim // block)
    for i in range(rank):
        want = nblocks if i == qa else data.shape[i]
        if scales.shape[i] != want and not (is_float and i != qa and scales.shape[i] == 1):
            raise ShapeError(f"{what}: scales of shape {tuple(scales.shape)} do not fit data {tuple(data.shape)} "
                             f"quantized in blocks of {block} along axis {qa}")
    n = data.shape[ga]
    idx = indices.to(torch.int64).to(data.device)
    valid = (idx >= -n) & (idx < n)
    flat = torch.where(idx < 0, idx + n, idx).clamp(0, max(n - 1, 0)).reshape(-1)
    q = torch.index_select(data, ga, flat)
    if comp > 1:
        q = _unpack_bits(q.view(torch.uint8), bits, qdim)
    q = q.to(torch.float32) if is_float else q.to(torch.int32)

    def along(p, packed: bool):
        """A per-block parameter gathered like data and spread to one value per element."""
        if p.shape[ga] != 1 or n == 1:
            p = torch.index_select(p, ga, torch.div(flat, block, rounding_mode="floor") if ga == qa else flat)
        if packed:  # uint8 zero points packed like the data
            p = _unpack_bits(p, bits, nblocks)
        if ga != qa:
            p = p.repeat_interleave(block, dim=qa).narrow(qa, 0, qdim)
        return p

    s = along(scales, False).to(torch.float32)
    if is_float:
        v = q * s
    else:
        if zero_points is not None:
            z = along(zero_points, comp > 1).to(torch.int32)
        else:
            # 2**(bits-1) for UINT8 data; 0 for INT4 / UINT4 (a uint8 tensor unpacked with bits 4)
            uint8_data = data.dtype == torch.uint8 and (comp > 1 or bits != 4)
            z = torch.tensor(1 << (bits - 1) if uint8_data else 0, dtype=torch.int32, device=data.device)
        v = (q - z).to(torch.float32) * s
    shape = list(data.shape[:ga]) + list(indices.shape) + list(data.shape[ga + 1:])
    if comp > 1:
        shape[-1] = shape[-1] * comp
    v = v.reshape(shape)
    if not bool(valid.all()):
        mask = valid.reshape(list(indices.shape) + [1] * (rank - 1 - ga))
        v = torch.where(mask, v, torch.zeros((), dtype=v.dtype, device=v.device))
    dt = scales.dtype if scales.dtype.is_floating_point else torch.float32
    return _put(out, v.to(dt))


# ---- QuantizeLinear / DequantizeLinear ----------------------------------------------------------
@op("QuantizeLinear", 1, DOMAIN, infer=same_as_first)
def _ms_quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, _out_types=None, out=None):
    # onnxruntime divides a float16 input by its scale in float32 (ParQuantizeLinearStd)
    return _quantize(x, y_scale, y_zero_point, axis=axis, precision=TP.FLOAT, _out_types=_out_types, out=out)


@op("DequantizeLinear", 1, DOMAIN, infer=same_as_first)
def _ms_dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, _out_types=None, out=None):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, _out_types=_out_types, out=out)

"""QLinearAdd / QLinearMul (domain ``com.microsoft``), bit-exact with onnxruntime's CPU kernels.

Each output depends on one pair of input bytes, so a 65536-entry table is built on the host per
set of quantization parameters and gathered (or its arithmetic run in one C pass on the CPU). Add
follows MLAS's AVX2 kernel, ``fma(a, ra, fma(b, rb, zc - fma(ra, za, rb * zb)))`` with
``ra = sa / sc``, a and b swapped where onnxruntime's broadcaster hands A as the scalar of a span.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ShapeError
from . import byte_tables
from .qlinear_arith import (
    _F32,
    _MAX_TABLES,
    _RANGE,
    DOMAIN,
    _byte_values,
    _eight_bit,
    _fma,
    _np_cvt,
    _np_dtype,
    _one,
    _put,
    _scale,
    _table,
)
from .registry import COMPUTED, binder, op
from .shapes import broadcast
from .weight_cache import ConstantsCache


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


"""ONNX element types and their torch / numpy counterparts.

Torch has no 4-bit or 2-bit element types it can compute with, so those are *held* in a wider
torch dtype that represents every value exactly, one value per element (unpacked):
INT4 / INT2 in int8, UINT4 / UINT2 in uint8, and the small floats FLOAT4E2M1, FLOAT6E2M3 and
FLOAT6E3M2 in float8_e4m3fn (whose grid contains all of theirs). Reading such a tensor needs no
knowledge of its ONNX type; *producing* one needs the rounding / saturation / wrap-around of
the target type, which :func:`cast_tensor` applies. Numpy arrays (feeds, initializers, outputs)
use the ml_dtypes types, converted at the boundary by :func:`to_torch` / :func:`to_numpy`.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import torch

TP = onnx.TensorProto

_TORCH = {
    TP.FLOAT: torch.float32, TP.DOUBLE: torch.float64, TP.FLOAT16: torch.float16,
    TP.BFLOAT16: torch.bfloat16, TP.INT8: torch.int8, TP.INT16: torch.int16, TP.INT32: torch.int32,
    TP.INT64: torch.int64, TP.UINT8: torch.uint8, TP.BOOL: torch.bool,
    TP.UINT16: torch.uint16, TP.UINT32: torch.uint32, TP.UINT64: torch.uint64,
    TP.COMPLEX64: torch.complex64, TP.COMPLEX128: torch.complex128,
    TP.FLOAT8E4M3FN: torch.float8_e4m3fn, TP.FLOAT8E5M2: torch.float8_e5m2,
    TP.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz, TP.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    TP.FLOAT8E8M0: torch.float8_e8m0fnu,
}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}
# Types held in a wider torch dtype (see the module docstring). Not in _FROM_TORCH: an int8
# tensor is an INT8 unless the graph says otherwise.
HELD = {
    TP.INT4: torch.int8, TP.UINT4: torch.uint8, TP.INT2: torch.int8, TP.UINT2: torch.uint8,
    TP.FLOAT4E2M1: torch.float8_e4m3fn, TP.FLOAT6E2M3: torch.float8_e4m3fn, TP.FLOAT6E3M2: torch.float8_e4m3fn,
}
# Sub-byte integers: (bits, signed).
SUBBYTE_INT = {TP.INT4: (4, True), TP.UINT4: (4, False), TP.INT2: (2, True), TP.UINT2: (2, False)}
# Floats without inf or NaN: (exponent bias, mantissa bits, largest finite).
SMALL_FLOAT = {TP.FLOAT4E2M1: (1, 1, 6.0), TP.FLOAT6E2M3: (1, 3, 7.5), TP.FLOAT6E3M2: (3, 2, 28.0)}
# float8 types: (largest finite, |x| from which rounding leaves the finite range, what it becomes
# then when not saturating). The bound is where round-to-nearest-even passes the largest finite:
# a tie rounds up when the largest finite has an odd mantissa (all but E4M3FN, whose next code
# up would be its NaN, so its tie at 464 stays 448).
FLOAT8 = {
    TP.FLOAT8E4M3FN: (448.0, 464.0, False, float("nan")),
    TP.FLOAT8E4M3FNUZ: (240.0, 248.0, True, float("nan")),
    TP.FLOAT8E5M2: (57344.0, 61440.0, True, float("inf")),
    TP.FLOAT8E5M2FNUZ: (57344.0, 61440.0, True, float("nan")),
}
_FROM_NP = {
    np.dtype(np.float32): TP.FLOAT, np.dtype(np.float64): TP.DOUBLE, np.dtype(np.float16): TP.FLOAT16,
    np.dtype(np.int8): TP.INT8, np.dtype(np.int16): TP.INT16, np.dtype(np.int32): TP.INT32,
    np.dtype(np.int64): TP.INT64, np.dtype(np.uint8): TP.UINT8, np.dtype(np.uint16): TP.UINT16,
    np.dtype(np.uint32): TP.UINT32, np.dtype(np.uint64): TP.UINT64, np.dtype(np.bool_): TP.BOOL,
    np.dtype(np.complex64): TP.COMPLEX64, np.dtype(np.complex128): TP.COMPLEX128,
    np.dtype(object): TP.STRING, np.dtype(np.str_): TP.STRING,
}


def torch_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype holding an ONNX element type (KeyError for strings and unknown types)."""
    dt = _TORCH.get(elem_type)
    return dt if dt is not None else HELD[elem_type]


def np_dtype(elem_type: int) -> np.dtype:
    if elem_type == TP.STRING:
        return np.dtype(object)
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def onnx_elem_type(x) -> int:
    """Element type of a torch dtype, numpy dtype, tensor or array (a torch int8 is INT8, never INT4)."""
    if isinstance(x, torch.Tensor):
        x = x.dtype
    elif isinstance(x, np.ndarray):
        x = x.dtype
    if isinstance(x, torch.dtype):
        return _FROM_TORCH[x]
    dt = np.dtype(x)
    if dt.kind in "US":
        return TP.STRING
    if dt in _FROM_NP:
        return _FROM_NP[dt]
    return onnx.helper.np_dtype_to_tensor_dtype(dt)  # ml_dtypes types (bfloat16, float8, int4)


def elem_type_name(elem_type: int) -> str:
    return TP.DataType.Name(elem_type).lower() if elem_type else "unknown"


_VIEW_AS = {TP.BFLOAT16: (np.uint16, torch.bfloat16), TP.FLOAT8E4M3FN: (np.uint8, torch.float8_e4m3fn),
            TP.FLOAT8E5M2: (np.uint8, torch.float8_e5m2), TP.FLOAT8E4M3FNUZ: (np.uint8, torch.float8_e4m3fnuz),
            TP.FLOAT8E5M2FNUZ: (np.uint8, torch.float8_e5m2fnuz), TP.FLOAT8E8M0: (np.uint8, torch.float8_e8m0fnu)}
# numpy dtype of the torch dtype that holds a HELD type
_HELD_NP = {torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
            torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn)}


def to_torch(array: np.ndarray, elem_type: int | None = None):
    """A numpy array as a CPU torch tensor; strings stay numpy."""
    if elem_type is None:
        elem_type = onnx_elem_type(array)
    if elem_type == TP.STRING or array.dtype == object:
        return np.asarray(array, dtype=object)
    if elem_type in HELD:  # exact: the holding type contains every value of the held one
        array = np.asarray(array).astype(_HELD_NP[HELD[elem_type]])
        elem_type = onnx_elem_type(array)
    if elem_type in _VIEW_AS:
        raw, tdt = _VIEW_AS[elem_type]
        # reshape: np.ascontiguousarray turns a 0-d array into a 1-d one
        return torch.from_numpy(np.ascontiguousarray(array).reshape(array.shape).view(raw).copy()).view(tdt)
    return torch.from_numpy(np.array(array, copy=True))


_PLAIN_NUMPY = frozenset({torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16,
                          torch.int8, torch.uint8, torch.bool})


def to_numpy(t, elem_type: int | None = None) -> np.ndarray:
    """A tensor as a numpy array with the ONNX-matching dtype (bf16 / fp8 / int4 ... through
    ml_dtypes). ``elem_type`` names the ONNX type of a tensor holding a HELD type."""
    if isinstance(t, np.ndarray):
        return t
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype in _PLAIN_NUMPY and elem_type not in HELD:
        return t.numpy()  # the common types: numpy holds them as torch does
    a = None
    for et, (raw, tdt) in _VIEW_AS.items():
        if t.dtype == tdt:
            a = t.view(torch.uint16 if raw is np.uint16 else torch.uint8).numpy().view(np_dtype(et))
            break
    if a is None:
        a = t.numpy()
    if elem_type in HELD:
        a = a.astype(np_dtype(elem_type))  # exact when the tensor came from cast_tensor
    return a


# ---- casting into a type's representation -------------------------------------------------
def cast_tensor(x: torch.Tensor, to: int, saturate: bool = True, round_mode: str = "up") -> torch.Tensor:
    """``x`` converted to ONNX element type ``to`` with ONNX's Cast rules, in the torch dtype
    that holds ``to`` (an INT4 result is an int8 tensor of values in [-8, 7])."""
    if to in SUBBYTE_INT:
        return _to_subbyte_int(x, *SUBBYTE_INT[to]).to(HELD[to])
    if to in SMALL_FLOAT:
        return _to_small_float(x, *SMALL_FLOAT[to]).to(HELD[to])
    if to == TP.FLOAT8E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to in FLOAT8:
        return _to_float8(x, to, saturate)
    return x.to(_TORCH[to])


def _to_subbyte_int(x: torch.Tensor, bits: int, signed: bool) -> torch.Tensor:
    # float -> integer truncates (out of range is undefined for ONNX); integer -> narrower
    # integer keeps the low bits, read as two's complement when signed (ONNX's rule, and what
    # the reference's ml_dtypes conversion does)
    v = x.to(torch.int64) & ((1 << bits) - 1)
    if signed:
        v = v - ((v >> (bits - 1)) << bits)
    return v


def _float_source(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a float tensor wide enough to hold every value exactly."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


def _to_small_float(x: torch.Tensor, bias: int, mant: int, fmax: float) -> torch.Tensor:
    """Round to the grid of a float with no inf / NaN: nearest, ties to even, saturating at
    ±fmax (inf too). NaN has no code: ONNX's reference (and so the conformance data) gives 0
    where the float4 design note says fmax; we follow the reference."""
    xf = _float_source(x)
    a = xf.abs().nan_to_num(nan=0.0).clamp(max=fmax)
    _, e = torch.frexp(a)  # a = m * 2**e with m in [0.5, 1): the binade's exponent is e - 1
    step = torch.ldexp(torch.ones_like(a), (e - 1).clamp(min=1 - bias) - mant)  # grid spacing there
    r = (torch.round(a / step) * step).clamp(max=fmax)  # torch.round: ties to even
    return torch.copysign(r, xf)  # keeps -0 (and the sign of a saturated -inf)


def _to_float8(x: torch.Tensor, to: int, saturate: bool) -> torch.Tensor:
    fmax, overflow_at, tie_up, special = FLOAT8[to]
    xf = _float_source(x)
    # Clamp first whatever torch's own conversion does out of range (its CPU path saturates
    # E4M3FN, the others give inf / NaN); in range it rounds to nearest even. NaN stays NaN.
    y = xf.clamp(-fmax, fmax)
    if not saturate:
        a = xf.abs()
        over = a >= overflow_at if tie_up else a > overflow_at  # inf included
        y = torch.where(over, torch.copysign(torch.full_like(xf, special), xf), y)
    return y.to(_TORCH[to])


def _to_e8m0(x: torch.Tensor, saturate: bool, round_mode: str) -> torch.Tensor:
    """FLOAT8E8M0 holds powers of two 2**(c - 127), c in [0, 254], and NaN (c = 255). The sign
    is ignored (negative inputs are undefined). ``round_mode`` picks the power below ("down"),
    above ("up") or the nearest, a value halfway between two powers rounding up ("nearest").
    Out of range: saturate to 2**-127 / 2**127, else NaN (the tables of the Cast spec)."""
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"Cast: round_mode must be 'up', 'down' or 'nearest', not {round_mode!r}")
    a = x.to(torch.float64).abs()  # float64: every float16 / float32 value is normal there
    m, e = torch.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    k = e.to(torch.int64) - 1  # a in [2**k, 2**(k+1))
    if round_mode == "up":
        k = k + (m > 0.5).to(torch.int64)
    elif round_mode == "nearest":
        k = k + (m >= 0.75).to(torch.int64)  # 1.5 * 2**k is the tie
    code = k + 127
    nan_code = torch.full_like(code, 255)
    too_small = (code < 0) | (a == 0)
    too_big = (code > 254) | torch.isinf(a)
    if saturate:
        code = torch.where(too_small, torch.zeros_like(code), torch.where(too_big, torch.full_like(code, 254), code))
    else:
        code = torch.where(too_small | too_big, nan_code, code)
    code = torch.where(torch.isnan(a), nan_code, code)
    return code.to(torch.uint8).view(torch.float8_e8m0fnu)

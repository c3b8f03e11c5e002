"""Element-wise ops: arithmetic, comparison, logic, activations. Numpy broadcasting throughout."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from . import ort_math
from .registry import op
from .shapes import broadcast, same_as_first

_INT_TYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
              torch.uint16, torch.uint32, torch.uint64)


# ---- unsigned integers ------------------------------------------------------------------------
# torch has few kernels for uint16/32/64 (copies, eq/ne, where; mul and bitwise and/or/xor on the
# CPU only): the ops below compute them on int64 instead. uint16/32 values fit int64 exactly.
# uint64 is viewed as int64 with the same bits: add, sub, mul, the bitwise ops and shift-left
# give the same bits there, while ordering, division and shift-right need the unsigned helpers.
# Kernels test the dtype once per call (one set lookup), so the float path pays nothing per
# element.
_UINT = frozenset((torch.uint16, torch.uint32, torch.uint64))
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def _i64(x: torch.Tensor) -> torch.Tensor:
    """uint16/32: the same values as int64; uint64: the same bits."""
    return x.view(torch.int64) if x.dtype == torch.uint64 else x.to(torch.int64)


def _from_i64(r: torch.Tensor, dtype: torch.dtype, out=None) -> torch.Tensor:
    """int64 results back to ``dtype``, wrapping modulo 2**bits like C unsigned arithmetic."""
    if out is not None:
        (out.view(torch.int64) if dtype == torch.uint64 else out).copy_(r)
        return out
    return r.view(torch.uint64) if dtype == torch.uint64 else r.to(dtype)


def _ukey(x: torch.Tensor) -> torch.Tensor:
    """An int64 whose signed order is the unsigned order of ``x`` (uint64: sign bit flipped)."""
    return x.view(torch.int64) ^ _I64_MIN if x.dtype == torch.uint64 else x.to(torch.int64)


def _from_key(k: torch.Tensor, dtype: torch.dtype, out=None) -> torch.Tensor:
    return _from_i64(k ^ _I64_MIN if dtype == torch.uint64 else k, dtype, out)


def _lshr(x: torch.Tensor, s) -> torch.Tensor:
    """Logical shift right of int64 bit patterns: one logical step clears the sign bit, then the
    arithmetic shift of a non-negative value is logical too."""
    one = (x >> 1) & _I64_MAX
    return torch.where(s == 0, x, one >> (s - 1).clamp_min(0))


def _udiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Unsigned quotient as int64 (the bits, for uint64)."""
    x, y = _i64(a), _i64(b)
    if a.dtype != torch.uint64:
        return torch.div(x, y, rounding_mode="trunc")  # both non-negative: exact
    # Divide the halved dividend (non-negative as int64), double it, then correct by one: the
    # remainder left is below 2*y. Divisors >= 2**63 (negative here) give a quotient of 0 or 1.
    big = y < 0
    ys = torch.where(big, 1, y)
    q = torch.div((x >> 1) & _I64_MAX, ys, rounding_mode="trunc") << 1
    r = x - q * ys
    q = q + ((r ^ _I64_MIN) >= (ys ^ _I64_MIN))
    return torch.where(big, ((x ^ _I64_MIN) >= (y ^ _I64_MIN)).to(torch.int64), q)


def _umod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _i64(a) - _udiv(a, b) * _i64(b)


def _binary(name: str, fn, since=(1,), shape_op: bool = True) -> None:
    op(name, tuple(since), infer=broadcast, shape_op=shape_op)(fn)


def _add(a, b, *, out=None):
    if a.dtype in _UINT:
        return _from_i64(_i64(a) + _i64(b), a.dtype, out)
    return torch.add(a, b, out=out)


def _sub(a, b, *, out=None):
    if a.dtype in _UINT:
        return _from_i64(_i64(a) - _i64(b), a.dtype, out)
    return torch.sub(a, b, out=out)


def _mul(a, b, *, out=None):
    if a.dtype == torch.bool:  # torch.mul on bools is logical and; keep it
        return torch.logical_and(a, b, out=out)
    if a.dtype in _UINT:  # torch's CPU has mul for them, CUDA has not
        return _from_i64(_i64(a) * _i64(b), a.dtype, out)
    return torch.mul(a, b, out=out)


def _div(a, b, *, out=None):
    if a.dtype in _INT_TYPES:  # ONNX integer division truncates toward zero, like C
        if a.dtype in _UINT:
            return _from_i64(_udiv(a, b), a.dtype, out)
        return torch.div(a, b, rounding_mode="trunc", out=out)
    return torch.div(a, b, out=out)


for _n, _f in (("Add", _add), ("Sub", _sub), ("Mul", _mul), ("Div", _div)):
    _binary(_n, _f, since=(7, 13, 14))


@op("Pow", 7, infer=broadcast, writes_out=False)
def _pow(a, b, *, out=None):
    if a.dtype in _INT_TYPES and b.dtype.is_floating_point:
        return torch.pow(a.to(b.dtype), b).to(a.dtype)
    if b.dtype != a.dtype and not (a.dtype.is_floating_point and b.dtype in _INT_TYPES):
        b = b.to(a.dtype)
    return torch.pow(a, b).to(a.dtype)


@op("Mod", 10, infer=broadcast, shape_op=True)
def _mod(a, b, *, fmod=0, out=None):
    if a.dtype in _UINT:  # no signs: fmod makes no difference
        return _from_i64(_umod(a, b), a.dtype, out)
    if fmod:
        return torch.fmod(a, b, out=out)
    if a.dtype.is_floating_point:
        # The result takes the divisor's sign. fmod is exact; moving a remainder of the other sign
        # over by one divisor rounds once, like numpy (torch.remainder's a - floor(a/b)*b rounds
        # more), and a zero result takes the divisor's sign.
        r = torch.fmod(a, b)
        r = torch.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
        r = torch.where(r == 0, torch.copysign(r, b), r)
        return r if out is None else out.copy_(r)
    return torch.remainder(a, b, out=out)


def _variadic(name: str, reduce_fn, since=(8, 12, 13)):
    def kernel(*xs, out=None):
        xs = [x for x in xs if x is not None]
        if len(xs) == 1:
            return xs[0].clone() if out is None else out.copy_(xs[0].expand_as(out))
        acc = reduce_fn(xs[0], xs[1])
        for x in xs[2:]:
            acc = reduce_fn(acc, x)
        return acc

    op(name, tuple(since), infer=broadcast, writes_out=False, shape_op=True)(kernel)


def _maximum(a, b):
    if a.dtype in _UINT:
        return _from_key(torch.maximum(_ukey(a), _ukey(b)), a.dtype)
    return torch.maximum(a, b)


def _minimum(a, b):
    if a.dtype in _UINT:
        return _from_key(torch.minimum(_ukey(a), _ukey(b)), a.dtype)
    return torch.minimum(a, b)


_variadic("Sum", _add)
_variadic("Max", _maximum)
_variadic("Min", _minimum)


@op("Mean", (8, 13), infer=broadcast, writes_out=False)
def _mean(*xs, out=None):
    acc = xs[0]
    for x in xs[1:]:
        acc = acc + x
    return acc / len(xs)


# comparison and logic --------------------------------------------------------------------
def _cmp(fn):
    def kernel(a, b, *, out=None):
        return fn(a, b, out=out)
    return kernel


def _ordered(fn):
    """An ordering comparison; unsigned inputs compare through their order-preserving int64 keys."""
    def kernel(a, b, *, out=None):
        if a.dtype in _UINT:
            return fn(_ukey(a), _ukey(b), out=out)
        return fn(a, b, out=out)
    return kernel


def _bitwise(fn):
    """A bitwise op; unsigned inputs go through int64, where the bits they hold are the same."""
    def kernel(a, b, *, out=None):
        if a.dtype in _UINT:
            return _from_i64(fn(_i64(a), _i64(b)), a.dtype, out)
        return fn(a, b, out=out)
    return kernel


def _equal(a, b, *, out=None):
    if isinstance(a, np.ndarray):  # strings stay numpy object arrays on the host
        r = torch.from_numpy(np.asarray(a == b, dtype=np.bool_))
        return r if out is None else out.copy_(r)
    return torch.eq(a, b, out=out)


op("Equal", (7, 11, 13, 19), infer=broadcast, shape_op=True)(_equal)

for _name, _fn, _since in (
    ("Less", _ordered(torch.lt), (7, 9, 13)), ("Greater", _ordered(torch.gt), (7, 9, 13)),
    ("LessOrEqual", _ordered(torch.le), (12, 16)), ("GreaterOrEqual", _ordered(torch.ge), (12, 16)),
    ("And", _cmp(torch.logical_and), (7,)), ("Or", _cmp(torch.logical_or), (7,)),
    ("Xor", _cmp(torch.logical_xor), (7,)),
    ("BitwiseAnd", _bitwise(torch.bitwise_and), (18,)), ("BitwiseOr", _bitwise(torch.bitwise_or), (18,)),
    ("BitwiseXor", _bitwise(torch.bitwise_xor), (18,)),
):
    _binary(_name, _fn, since=_since)


@op("Where", (9, 16), infer=broadcast, shape_op=True)
def _where(c, x, y, *, out=None):
    return torch.where(c, x, y, out=out)


@op("BitShift", 11, infer=broadcast)
def _bitshift(a, b, *, direction, out=None):
    left = direction == "LEFT"
    if a.dtype in _UINT:
        # bits shifted past the type's width are dropped when the int64 result wraps back
        x, s = _i64(a), _i64(b)
        r = x << s if left else _lshr(x, s) if a.dtype == torch.uint64 else x >> s
        return _from_i64(r, a.dtype, out)
    f = torch.bitwise_left_shift if left else torch.bitwise_right_shift
    return f(a, b, out=out)


@op("BitwiseNot", 18, infer=same_as_first)
def _bitwise_not(x, *, out=None):
    if x.dtype in _UINT:
        return _from_i64(~_i64(x), x.dtype, out)
    return torch.bitwise_not(x, out=out)


# unary --------------------------------------------------------------------------------------
def _unary(name: str, fn, since=(1,), writes_out=True, shape_op=False) -> None:
    op(name, tuple(since), infer=same_as_first, writes_out=writes_out, shape_op=shape_op)(fn)


def _with_out(tfn):
    def kernel(x, *, out=None):
        return tfn(x, out=out)
    return kernel


for _name, _tfn, _since, _sop in (
    ("Abs", torch.abs, (6, 13), True), ("Neg", torch.neg, (6, 13), True), ("Exp", torch.exp, (6, 13), False),
    ("Log", torch.log, (6, 13), False), ("Sqrt", torch.sqrt, (6, 13), False),
    ("Reciprocal", torch.reciprocal, (6, 13), False), ("Floor", torch.floor, (6, 13), True),
    ("Ceil", torch.ceil, (6, 13), True), ("Round", torch.round, (11,), False), ("Sign", torch.sign, (9, 13), True),
    ("Sin", torch.sin, (7,), False), ("Cos", torch.cos, (7,), False), ("Tan", torch.tan, (7,), False),
    ("Asin", torch.asin, (7,), False), ("Acos", torch.acos, (7,), False), ("Atan", torch.atan, (7,), False),
    ("Sinh", torch.sinh, (9,), False), ("Cosh", torch.cosh, (9,), False), ("Asinh", torch.asinh, (9,), False),
    ("Acosh", torch.acosh, (9,), False), ("Atanh", torch.atanh, (9,), False), ("Erf", torch.erf, (9, 13), False),
    ("Not", torch.logical_not, (1,), True),
):
    _unary(_name, _with_out(_tfn), _since, shape_op=_sop)


# Sigmoid and Tanh: onnxruntime's own functions on the CPU (ort_math.py: a quantized model rounds
# what they give, and one ulp there moves a scale), torch's elsewhere
tanh = ort_math.tanh
_unary("Sigmoid", ort_math.sigmoid, (6, 13))
_unary("Tanh", tanh, (6, 13))


def _act(name: str, fn, since=(6,)) -> None:
    _unary(name, fn, since, writes_out=False)


_act("IsNaN", lambda x, *, out=None: torch.isnan(x), (9, 13, 20))  # torch.isnan has no out=
# clamp_min writes into ``out`` (torch.relu cannot): a Relu feeding a Concat writes into its slot
_unary("Relu", lambda x, *, out=None: torch.clamp_min(x, 0, out=out), (6, 13, 14))
_act("Softplus", lambda x, *, out=None: F.softplus(x), (1, 22))
_act("Softsign", lambda x, *, out=None: F.softsign(x), (1, 22))
_act("Mish", lambda x, *, out=None: F.mish(x), (18, 22))
SIXTH = float(np.float32(1 / 6))  # HardSwish's alpha, and HardSigmoid's in MobileNetV3-style exports


def hardswish(x, *, out=None):
    """x * clip(x / 6 + 0.5, 0, 1) as one kernel (torch's x * clip(x + 3, 0, 6) / 6, within an ulp):
    PP-LCNet-style models carry dozens, which were four passes over the activation each."""
    return F.hardswish(x) if out is None else torch._C._nn.hardswish(x, out=out)


def hardsigmoid(x, *, alpha=0.2, beta=0.5, out=None):
    """clip(alpha * x + beta, 0, 1); with alpha = 1/6, beta = 0.5 torch's kernel (clip(x + 3, 0, 6) / 6,
    within an ulp), else one product and two passes in place."""
    if float(np.float32(alpha)) == SIXTH and beta == 0.5:
        return F.hardsigmoid(x) if out is None else torch._C._nn.hardsigmoid(x, out=out)
    y = torch.mul(x, alpha) if out is None else torch.mul(x, alpha, out=out)
    return y.add_(beta).clamp_(0, 1)


_unary("HardSwish", hardswish, (14, 22))
_unary("HardSigmoid", hardsigmoid, (6, 22))
_act("Elu", lambda x, *, alpha=1.0, out=None: F.elu(x, alpha), (6, 22))
_act("Celu", lambda x, *, alpha=1.0, out=None: F.celu(x, alpha), (12,))
_act("LeakyRelu", lambda x, *, alpha=0.01, out=None: F.leaky_relu(x, alpha), (6, 16))
_act("ThresholdedRelu", lambda x, *, alpha=1.0, out=None: torch.where(x > alpha, x, torch.zeros_like(x)), (10, 22))
_act("Selu", lambda x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, out=None:
     torch.where(x > 0, gamma * x, gamma * alpha * (torch.exp(x) - 1)), (6, 22))
_act("Gelu", lambda x, *, approximate="none", out=None: F.gelu(x, approximate=approximate), (20,))


@op("IsInf", 10, infer=same_as_first, writes_out=False)  # torch.isinf has no out=
@op("IsInf", 20, infer=same_as_first, writes_out=False)
def _isinf(x, *, detect_negative=1, detect_positive=1, out=None):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative:
        return torch.isneginf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


@op("PRelu", (9, 16), infer=broadcast, writes_out=False)
def _prelu(x, slope, *, out=None):
    return torch.where(x < 0, x * slope, x)


@op("Clip", (11, 12, 13), infer=same_as_first)
def _clip(x, lo=None, hi=None, *, out=None):
    if lo is None and hi is None:
        return x.clone() if out is None else out.copy_(x)
    if x.dtype in _UINT:
        k = torch.clamp(_ukey(x), None if lo is None else _ukey(lo), None if hi is None else _ukey(hi))
        return _from_key(k, x.dtype, out)
    return torch.clamp(x, lo, hi, out=out)


@op("Clip", 6, infer=same_as_first)
def _clip6(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38, out=None):  # noqa: A002
    return torch.clamp(x, min, max, out=out)


op("Identity", (1, 13, 14, 16, 19, 21), infer=same_as_first, view=True, shape_op=True)(lambda x, *, out=None: x)

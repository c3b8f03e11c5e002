"""onnxruntime's table-driven quantized ops (domain ``com.microsoft``), bit-exact with its CPU kernels.

* QLinearSigmoid / QLinearLeakyRelu / QLinearConcat / QLinearWhere: onnxruntime's 256-entry table
  (dequantize, transform in float32, MlasQuantizeLinear); Sigmoid uses MLAS's rational logistic
  evaluated with its FMA chain.
* QLinearSoftmax: onnxruntime's exp table (shifted by a margin that depends on the reduced
  length), the row sum accumulated in float32 in order, its rounding and clamp.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import ShapeError
from . import byte_tables
from .qlinear_arith import _F32, DOMAIN, _eight_bit, _one, _put, _requant_lookup, _scale, _table
from .registry import op
from .shapes import broadcast, norm_axis, same_as_first


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



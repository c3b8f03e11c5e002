"""Ops that make tensors from shapes or attributes: Constant, Shape, Size, Range, Cast ..."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.dtypes import TP, cast_tensor, onnx_elem_type, to_numpy
from ..shape import Dimension
from .registry import op
from .shapes import dim_ceildiv_or_dyn, int_list, same_as_first


def _constant_value(value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
                    value_string=None, value_strings=None, sparse_value=None):
    if value is not None:
        return value
    if sparse_value is not None:
        return sparse_value
    if value_float is not None:
        return torch.tensor(value_float, dtype=torch.float32)
    if value_floats is not None:
        return torch.tensor(value_floats, dtype=torch.float32)
    if value_int is not None:
        return torch.tensor(value_int, dtype=torch.int64)
    if value_ints is not None:
        return torch.tensor(value_ints, dtype=torch.int64)
    if value_string is not None:
        return np.array(value_string, dtype=object)
    if value_strings is not None:
        return np.array(value_strings, dtype=object)
    raise ValueError("Constant has no value attribute")


def _constant_infer(shapes, values, **attrs):
    return [tuple(_constant_value(**attrs).shape)]


def _constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
              value_string=None, value_strings=None, sparse_value=None, out=None):
    v = _constant_value(value, value_float, value_floats, value_int, value_ints, value_string,
                        value_strings, sparse_value)
    if out is not None and isinstance(v, torch.Tensor):
        return out.copy_(v)
    return v.clone() if isinstance(v, torch.Tensor) else v


op("Constant", (1, 9, 11, 12, 13, 19, 21), infer=_constant_infer, writes_out=False)(_constant)


def _shape_slice(rank: int, start: int, end: int | None) -> tuple[int, int]:
    end = rank if end is None else end
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, end


def _shape_infer(shapes, values, *, start=0, end=None):
    s, e = _shape_slice(len(shapes[0]), start, end)
    return [(max(0, e - s),)]


@op("Shape", (1, 13, 15, 19, 21), infer=_shape_infer, shape_op=True)
def _shape(x, *, start=0, end=None, out=None):
    s, e = _shape_slice(len(x.shape), start, end)
    r = torch.tensor(list(x.shape[s:e]), dtype=torch.int64)
    return r if out is None else out.copy_(r)


@op("Size", (1, 13, 19, 21), infer=lambda shapes, values: [()], shape_op=True)
def _size(x, *, out=None):
    n = int(np.prod(x.shape)) if x.shape else 1
    return torch.tensor(n, dtype=torch.int64) if out is None else out.fill_(n)


def _cos_dims(value) -> list:
    """The shape input of ConstantOfShape; a negative dim (a plain int: a symbolic one is left to
    the shape program) is a ShapeError."""
    dims = int_list(value)
    for d in dims:
        if type(d) is int and d < 0:
            raise ShapeError(f"ConstantOfShape: negative dim {d} in shape {dims}")
    return dims


def _cos_infer(shapes, values, *, value=None):
    if values[0] is None:
        return [tuple(Dimension.dynamic() for _ in range(shapes[0][0]))]
    return [tuple(_cos_dims(values[0]))]


@op("ConstantOfShape", (9, 20, 21), infer=_cos_infer, shape_deps=(0,))
def _constant_of_shape(shape, *, value=None, out=None):
    fill = torch.zeros(1, dtype=torch.float32) if value is None else value
    if out is not None:
        return out.fill_(fill.reshape(()).item()) if out.numel() else out
    return torch.full(tuple(_cos_dims(shape)), fill.reshape(()).item(), dtype=fill.dtype)


def _range_args(values) -> tuple:
    """start, limit and delta as numbers; ShapeError for a delta of 0 and for a NaN or infinite
    one (their length has no answer). Only plain numbers are checked: a symbolic value (the
    compiler's) is left to the shape program, which guards on what it divides by."""
    args = tuple(v.reshape(()).item() for v in values)
    for name, v in zip(("start", "limit", "delta"), args):
        if type(v) is float and not math.isfinite(v):
            raise ShapeError(f"Range: {name} must be finite, got {v}")
    d = args[2]
    if type(d) in (int, float, bool) and d == 0:
        raise ShapeError(f"Range: delta must not be 0 (start {args[0]}, limit {args[1]})")
    return args


def _range_infer(shapes, values):
    if any(v is None for v in values):
        return [(Dimension.dynamic(),)]
    start, limit, delta = _range_args(values)
    return [(dim_ceildiv_or_dyn(start, limit, delta),)]


@op("Range", 11, infer=_range_infer, shape_deps=(0, 1, 2), shape_op=True)
def _range(start, limit, delta, *, out=None):
    s, l, d = _range_args((start, limit, delta))
    n = dim_ceildiv_or_dyn(s, l, d)
    r = (torch.arange(n, dtype=torch.float64 if start.dtype.is_floating_point else torch.int64) * d + s).to(start.dtype)
    return r if out is None else out.copy_(r.to(out.device))


def _cast_kernel(x, *, to, saturate=1, round_mode="up", out=None):
    if isinstance(x, np.ndarray):  # strings in
        if to == TP.STRING:
            return x
        x = torch.from_numpy(np.asarray(x, dtype=np.float64))
    elif to == TP.STRING:
        return np.vectorize(_fmt, otypes=[object])(to_numpy(x))
    if out is not None and to in _PLAIN_CAST:
        return out.copy_(x)  # torch's conversion is ONNX's for these: one pass, straight into out
    r = cast_tensor(x, to, bool(saturate), round_mode)
    return r if out is None else out.copy_(r)


# Targets whose conversion needs no rounding / saturation / wrap-around of ours: not float8
# (saturate), not the types held in a wider dtype (ir.dtypes.HELD).
_PLAIN_CAST = frozenset(t for t in range(1, 17) if t != TP.STRING)


def _fmt(v) -> str:
    return str(v)


op("Cast", (6, 9, 13, 19, 21, 23, 24, 25, 28), infer=same_as_first, shape_op=True)(_cast_kernel)


@op("CastLike", (15, 19, 21, 23, 24, 25), infer=same_as_first)
def _cast_like(x, like, *, saturate=1, round_mode="up", _out_types=None, out=None):
    # The target is the output's ONNX type, which the runtime passes in _out_types: like's torch
    # dtype cannot tell an INT4 (held as int8) from an INT8. Without it, like's dtype decides.
    to = _out_types[0] if _out_types and _out_types[0] else onnx_elem_type(like)
    return _cast_kernel(x, to=to, saturate=saturate, round_mode=round_mode, out=out)

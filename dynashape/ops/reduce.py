"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceLogSum, ReduceLogSumExp, ReduceSumSquare.

Axes come as an attribute before opset 13 (ReduceSum) or 18 (the others), and as an optional
second input after (a shape dependency, since it decides the output rank), together with
``noop_with_empty_axes``. Reducing over no axes (noop) applies the op's element-wise part only
(|x| for L1, x*x for SumSquare ...), as the ONNX reference does; reducing over an empty
dimension gives the op's identity (0 for sums, 1 for Prod, -inf for Max ...).
"""

from __future__ import annotations

import numpy as np
import torch

from .registry import op
from .shapes import first_item, int_list, norm_axis


def _axes_of(rank: int, axes, noop: int) -> list[int]:
    """Sorted reduced dims; [] means no reduction (noop_with_empty_axes with empty axes)."""
    if axes is None or len(axes) == 0:
        return [] if noop else list(range(rank))
    return sorted({norm_axis(int(a), rank, "reduce axis") for a in axes})


def _out_shape(shape, dims: list[int], keepdims: int) -> tuple:
    if keepdims:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def _infer_attr(shapes, values, *, axes=None, keepdims=1):
    x = shapes[0]
    return [_out_shape(x, _axes_of(len(x), axes, 0), keepdims)]


def _infer_input(shapes, values, *, keepdims=1, noop_with_empty_axes=0):
    x = shapes[0]
    if len(shapes) > 1 and shapes[1] is not None:
        if values[1] is None:
            raise ValueError("reduce axes are not known at compile time")
        axes = int_list(values[1])
    else:
        axes = None
    return [_out_shape(x, _axes_of(len(x), axes, noop_with_empty_axes), keepdims)]


def _finish(r: torch.Tensor, out):
    if out is None:
        return r
    return out.copy_(r.reshape(out.shape))


def _leading_rows(x: torch.Tensor, dims) -> int:
    """How many leading rows a CPU float reduction over ``dims`` adds up when, size-1 axes aside,
    the reduced axes come before every kept one (onnxruntime's "RK" case); 0 otherwise."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return 0
    sized = [d for d in range(x.dim()) if x.shape[d] != 1]
    red = [d for d in sized if d in dims]
    if not red or len(red) == len(sized) or sized[:len(red)] != red:
        return 0
    rows = 1
    for d in red:
        rows *= x.shape[d]
    return rows


def _rows_in_order(x: torch.Tensor, rows: int, dims, keepdim: bool) -> torch.Tensor:
    """The sum of ``rows`` leading rows added one after another, as onnxruntime's CPU kernel adds
    them (its first row, plus the second, plus the third ...; torch sums in blocks, whose last bits
    differ: a variance computed as E[x^2] - E[x]^2 cancels them into the result, magika's first
    LayerNorm). numpy's reduction over the first axis of a C-ordered array is that loop."""
    a = x.contiguous().numpy().reshape(rows, -1)
    shape = [1 if d in dims else n for d, n in enumerate(x.shape)] if keepdim else \
        [n for d, n in enumerate(x.shape) if d not in dims]
    return torch.from_numpy(np.add.reduce(a, axis=0)).reshape(shape)


# Each reducer: (x, dims (non-empty), keepdim, out) -> result, written into out when given.
def _sum(x, dims, keepdim, out):
    rows = _leading_rows(x, dims)
    if rows:
        return _finish(_rows_in_order(x, rows, dims, keepdim), out)
    return torch.sum(x, dims, keepdim, dtype=x.dtype, out=out)


def _mean(x, dims, keepdim, out):
    if not x.dtype.is_floating_point:  # integer mean truncates, like the references
        n = 1
        for d in dims:
            n *= x.shape[d]
        r = torch.div(torch.sum(x, dims, keepdim, dtype=x.dtype), n, rounding_mode="trunc")
        return _finish(r, out)
    rows = _leading_rows(x, dims)
    if rows:  # the sum in onnxruntime's order, then divided by the count (its order too)
        return _finish(_rows_in_order(x, rows, dims, keepdim).div_(rows), out)
    return torch.mean(x, dims, keepdim, out=out)


def _extreme(tfn, empty_fill):
    def red(x, dims, keepdim, out):
        if any(x.shape[d] == 0 for d in dims):  # torch refuses; ONNX gives the identity
            shape = _out_shape(tuple(x.shape), dims, keepdim)
            fill = empty_fill(x.dtype)
            return torch.full(shape, fill, dtype=x.dtype, device=x.device) if out is None else out.fill_(fill)
        if x.dtype == torch.bool:  # opset 20: max is any, min is all
            r = tfn(x.to(torch.uint8), dims, keepdim).to(torch.bool)
            return _finish(r, out)
        return tfn(x, dims, keepdim, out=out)
    return red


def _lowest(dt):
    if dt == torch.bool:
        return False
    return float("-inf") if dt.is_floating_point else torch.iinfo(dt).min


def _highest(dt):
    if dt == torch.bool:
        return True
    return float("inf") if dt.is_floating_point else torch.iinfo(dt).max


def _prod(x, dims, keepdim, out):
    # torch.prod takes one dim: reduce from the last so earlier indices stay valid
    r = x
    for d in reversed(dims):
        r = torch.prod(r, d, keepdim=keepdim, dtype=x.dtype)
    return _finish(r, out)


def _l1(x, dims, keepdim, out):
    if not x.dtype.is_floating_point:
        return _finish(torch.sum(x.abs(), dims, keepdim, dtype=x.dtype), out)
    return torch.linalg.vector_norm(x, 1, dims, keepdim, out=out)


def _l2(x, dims, keepdim, out):
    if not x.dtype.is_floating_point:  # the references truncate sqrt of the integer sum
        s = torch.sum(x * x, dims, keepdim, dtype=x.dtype)
        return _finish(torch.sqrt(s.double()).to(x.dtype), out)
    return torch.linalg.vector_norm(x, 2, dims, keepdim, out=out)


def _sum_square(x, dims, keepdim, out):
    return torch.sum(x * x, dims, keepdim, dtype=x.dtype, out=out)


def _log_sum(x, dims, keepdim, out):
    r = torch.sum(x, dims, keepdim, out=out)
    return r.log_()


def _log_sum_exp(x, dims, keepdim, out):
    return torch.logsumexp(x, dims, keepdim, out=out)


# The element-wise part alone, for a noop reduction (no axes).
_NOOP = {
    "ReduceSum": lambda x: x, "ReduceMean": lambda x: x, "ReduceMax": lambda x: x, "ReduceMin": lambda x: x,
    "ReduceProd": lambda x: x, "ReduceL1": torch.abs, "ReduceL2": torch.abs,
    "ReduceSumSquare": lambda x: x * x, "ReduceLogSum": torch.log, "ReduceLogSumExp": lambda x: x,
}


def _run(name, reducer, x, dims, keepdims, out):
    if not dims:
        r = _NOOP[name](x)
        if out is not None:
            return out.copy_(r)
        return r.clone() if r is x else r
    return reducer(x, dims, bool(keepdims), out)


def _register(name, reducer, attr_since, input_since, shape_op=False):
    def attr_kernel(x, *, axes=None, keepdims=1, out=None):
        return _run(name, reducer, x, _axes_of(x.dim(), axes, 0), keepdims, out)

    def input_kernel(x, axes=None, *, keepdims=1, noop_with_empty_axes=0, out=None):
        ax = None if axes is None else int_list(axes)
        return _run(name, reducer, x, _axes_of(x.dim(), ax, noop_with_empty_axes), keepdims, out)

    for s in attr_since:
        op(name, s, infer=_infer_attr, shape_op=shape_op)(attr_kernel)
    for s in input_since:
        op(name, s, infer=_infer_input, shape_deps=(1,), shape_op=shape_op)(input_kernel)


# Sum, Prod, Max, Min also compute on shapes (numel of a shape, a max length): shape_op
_register("ReduceSum", _sum, (1, 11), (13,), shape_op=True)
_register("ReduceMean", _mean, (1, 11, 13), (18,))
_register("ReduceMax", _extreme(torch.amax, _lowest), (1, 11, 12, 13), (18, 20), shape_op=True)
_register("ReduceMin", _extreme(torch.amin, _highest), (1, 11, 12, 13), (18, 20), shape_op=True)
_register("ReduceProd", _prod, (1, 11, 13), (18,), shape_op=True)
_register("ReduceL1", _l1, (1, 11, 13), (18,))
_register("ReduceL2", _l2, (1, 11, 13), (18,))
_register("ReduceSumSquare", _sum_square, (1, 11, 13), (18,))
_register("ReduceLogSum", _log_sum, (1, 11, 13), (18,))
_register("ReduceLogSumExp", _log_sum_exp, (1, 11, 13), (18,))


# CumProd ------------------------------------------------------------------------------------
# As CumSum (ops/tensor_copies.py): the axis is a 0-D/1-element input, ``exclusive`` shifts by one
# (the first element becomes the identity, 1), ``reverse`` accumulates from the end.
def _cumprod_infer(shapes, values, **_attrs):
    return [shapes[0]]


@op("CumProd", 26, infer=_cumprod_infer, shape_deps=(1,))  # the axis: a host number
def _cumprod(x, axis, *, exclusive=0, reverse=0, out=None):
    a = norm_axis(int(first_item(axis)), x.dim())
    # no unsigned cumprod/flip kernels: run on int64 and keep the low bits, which is the
    # product modulo 2**32 / 2**64 the unsigned type wraps to
    src = x.to(torch.int64) if x.dtype in (torch.uint32, torch.uint64) else x
    src = src.flip(a) if reverse else src
    n = x.shape[a]
    if exclusive:
        r = torch.ones_like(src)
        if n > 1:
            # the product of the elements strictly before each position
            r.narrow(a, 1, n - 1).copy_(torch.cumprod(src.narrow(a, 0, n - 1), a, dtype=src.dtype))
    else:
        r = torch.cumprod(src, a, dtype=src.dtype)
    if reverse:
        r = r.flip(a)
    r = r.to(x.dtype)
    return r if out is None else out.copy_(r)

"""Symbolic values of the small integer tensors that shape subgraphs compute.

``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` is how exported models say "reshape to
(batch, seq, 4, 16)". To know that at load, the values of those small tensors are followed as
arrays of SymInts (numpy object arrays, whose element-wise operators call the SymInt ones, so
comparisons become guards like everywhere else). An op is evaluated here when every input it
reads has a symbolic value and its output is small and of static shape; otherwise it has no
symbolic value and runs at run time (its consumers' shapes are then found at run time too).
Only integer and bool values are followed: float arithmetic on sizes (Resize scales) is not.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np
import torch

from ..ops.tensor import _slice_params
from ..shape.symint import SymInt

MAX_ELEMENTS = 64  # larger tensors are data, not shape arithmetic
_INT_DTYPES = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool}


class SymValue:
    """A small int/bool tensor whose elements are ints or SymInts; answers the few tensor
    methods shape functions use on their value inputs (reshape, tolist, item, numel, ...)."""

    __slots__ = ("a", "dtype")

    def __init__(self, a: np.ndarray, dtype: torch.dtype) -> None:
        self.a, self.dtype = a, dtype

    @staticmethod
    def of(t: torch.Tensor) -> SymValue | None:
        if t.numel() > MAX_ELEMENTS:
            return None
        if t.dtype not in _INT_DTYPES:
            # a float constant of whole numbers (a Range's 0.0 and 1.0): followed as ints
            if t.dtype not in (torch.float32, torch.float64) or not bool(torch.isfinite(t).all()) \
                    or not bool((t == t.round()).all()) or bool((t.abs() > 2 ** 24).any()):
                return None
        arr = np.empty(tuple(t.shape), dtype=object)
        flat = arr.reshape(-1)
        for i, v in enumerate(t.reshape(-1).tolist()):
            flat[i] = v
        return SymValue(arr, t.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.a.shape

    def numel(self) -> int:
        return self.a.size

    def dim(self) -> int:
        return self.a.ndim

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def reshape(self, *shape) -> SymValue:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return SymValue(self.a.reshape(shape), self.dtype)

    def tolist(self):
        return self.a.tolist()

    def item(self):
        return self.a.reshape(-1)[0] if self.a.size == 1 else self.a.item()

    def __getitem__(self, idx):
        r = self.a[idx]
        return SymValue(r, self.dtype) if isinstance(r, np.ndarray) else SymValue(np.array(r, dtype=object), self.dtype)

    def __len__(self) -> int:
        return len(self.a)

    def flat(self) -> list:
        return self.a.reshape(-1).tolist()

    def is_concrete(self) -> bool:
        return not any(isinstance(v, SymInt) for v in self.flat())

    def __repr__(self) -> str:
        return f"SymValue({self.a.tolist()!r}, {self.dtype})"


def _arr(shape, items) -> np.ndarray:
    out = np.empty(tuple(int(d) for d in shape), dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(items):
        flat[i] = v
    return out


def _obj(a) -> np.ndarray:
    """An object array (numpy may have made an int or bool array of plain results, or handed
    back one element: np.asarray of a SymInt would make it an int64, which pins it)."""
    if not isinstance(a, np.ndarray):
        out = np.empty((), dtype=object)
        out[()] = a
        return out
    if a.dtype == object:
        return a
    return _arr(a.shape, a.reshape(-1).tolist())


def _ints(v: SymValue | None) -> list[int] | None:
    """Plain ints (pinned by guards when symbolic): for indices, axes and repeat counts."""
    return None if v is None else [int(x) for x in v.flat()]


def _elementwise(fn: Callable, dtype: torch.dtype | None = None, floats: bool = True) -> Callable:
    """``dtype``: the result's (bool for comparisons), else the graph's or the first input's.
    ``floats``: the op is exact on whole numbers held as floats (Add, Mul ...; not Div)."""
    def run(node, shapes, vals, out_shapes):
        if any(v is None for v in vals):
            return None
        if any(v.dtype.is_floating_point for v in vals) and not floats:
            return None
        arrays = np.broadcast_arrays(*[v.a for v in vals])
        flat = [a.reshape(-1).tolist() for a in arrays]
        res = [fn(*xs) for xs in zip(*flat)] if flat else []
        if any(isinstance(r, float) and not r.is_integer() for r in res):
            return None
        shape = arrays[0].shape if arrays else ()
        return [SymValue(_arr(shape, res), dtype or _result_dtype(node, vals))]
    return run


def _result_dtype(node, vals) -> torch.dtype:
    from ..ir.dtypes import torch_dtype
    et = node.outputs[0].elem_type
    try:
        return torch_dtype(et) if et else vals[0].dtype
    except KeyError:
        return vals[0].dtype


def _tdiv(a, b):
    """ONNX integer division truncates toward zero; for non-negative operands that is ``//``."""
    if a >= 0 and b > 0:
        return a // b
    a, b = int(a), int(b)
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _shape(node, shapes, vals, out_shapes):
    s = shapes[0]
    if s is None:
        return None
    rank = len(s)
    start, end = node.attrs.get("start", 0), node.attrs.get("end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    dims = list(s[start:end])
    return [SymValue(_arr((len(dims),), dims), torch.int64)]


def _size(node, shapes, vals, out_shapes):
    if shapes[0] is None:
        return None
    return [SymValue(_arr((), [math.prod(shapes[0])]), torch.int64)]


def _gather(node, shapes, vals, out_shapes):
    data, idx = vals[0], vals[1]
    if data is None or idx is None:
        return None
    axis = node.attrs.get("axis", 0)
    ind = np.array(_ints(idx), dtype=np.int64).reshape(idx.shape)
    return [SymValue(_obj(np.take(data.a, ind, axis=axis)), data.dtype)]


def _concat(node, shapes, vals, out_shapes):
    parts = [v for v in vals if v is not None]
    if len(parts) != len([s for s in shapes if s is not None]):
        return None
    return [SymValue(_obj(np.concatenate([p.a for p in parts], axis=node.attrs["axis"])), parts[0].dtype)]


def _same_elements(node, shapes, vals, out_shapes):
    """Reshape, Squeeze, Unsqueeze, Flatten, Identity: the elements in order, another shape."""
    if vals[0] is None:
        return None
    return [SymValue(vals[0].a.reshape(out_shapes[0]), vals[0].dtype)]


def _transpose(node, shapes, vals, out_shapes):
    if vals[0] is None:
        return None
    return [SymValue(_obj(np.transpose(vals[0].a, node.attrs.get("perm"))), vals[0].dtype)]


def _slice(node, shapes, vals, out_shapes):
    x = vals[0]
    if x is None:
        return None
    if node.opset >= 10:
        starts, ends = _ints(vals[1]), _ints(vals[2])
        axes = _ints(vals[3]) if len(vals) > 3 else None
        steps = _ints(vals[4]) if len(vals) > 4 else None
        if starts is None or ends is None:
            return None
    else:
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    idx = [slice(None)] * x.a.ndim
    for a, st, en, sp in _slice_params(tuple(x.shape), starts, ends, axes, steps):
        idx[a] = slice(st, None if en < 0 else en, sp)
    return [SymValue(_obj(x.a[tuple(idx)]), x.dtype)]


def _cast(node, shapes, vals, out_shapes):
    from ..ir.dtypes import torch_dtype
    if vals[0] is None:
        return None
    to = torch_dtype(node.attrs["to"])
    if to in (torch.float32, torch.float64) and vals[0].dtype in _INT_DTYPES - {torch.bool}:
        # an int size as a float (a Range in floats over a grid): the same number, exactly, while
        # below 2**24; arithmetic on it that is not exact pins the value (a guard)
        return [SymValue(vals[0].a.copy(), to)]
    if to not in _INT_DTYPES:
        return None  # other floats: followed at run time, not here
    fn = (lambda v: v != 0) if to == torch.bool else (lambda v: int(v) if isinstance(v, bool) else v)
    flat = [fn(v) for v in vals[0].flat()]
    return [SymValue(_arr(vals[0].shape, flat), to)]


def _where(node, shapes, vals, out_shapes):
    if any(v is None for v in vals):
        return None
    c, a, b = np.broadcast_arrays(vals[0].a, vals[1].a, vals[2].a)
    res = [x if bool(k) else y for k, x, y in zip(c.reshape(-1).tolist(), a.reshape(-1).tolist(),
                                                   b.reshape(-1).tolist())]
    return [SymValue(_arr(c.shape, res), vals[1].dtype)]


def _expand(node, shapes, vals, out_shapes):
    if vals[0] is None:
        return None
    return [SymValue(_obj(np.broadcast_to(vals[0].a, out_shapes[0]).copy()), vals[0].dtype)]


def _tile(node, shapes, vals, out_shapes):
    if vals[0] is None or vals[1] is None:
        return None
    return [SymValue(_obj(np.tile(vals[0].a, _ints(vals[1]))), vals[0].dtype)]


def _range(node, shapes, vals, out_shapes):
    if any(v is None for v in vals):
        return None
    start, _, delta = (v.item() for v in vals)
    n = out_shapes[0][0]
    return [SymValue(_arr((n,), [start + i * delta for i in range(n)]), vals[0].dtype)]


def _constant_of_shape(node, shapes, vals, out_shapes):
    value = node.attrs.get("value")
    v = 0 if value is None else value.reshape(-1).tolist()[0]
    if value is not None and value.dtype not in _INT_DTYPES:
        return None
    dtype = torch.int64 if value is None else value.dtype
    return [SymValue(_arr(out_shapes[0], [v] * math.prod(out_shapes[0])), dtype)]


def _reduce(fn: Callable) -> Callable:
    def run(node, shapes, vals, out_shapes):
        x = vals[0]
        if x is None:
            return None
        axes = node.attrs.get("axes")
        if axes is None and len(vals) > 1 and vals[1] is not None:
            axes = _ints(vals[1])
        full = not axes or sorted(a % max(x.a.ndim, 1) for a in axes) == list(range(x.a.ndim))
        if not full:
            return None
        flat = x.flat()
        r = flat[0]
        for v in flat[1:]:
            r = fn(r, v)
        return [SymValue(_arr(out_shapes[0], [r]), x.dtype)]
    return run


def _split(node, shapes, vals, out_shapes):
    x = vals[0]
    if x is None or x.a.ndim != 1:
        return None
    out, start = [], 0
    for s in out_shapes:
        out.append(SymValue(_obj(x.a[start:start + s[0]]), x.dtype))
        start += s[0]
    return out


def _max(a, b):
    return a if a >= b else b


def _min(a, b):
    return a if a <= b else b


EVALUATORS: dict[str, Callable] = {
    "Shape": _shape, "Size": _size, "Gather": _gather, "Concat": _concat, "Slice": _slice,
    "Reshape": _same_elements, "Squeeze": _same_elements, "Unsqueeze": _same_elements,
    "Flatten": _same_elements, "Identity": _same_elements, "Transpose": _transpose, "Cast": _cast,
    "Where": _where, "Expand": _expand, "Tile": _tile, "Range": _range, "ConstantOfShape": _constant_of_shape,
    "Split": _split,
    "Add": _elementwise(operator.add), "Sub": _elementwise(operator.sub), "Mul": _elementwise(operator.mul),
    "Div": _elementwise(_tdiv, floats=False), "Mod": _elementwise(operator.mod, floats=False),
    "Neg": _elementwise(operator.neg),
    "Abs": _elementwise(abs), "Max": _elementwise(lambda *xs: _fold(_max, xs)),
    "Min": _elementwise(lambda *xs: _fold(_min, xs)),
    "Equal": _elementwise(lambda a, b: bool(a == b), torch.bool),
    "Less": _elementwise(lambda a, b: bool(a < b), torch.bool),
    "Greater": _elementwise(lambda a, b: bool(a > b), torch.bool),
    "LessOrEqual": _elementwise(lambda a, b: bool(a <= b), torch.bool),
    "GreaterOrEqual": _elementwise(lambda a, b: bool(a >= b), torch.bool),
    "Not": _elementwise(lambda a: not a, torch.bool),
    "And": _elementwise(lambda a, b: bool(a) and bool(b), torch.bool),
    "Or": _elementwise(lambda a, b: bool(a) or bool(b), torch.bool),
    "ReduceProd": _reduce(operator.mul), "ReduceSum": _reduce(operator.add), "ReduceMax": _reduce(_max),
    "ReduceMin": _reduce(_min),
}


def _fold(fn, xs):
    r = xs[0]
    for x in xs[1:]:
        r = fn(r, x)
    return r


def evaluate(node, shapes: list, vals: list, out_shapes: list) -> list[SymValue] | None:
    """The symbolic values of ``node``'s outputs, or None when they are not followed here."""
    fn = EVALUATORS.get(node.op_type)
    if fn is None or node.domain not in ("", "ai.onnx"):
        return None
    if any(s is None or not all(_fixed(d) for d in s) for s in out_shapes):
        return None  # an output whose own shape is symbolic is data (Range(0, seq)), not a few ints
    out_shapes = [tuple(int(d) for d in s) for s in out_shapes]  # fixed: int() pins nothing
    if any(math.prod(s) > MAX_ELEMENTS for s in out_shapes):
        return None
    return fn(node, shapes, vals, out_shapes)


def _fixed(d) -> bool:
    """A dim of one value in this specialization: an int, or a SymInt whose expression a guard
    made constant (``seq`` after ``seq == 1``)."""
    return not isinstance(d, SymInt) or not d.expr.terms

"""Tensor layout ops that are views: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Slice, BitCast.

They only re-describe memory: they return a tensor aliasing their input and get no buffer. The
layout ops that write a new tensor (Concat, Split, Pad, Tile ...) are in ``tensor_copies.py``.
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from ..shape import Dimension
from .registry import op
from .shapes import int_list, norm_axes, prod, same_as_first

INT64_MAX = (1 << 63) - 1


def _emit(r: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Return ``r``, or copy it into ``out`` when the runtime gave a buffer."""
    return r if out is None else out.copy_(r)


def _static(d) -> bool:
    return isinstance(d, int)


def _opt_list(v):
    return None if v is None else int_list(v)


# ---- Reshape ----------------------------------------------------------------------------------
def reshape_target(src, target: list, allowzero: int) -> list:
    """The output dims of a Reshape of ``src`` to ``target``; a Dimension entry in ``target`` (a
    shape tensor known only in part at compile time, compile/partial_values.py) stands for itself."""
    out: list = []
    neg = None
    for i, t in enumerate(target):
        if isinstance(t, Dimension):
            out.append(t)
        elif t == 0 and not allowzero:
            if i >= len(src):
                raise ShapeError(f"Reshape: 0 at position {i} copies an input dim, but the input has rank "
                                 f"{len(src)}")
            out.append(src[i])
        elif t == -1:
            if neg is not None:
                raise ShapeError(f"Reshape: shape {target} has more than one -1")
            neg = i
            out.append(None)
        elif t < 0:
            raise ShapeError(f"Reshape: invalid dim {t} in shape {target}")
        else:
            out.append(t)
    if allowzero and neg is not None and 0 in target:
        raise ShapeError(f"Reshape: shape {target} has both 0 and -1 with allowzero=1")
    total = prod(src)
    known = prod(d for d in out if d is not None)
    if neg is not None:
        if _static(total) and _static(known):
            if known == 0 or total % known:
                raise ShapeError(f"Reshape: cannot infer -1 in {target} for input shape {tuple(src)}")
            out[neg] = total // known
        else:
            out[neg] = total // known if _static(known) and known else Dimension.dynamic()
    elif _static(total) and _static(known) and total != known:
        raise ShapeError(f"Reshape: cannot reshape {tuple(src)} ({total} elements) to {target}")
    return out


def _reshape_infer(shapes, values, *, allowzero=0):
    if values[1] is None:
        raise ValueError("Reshape: shape unknown")
    return [tuple(reshape_target(shapes[0], int_list(values[1]), allowzero))]


@op("Reshape", (5, 13, 14, 19, 21, 23, 24, 25), infer=_reshape_infer, shape_deps=(1,), view=True, shape_op=True)
def _reshape(x, shape, *, allowzero=0, out=None):
    return x.reshape(reshape_target(tuple(x.shape), int_list(shape), allowzero))


# ---- Flatten ----------------------------------------------------------------------------------
def _flatten_infer(shapes, values, *, axis=1):
    s = shapes[0]
    r = len(s)
    a = axis + r if axis < 0 else axis  # axis == rank is allowed: (N, 1)
    if not 0 <= a <= r:
        raise ShapeError(f"Flatten: axis {axis} is out of range for rank {r}")
    return [(prod(s[:a]), prod(s[a:]))]


@op("Flatten", (1, 9, 11, 13, 21, 23, 24, 25), infer=_flatten_infer, view=True, shape_op=True)
def _flatten(x, *, axis=1, out=None):
    return x.reshape(_flatten_infer([tuple(x.shape)], [None], axis=axis)[0])


# ---- Squeeze / Unsqueeze ------------------------------------------------------------------------
def _squeeze_shape(s, axes):
    if axes is None:  # every dim of 1; needs every dim known
        if not all(_static(d) for d in s):
            raise ValueError("Squeeze without axes on dynamic dims")
        return tuple(d for d in s if d != 1)
    ax = set(norm_axes(axes, len(s)))
    for a in ax:
        if _static(s[a]) and s[a] != 1:
            raise ShapeError(f"Squeeze: dim {a} of shape {tuple(s)} is {s[a]}, not 1")
    return tuple(d for i, d in enumerate(s) if i not in ax)


def _squeeze1_infer(shapes, values, *, axes=None):
    return [_squeeze_shape(shapes[0], axes)]


def _squeeze13_infer(shapes, values):
    if len(shapes) > 1 and shapes[1] is not None:
        if values[1] is None:
            raise ValueError("Squeeze: axes unknown")
        return [_squeeze_shape(shapes[0], int_list(values[1]))]
    return [_squeeze_shape(shapes[0], None)]


@op("Squeeze", (1, 11), infer=_squeeze1_infer, view=True, shape_op=True)
def _squeeze1(x, *, axes=None, out=None):
    return x.reshape(_squeeze_shape(tuple(x.shape), axes))


@op("Squeeze", (13, 21, 23, 24, 25), infer=_squeeze13_infer, shape_deps=(1,), view=True, shape_op=True)
def _squeeze13(x, axes=None, *, out=None):
    return x.reshape(_squeeze_shape(tuple(x.shape), None if axes is None else int_list(axes)))


def _unsqueeze_shape(s, axes):
    rank = len(s) + len(axes)
    ax = norm_axes(axes, rank)
    if len(set(ax)) != len(ax):
        raise ShapeError(f"Unsqueeze: repeated axes {axes}")
    it = iter(s)
    return tuple(1 if i in ax else next(it) for i in range(rank))


def _unsqueeze1_infer(shapes, values, *, axes):
    return [_unsqueeze_shape(shapes[0], axes)]


def _unsqueeze13_infer(shapes, values):
    if values[1] is None:
        raise ValueError("Unsqueeze: axes unknown")
    return [_unsqueeze_shape(shapes[0], int_list(values[1]))]


@op("Unsqueeze", (1, 11), infer=_unsqueeze1_infer, view=True, shape_op=True)
def _unsqueeze1(x, *, axes, out=None):
    return x.reshape(_unsqueeze_shape(tuple(x.shape), axes))


@op("Unsqueeze", (13, 21, 23, 24, 25), infer=_unsqueeze13_infer, shape_deps=(1,), view=True, shape_op=True)
def _unsqueeze13(x, axes, *, out=None):
    return x.reshape(_unsqueeze_shape(tuple(x.shape), int_list(axes)))


# ---- Transpose ----------------------------------------------------------------------------------
def _perm(rank: int, perm) -> list[int]:
    if perm is None:
        return list(range(rank - 1, -1, -1))
    p = norm_axes(perm, rank)
    if sorted(p) != list(range(rank)):
        raise ShapeError(f"Transpose: perm {perm} is not a permutation of rank {rank}")
    return p


def _transpose_infer(shapes, values, *, perm=None):
    s = shapes[0]
    return [tuple(s[i] for i in _perm(len(s), perm))]


@op("Transpose", (1, 13, 21, 23, 24, 25), infer=_transpose_infer, view=True, shape_op=True)
def _transpose(x, *, perm=None, out=None):
    return x.permute(_perm(x.dim(), perm))


# ---- Slice --------------------------------------------------------------------------------------
def _slice_params(s, starts, ends, axes, steps):
    """Per axis (axis, start, end, step) with ONNX's clamping, in index space of that axis."""
    rank = len(s)
    axes = list(range(len(starts))) if axes is None else norm_axes(axes, rank)
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"Slice: starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"Slice: repeated axes {axes}")
    res = []
    for a, st, en, sp in zip(axes, starts, ends, steps):
        if sp == 0:
            raise ShapeError("Slice: step 0")
        d = s[a]
        if not _static(d):
            # a dynamic dim is fine only for the whole-axis or from-a-start form with step 1
            if sp == 1 and st >= 0 and en >= INT64_MAX // 2:
                res.append((a, st, None, 1))
                continue
            raise ValueError("Slice on a dynamic dim")
        if st < 0:
            st += d
        if en < 0:
            en += d
        if sp > 0:
            st, en = min(max(st, 0), d), min(max(en, 0), d)
        else:
            st, en = min(max(st, 0), d - 1), min(max(en, -1), d - 1)
        res.append((a, st, en, sp))
    return res


def _slice_len(d, st, en, sp):
    if en is None:  # compile time, dynamic dim, step 1 to the end
        return d - st if st else d
    n = (en - st + sp - 1) // sp if sp > 0 else (st - en - sp - 1) // -sp
    return max(n, 0)


def _slice_shape(s, params):
    out = list(s)
    for a, st, en, sp in params:
        out[a] = _slice_len(s[a], st, en, sp)
    return tuple(out)


def _slice_apply(x, params):
    idx = [slice(None)] * x.dim()
    flips = []
    for a, st, en, sp in params:
        if sp > 0:
            idx[a] = slice(st, max(en, st), sp)
        else:
            # torch slices have no negative step: walk the flipped axis forward instead
            d = x.shape[a]
            flips.append(a)
            fs, fe = d - 1 - st, d - 1 - en
            idx[a] = slice(fs, max(fe, fs), -sp)
    if flips:
        x = x.flip(flips)
    return x[tuple(idx)]


def _slice1_infer(shapes, values, *, starts, ends, axes=None):
    return [_slice_shape(shapes[0], _slice_params(shapes[0], starts, ends, axes, None))]


@op("Slice", 1, infer=_slice1_infer, view=True, shape_op=True)
def _slice1(x, *, starts, ends, axes=None, out=None):
    return _slice_apply(x, _slice_params(tuple(x.shape), starts, ends, axes, None))


def _slice10_infer(shapes, values):
    for i in range(1, len(shapes)):
        if shapes[i] is not None and values[i] is None:
            raise ValueError("Slice: parameters unknown")
    vals = [_opt_list(values[i]) if i < len(values) else None for i in range(1, 5)]
    return [_slice_shape(shapes[0], _slice_params(shapes[0], *vals))]


@op("Slice", (10, 11, 13), infer=_slice10_infer, shape_deps=(1, 2, 3, 4), view=True, shape_op=True)
def _slice10(x, starts, ends, axes=None, steps=None, *, out=None):
    params = _slice_params(tuple(x.shape), int_list(starts), int_list(ends), _opt_list(axes),
                           _opt_list(steps))
    return _slice_apply(x, params)


# ---- BitCast ----------------------------------------------------------------------------------
@op("BitCast", 26, infer=same_as_first, view=True)
def _bitcast(x, *, to, out=None):
    try:
        dt = torch_dtype(to)
    except KeyError:
        from ..ir.dtypes import elem_type_name  # only for this message
        raise NotImplementedError(f"BitCast to {elem_type_name(to)}: the type has no torch dtype") from None
    if not isinstance(x, torch.Tensor):
        raise NotImplementedError(f"BitCast from {x.dtype}: the type has no torch dtype")
    if x.element_size() != dt.itemsize:
        raise TypeError(f"BitCast: {x.dtype} has {8 * x.element_size()} bits but {dt} has {8 * dt.itemsize}; "
                        "the widths must match")
    # the same bits seen as another type of the same width: torch keeps the shape, and a view
    # copies nothing
    return x.view(dt)

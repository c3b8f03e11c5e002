"""Indexing ops: Gather*, Scatter*, OneHot, TopK, ArgMax/ArgMin.

ONNX indices may be negative (counting from the end) and int32 or int64; torch wants
non-negative int64, so every kernel normalizes them first.

Indices read from data are bounds-checked: an index outside ``[-size, size)`` of the axis it
indexes raises ``IndexOutOfRangeError`` naming the op, the index, the axis, the size and where the
index sits in ``indices``; it never selects another element. The checks:

- on the CPU (where shape subgraphs and host indices live), always: one ``torch.aminmax`` over the
  indices (per indexed axis for GatherND / ScatterND) compared with the sizes on the host; the
  offending element is looked up only once the check failed.
- on CUDA, Gather, GatherElements, ScatterElements / Scatter (and Compress) are not checked from
  the host: torch's index_select / gather / scatter kernels assert on an out-of-range index on the
  device (our normalisation maps every out-of-range index to one that is still out of range), so
  they cannot answer wrongly, and the valid path keeps no host sync. Indices that are on the CPU
  while the data is on CUDA are checked on the CPU before they are moved (no sync either).
- GatherND and ScatterND linearise their indices themselves, so an index past one axis would land
  in the next row (``[[0, 5]]`` of a 3x4 tensor is element 5 = ``[1, 1]``) and nothing in torch
  would notice: they are checked per axis. On the CPU as above. On CUDA without a host sync (a
  sync per call was 43% of BERT-base's host time at random shapes): a row with any index out of
  its axis's range gets a linear index past the end, so torch's index kernel asserts on the
  device, as it does for Gather (no wrong element is ever read or written); while a CUDA graph
  is captured the same holds.
- OneHot needs no index check (ONNX: an index outside ``[-depth, depth - 1]`` gives a row of
  ``off`` values); its depth, read on the host anyway, must be a positive whole number.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import IndexOutOfRangeError, ShapeError
from .elementwise import _ukey
from .registry import op
from .shapes import first_item, int_list, norm_axis, prod, same_as_first


def _norm_index(idx: torch.Tensor, dim: int) -> torch.Tensor:
    idx = idx.to(torch.int64)
    return torch.where(idx < 0, idx + dim, idx)


# ---- bounds checks ------------------------------------------------------------------------------
def _position(flat: int, shape) -> str:
    """``indices[i, j]`` for the element at flat position ``flat`` of a tensor of ``shape``."""
    pos = []
    for d in reversed(tuple(shape)):
        pos.append(flat % d)
        flat //= d
    return "indices" if not pos else f"indices[{', '.join(map(str, reversed(pos)))}]"


def _oob(op_name: str, value: int, axis: int, size: int, where: str, count: int = 1) -> IndexOutOfRangeError:
    valid = f"valid indices are in [{-size}, {size - 1}]" if size else "the axis is empty"
    more = f"; {count} indices are out of range" if count > 1 else ""
    return IndexOutOfRangeError(f"{op_name}: index {value} along axis {axis} is out of range for size {size} "
                                f"({where}; {valid}{more})")


def _check_indices(op_name: str, indices: torch.Tensor, size: int, axis: int) -> int | None:
    """Raise IndexOutOfRangeError when an element of ``indices`` lies outside ``[-size, size)``;
    else the smallest index (None where not checked: CUDA indices are left to torch's kernel,
    which asserts on them (module docstring), and no indices)."""
    if indices.numel() == 0 or indices.device.type == "cuda":
        return None
    if indices.dim():
        lo, hi = (int(v) for v in torch.aminmax(indices))
    else:
        lo = hi = int(indices.item())
    if lo >= -size and hi < size:
        return lo
    # the error path: find the first offending element for the message
    bad = ((indices < -size) | (indices >= size)).reshape(-1)
    where = torch.nonzero(bad).reshape(-1)
    first = int(where[0])
    raise _oob(op_name, int(indices.reshape(-1)[first]), axis, size, _position(first, indices.shape),
               where.numel())


def _check_nd(op_name: str, idx: torch.Tensor, dims: tuple, first_axis: int, shape) -> torch.Tensor | None:
    """Per-axis bounds of the (k, m) int64 ``idx`` of GatherND / ScatterND: column j indexes axis
    ``first_axis + j`` of size ``dims[j]``. ``shape`` is the indices' own shape (for the message).
    On the CPU: one aminmax over the columns, IndexOutOfRangeError naming the first bad index; None.
    On CUDA nothing is read back: the (k,) mask of rows with an index out of range (the caller
    sends those rows past the end, see the module docstring)."""
    if idx.numel() == 0:
        return None
    if idx.is_cuda:
        return bad_rows(idx, dims)
    lo, hi = torch.aminmax(idx, dim=0)
    lows, highs = torch.stack((lo, hi)).tolist()
    if all(-d <= a and b < d for a, b, d in zip(lows, highs, dims)):
        return None
    limits = torch.tensor(dims, dtype=torch.int64)
    bad = ((idx < -limits) | (idx >= limits)).reshape(-1)
    where = torch.nonzero(bad).reshape(-1)
    first = int(where[0])
    m = len(dims)
    j = first % m
    raise _oob(op_name, int(idx.reshape(-1)[first]), first_axis + j, dims[j], _position(first, shape),
               where.numel())


def bad_rows(idx: torch.Tensor, dims: tuple) -> torch.Tensor:
    """The (k,) mask of the rows of ``idx`` (k, m) with an index outside its axis's range, made
    where ``idx`` is; compared with the sizes as numbers (no copy of them to the device)."""
    bad = None
    for j, d in enumerate(dims):
        col = idx[:, j]
        out = (col < -d) | (col >= d)
        bad = out if bad is None else bad | out
    return bad


def _linear(idx: torch.Tensor, dims: tuple, bad: torch.Tensor | None) -> torch.Tensor:
    """The linear index over ``dims`` of each row of ``idx`` [..., m]; rows marked ``bad`` (CUDA)
    get ``prod(dims)``, one past the end, which torch's index kernels refuse on the device."""
    lin = torch.zeros(idx.shape[:-1], dtype=torch.int64, device=idx.device)
    for j, d in enumerate(dims):
        ij = idx[..., j]
        lin = lin * d + torch.where(ij < 0, ij + d, ij)
    if bad is not None:
        lin = torch.where(bad.reshape(lin.shape), prod(dims), lin)
    return lin


# ---- Gather -------------------------------------------------------------------------------------
def _gather_infer(shapes, values, *, axis=0):
    s, q = shapes[0], shapes[1]
    a = norm_axis(axis, len(s))
    return [tuple(s[:a]) + tuple(q) + tuple(s[a + 1:])]


@op("Gather", (1, 11, 13), infer=_gather_infer, shape_op=True)
def _gather(x, indices, *, axis=0, out=None):
    a = norm_axis(axis, x.dim())
    lo = _check_indices("Gather", indices, x.shape[a], a)
    if lo is not None and lo >= 0 and indices.dtype in (torch.int64, torch.int32):
        flat = indices.reshape(-1)  # no negative index to wrap: index_select takes them as they are
    else:
        flat = _norm_index(indices, x.shape[a]).reshape(-1)
    if flat.device != x.device:
        flat = flat.to(x.device)
    mid = tuple(x.shape[:a]) + (flat.numel(),) + tuple(x.shape[a + 1:])
    shape = tuple(x.shape[:a]) + tuple(indices.shape) + tuple(x.shape[a + 1:])
    if out is None:
        return torch.index_select(x, a, flat).reshape(shape)
    torch.index_select(x, a, flat, out=out.view(mid))
    return out


@op("GatherElements", (11, 13), infer=lambda shapes, values, axis=0: [shapes[1]])
def _gather_elements(x, indices, *, axis=0, out=None):
    a = norm_axis(axis, x.dim())
    _check_indices("GatherElements", indices, x.shape[a], a)
    idx = _norm_index(indices, x.shape[a])
    return torch.gather(x, a, idx) if out is None else torch.gather(x, a, idx, out=out)


def _gather_nd_infer(shapes, values, *, batch_dims=0):
    s, q = shapes[0], shapes[1]
    m = q[-1]
    if not isinstance(m, int):
        raise ValueError("GatherND: last indices dim unknown")
    if batch_dims + m > len(s):
        raise ShapeError(f"GatherND: indices of depth {m} with batch_dims {batch_dims} exceed "
                         f"data rank {len(s)}")
    return [tuple(q[:-1]) + tuple(s[batch_dims + m:])]


@op("GatherND", (11, 12, 13), infer=_gather_nd_infer)
def _gather_nd(x, indices, *, batch_dims=0, out=None):
    b = batch_dims
    m = indices.shape[-1]
    bshape = tuple(x.shape[:b])
    nb = prod(bshape)
    idx_dims = tuple(x.shape[b:b + m])
    rest = tuple(x.shape[b + m:])
    r = None
    if x.device.type == "cpu" and indices.device.type == "cpu" and 0 < indices.numel() <= SMALL_ND:
        r = _gather_nd_small(x, indices, nb, idx_dims, rest)
    if r is None:
        # linear index over the m indexed dims, per batch entry: each checked against its own axis
        # first (a linear index cannot tell [0, 5] from [1, 1] of a 3x4 tensor)
        idx = indices.to(torch.int64).reshape(-1, m)
        bad = _check_nd("GatherND", idx, idx_dims, b, indices.shape)
        if bad is not None:
            bad = bad.to(x.device)
        lin = _linear(idx.to(x.device).reshape(nb, -1, m), idx_dims, bad)
        data = x.reshape(nb, prod(idx_dims), *rest)
        r = data[torch.arange(nb, device=x.device).unsqueeze(1), lin]  # (nb, k, *rest)
    shape = tuple(indices.shape[:-1]) + rest
    if out is None or r.numel() == 0:  # (no element: the result as it is, whatever buffer was given)
        return r.reshape(shape)
    out.view(r.shape).copy_(r)
    return out


# GatherND's CPU indices up to this many elements are checked and made linear in numpy (``_gather_nd_small``)
SMALL_ND = 1 << 16


def _gather_nd_small(x: torch.Tensor, indices: torch.Tensor, nb: int, idx_dims: tuple, rest: tuple):
    """GatherND of CPU tensors with few indices: the bounds checked and the linear index over the
    batch and indexed dims made in numpy, one index_select: ~5 numpy calls and one torch kernel where
    the general path takes ~15 torch calls and advanced indexing (~65-130 us a call on the 2-core EPYC,
    a YOLO head's two GatherND ~25% of its call). None where an index is out of range: the general
    path raises the error that names it."""
    m = len(idx_dims)
    idx = indices.numpy().reshape(nb, -1, m).astype(np.int64, copy=False)
    dims = np.asarray(idx_dims, dtype=np.int64)
    if ((idx < -dims) | (idx >= dims)).any():
        return None
    strides, size = [], 1  # row-major over the indexed dims
    for d in reversed(idx_dims):
        strides.append(size)
        size *= d
    lin = (idx % dims) @ np.asarray(strides[::-1], dtype=np.int64)  # (% wraps a negative index)
    if nb > 1:
        lin += np.arange(0, nb * size, size, dtype=np.int64)[:, None]
    data = x.reshape(nb * size, *rest)
    return torch.index_select(data, 0, torch.from_numpy(lin.reshape(-1))).view(nb, lin.shape[1], *rest)


# ---- Scatter ------------------------------------------------------------------------------------
_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_elements(x, indices, updates, *, axis=0, reduction="none", out=None):
    return _scatter_elements_impl("ScatterElements", x, indices, updates, axis, reduction, out)


def _scatter_elements_impl(op_name, x, indices, updates, axis, reduction, out):
    a = norm_axis(axis, x.dim())
    _check_indices(op_name, indices, x.shape[a], a)
    idx = _norm_index(indices, x.shape[a])
    r = x.clone() if out is None else out.copy_(x)
    if reduction == "none":
        r.scatter_(a, idx, updates)
    elif reduction in _REDUCE:
        r.scatter_reduce_(a, idx, updates, _REDUCE[reduction], include_self=True)
    else:
        raise ValueError(f"{op_name}: unknown reduction {reduction!r}")
    return r


op("ScatterElements", (11, 13, 16, 18), infer=same_as_first)(_scatter_elements)


@op("Scatter", 9, infer=same_as_first)
def _scatter(x, indices, updates, *, axis=0, out=None):
    return _scatter_elements_impl("Scatter", x, indices, updates, axis, "none", out)


def _scatter_nd(x, indices, updates, *, reduction="none", out=None):
    m = indices.shape[-1]
    idx_dims = tuple(x.shape[:m])
    rest = tuple(x.shape[m:])
    idx = indices.to(torch.int64).reshape(-1, m)
    bad = _check_nd("ScatterND", idx, idx_dims, 0, indices.shape)
    if bad is not None:
        bad = bad.to(x.device)
    lin = _linear(idx.to(x.device), idx_dims, bad)
    r = x.clone() if out is None else out.copy_(x)
    flat = r.view(prod(idx_dims), *rest)
    upd = updates.reshape(lin.numel(), *rest)
    if reduction == "none":
        flat.index_copy_(0, lin, upd)
    elif reduction == "add":
        flat.index_add_(0, lin, upd)
    elif reduction in _REDUCE:
        # scatter_reduce_ wants an index as large as the source: repeat each row's index
        full = lin.reshape(-1, *[1] * len(rest)).expand(upd.shape)
        flat.scatter_reduce_(0, full, upd, _REDUCE[reduction], include_self=True)
    else:
        raise ValueError(f"ScatterND: unknown reduction {reduction!r}")
    return r


op("ScatterND", (11, 13, 16, 18), infer=same_as_first)(_scatter_nd)


# ---- OneHot -------------------------------------------------------------------------------------
def _depth(v) -> int:
    """The depth input as a positive int. A depth of a float type must be a whole number: the spec
    says "cast to int64", which onnxruntime does by truncating (2.5 -> 2) and the reference
    evaluator by rounding up (2.5 -> 3); with no agreed answer, a fractional depth is refused."""
    raw = first_item(v)
    if isinstance(raw, float):
        if not math.isfinite(raw) or raw != math.floor(raw):
            raise ShapeError(f"OneHot: depth must be a positive whole number, got {raw}")
    d = int(raw)
    if d < 1:
        raise ShapeError(f"OneHot: depth must be positive, got {d}")
    return d


def _onehot_infer(shapes, values, *, axis=-1):
    if values[1] is None:
        raise ValueError("OneHot: depth unknown")
    s = list(shapes[0])
    s.insert(norm_axis(axis, len(s) + 1), _depth(values[1]))
    return [tuple(s)]


@op("OneHot", (9, 11, 28), infer=_onehot_infer, shape_deps=(1,))
def _onehot(indices, depth, values, *, axis=-1, out=None):
    d = _depth(depth)
    a = norm_axis(axis, indices.dim() + 1)
    idx = indices.to(device=values.device)
    if idx.dtype.is_floating_point:
        idx = idx.trunc()
    idx = idx.to(torch.int64)
    idx = torch.where(idx < 0, idx + d, idx)  # out-of-range indices match nothing: all off
    hot = idx.unsqueeze(-1) == torch.arange(d, device=values.device)
    off, on = values.reshape(-1)[0], values.reshape(-1)[1]
    r = torch.where(hot, on, off).movedim(-1, a)
    return r.contiguous() if out is None else out.copy_(r)


# ---- TopK ---------------------------------------------------------------------------------------
def _check_k(k, s, a: int, axis) -> None:
    """k must be in [0, size of the axis] (ShapeError, as every bad size: the interpreter checks it
    in the shape function, the compiled path in the kernel when k comes from data)."""
    if isinstance(s[a], int) and not 0 <= k <= s[a]:
        raise ShapeError(f"TopK: k={k} is out of range [0, {s[a]}] for axis {axis} of shape {tuple(s)}")


def _topk_shape(s, k, axis):
    a = norm_axis(axis, len(s))
    _check_k(k, s, a, axis)
    t = tuple(k if i == a else d for i, d in enumerate(s))
    return [t, t]


_UNSIGNED_WIDE = (torch.uint16, torch.uint32, torch.uint64)


def _topk_kernel(x, k, axis, largest, out):
    a = norm_axis(axis, x.dim())
    _check_k(k, tuple(x.shape), a, axis)
    # a stable sort keeps equal values in index order, which is the order ONNX asks for
    # (torch.topk does not promise any order among ties)
    if x.dtype in _UNSIGNED_WIDE:
        # torch has no sort kernel for these on CUDA: sort an int64 key of the same order and
        # read the values back through the indices
        _, idx = torch.sort(_ukey(x), dim=a, descending=bool(largest), stable=True)
        idx = idx.narrow(a, 0, k)
        vals = torch.gather(x.view(torch.int64) if x.dtype == torch.uint64 else x.to(torch.int64), a, idx)
        vals = vals.view(torch.uint64) if x.dtype == torch.uint64 else vals.to(x.dtype)
    else:
        vals, idx = torch.sort(x, dim=a, descending=bool(largest), stable=True)
        vals, idx = vals.narrow(a, 0, k), idx.narrow(a, 0, k)
    if out is None:
        return vals.contiguous(), idx.contiguous()
    ov, oi = out
    if ov is not None:
        ov.copy_(vals)
    if oi is not None:
        oi.copy_(idx)
    return ov, oi


@op("TopK", 1, infer=lambda shapes, values, k, axis=-1: _topk_shape(shapes[0], k, axis))
def _topk1(x, *, k, axis=-1, out=None):
    return _topk_kernel(x, k, axis, 1, out)


def _topk10_infer(shapes, values, *, axis=-1, largest=1, sorted=1):
    if values[1] is None:
        raise ValueError("TopK: k unknown")
    return _topk_shape(shapes[0], int_list(values[1])[0], axis)


@op("TopK", 10, infer=lambda shapes, values, axis=-1: _topk10_infer(shapes, values, axis=axis),
    shape_deps=(1,))
def _topk10(x, k, *, axis=-1, out=None):
    return _topk_kernel(x, int_list(k)[0], axis, 1, out)


@op("TopK", (11, 24), infer=_topk10_infer, shape_deps=(1,))
def _topk11(x, k, *, axis=-1, largest=1, sorted=1, out=None):
    # sorted=0 leaves the order unspecified; sorted output is one valid answer
    return _topk_kernel(x, int_list(k)[0], axis, largest, out)


# ---- ArgMax / ArgMin ----------------------------------------------------------------------------
def _arg_infer(shapes, values, *, axis=0, keepdims=1, select_last_index=0):
    s = shapes[0]
    a = norm_axis(axis, len(s))
    if keepdims:
        return [tuple(1 if i == a else d for i, d in enumerate(s))]
    return [tuple(d for i, d in enumerate(s) if i != a)]


def _arg(fn):
    def kernel(x, *, axis=0, keepdims=1, select_last_index=0, out=None):
        a = norm_axis(axis, x.dim())
        if select_last_index:
            # torch returns the first extreme: search the flipped axis and map back
            n = x.shape[a]
            r = fn(x.flip(a), a, keepdim=bool(keepdims))
            r = (n - 1) - r
            return r if out is None else out.copy_(r)
        return fn(x, a, keepdim=bool(keepdims)) if out is None else fn(x, a, keepdim=bool(keepdims), out=out)
    return kernel


for _name, _fn in (("ArgMax", torch.argmax), ("ArgMin", torch.argmin)):
    op(_name, (1, 11, 12, 13), infer=_arg_infer)(_arg(_fn))

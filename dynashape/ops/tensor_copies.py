"""Tensor layout ops that write a new tensor: Concat, Split, Expand, Tile, Pad, DepthToSpace,
SpaceToDepth; and Trilu, CumSum, EyeLike, ReverseSequence.

They write into the ``out`` buffer the runtime allocated from their shape function. The layout
ops that are views (Reshape, Transpose, Slice ...) are in ``tensor.py``.
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from .registry import op
from .shapes import broadcast, first_item, int_list, norm_axes, norm_axis, same_as_first
from .tensor import _emit, _opt_list, _static


# ---- Concat -------------------------------------------------------------------------------------
def _concat_infer(shapes, values, *, axis):
    shapes = [s for s in shapes if s is not None]
    rank = len(shapes[0])
    a = norm_axis(axis, rank)
    total = 0
    out = list(shapes[0])
    for s in shapes:
        if len(s) != rank:
            raise ShapeError(f"Concat: inputs of ranks {[len(t) for t in shapes]} differ")
        for i, (d, e) in enumerate(zip(out, s)):
            if i != a and _static(d) and _static(e) and d != e:
                raise ShapeError(f"Concat: shapes {shapes} differ outside axis {axis}")
            if i != a and not _static(d) and _static(e):
                out[i] = e
        total = total + s[a]
    out[a] = total
    return [tuple(out)]


@op("Concat", (4, 11, 13), infer=_concat_infer, shape_op=True)
def _concat(*xs, axis, out=None):
    xs = [x for x in xs if x is not None]
    a = norm_axis(axis, xs[0].dim())
    return torch.cat(xs, a) if out is None else torch.cat(xs, a, out=out)


# ---- Split --------------------------------------------------------------------------------------
def _split_sizes(dim, split, num_outputs) -> list:
    if split is not None:
        if _static(dim) and sum(split) != dim:
            raise ShapeError(f"Split: sizes {split} do not add up to dim {dim}")
        return list(split)
    if num_outputs is None:
        # Before opset 18 an equal split takes the count of the node's outputs, which neither the
        # kernel nor the shape function is told.
        raise ShapeError("Split without 'split' needs the number of outputs (attribute num_outputs, "
                         "opset 18); the node's output count is not available to the op")
    if not _static(dim):
        raise ValueError("Split: dynamic dim")
    # opset 18: ceil-sized chunks, the last one smaller when dim does not divide
    chunk = -(-dim // num_outputs)
    sizes = [min(chunk, max(dim - chunk * k, 0)) for k in range(num_outputs)]
    return sizes


def _split_infer_impl(s, axis, split, num_outputs):
    a = norm_axis(axis, len(s))
    sizes = _split_sizes(s[a], split, num_outputs)
    return [tuple(n if i == a else d for i, d in enumerate(s)) for n in sizes]


def _split_kernel(x, a, sizes, out):
    parts = torch.split(x, sizes, dim=a)
    if out is None:
        return tuple(p.clone() for p in parts)
    if isinstance(out, torch.Tensor):  # one part: its buffer comes alone (not a tuple of one)
        return out.copy_(parts[0])
    for o, p in zip(out, parts):
        if o is not None:
            o.copy_(p)
    return out


# Before opset 18 an equal split takes as many parts as the node has outputs: the compiler passes
# that count as ``_n_outputs`` (see compile/resolve_ops.py).
def _split2_infer(shapes, values, *, axis=0, split=None, _n_outputs=None):
    return _split_infer_impl(shapes[0], axis, split, None if split else _n_outputs)


@op("Split", (2, 11), infer=_split2_infer, shape_op=True)
def _split2(x, *, axis=0, split=None, _n_outputs=None, out=None):
    a = norm_axis(axis, x.dim())
    return _split_kernel(x, a, _split_sizes(x.shape[a], split, None if split else _n_outputs), out)


def _split13_infer(shapes, values, *, axis=0, num_outputs=None):
    split = None
    if len(shapes) > 1 and shapes[1] is not None:
        if values[1] is None:
            raise ValueError("Split: sizes unknown")
        split = int_list(values[1])
    return _split_infer_impl(shapes[0], axis, split, num_outputs)


@op("Split", 13, infer=lambda shapes, values, axis=0, _n_outputs=None: _split13_infer(
    shapes, values, axis=axis, num_outputs=None if len(shapes) > 1 and shapes[1] is not None else _n_outputs),
    shape_deps=(1,), shape_op=True)
def _split13(x, split=None, *, axis=0, _n_outputs=None, out=None):
    a = norm_axis(axis, x.dim())
    sizes = _opt_list(split)
    return _split_kernel(x, a, _split_sizes(x.shape[a], sizes, None if sizes else _n_outputs), out)


@op("Split", 18, infer=_split13_infer, shape_deps=(1,), shape_op=True)
def _split18(x, split=None, *, axis=0, num_outputs=None, out=None):
    a = norm_axis(axis, x.dim())
    sizes = _split_sizes(x.shape[a], _opt_list(split), num_outputs)
    return _split_kernel(x, a, sizes, out)


# ---- Expand / Tile ------------------------------------------------------------------------------
def _expand_infer(shapes, values):
    if values[1] is None:
        raise ValueError("Expand: shape unknown")
    target = int_list(values[1])
    for d in target:
        # a negative dim is no size (and torch's expand would read -1 as "keep this dim"); a
        # symbolic one is left to the shape program
        if type(d) is int and d < 0:
            raise ShapeError(f"Expand: negative dim {d} in shape {target}")
    return broadcast([shapes[0], tuple(target)])


@op("Expand", (8, 13), infer=_expand_infer, shape_deps=(1,), shape_op=True)
def _expand(x, shape, *, out=None):
    target = _expand_infer([tuple(x.shape), None], [None, shape])[0] if out is None else tuple(out.shape)
    xe = x.reshape((1,) * (len(target) - x.dim()) + tuple(x.shape)).expand(target)
    return xe.clone() if out is None else out.copy_(xe)


def _check_reps(reps: list, rank: int) -> None:
    if len(reps) != rank:
        raise ShapeError(f"Tile: {len(reps)} repeats for an input of rank {rank}")
    if any(r < 0 for r in reps):
        raise ShapeError(f"Tile: negative repeats {reps}")


def _tile_infer(shapes, values):
    if values[1] is None:
        raise ValueError("Tile: repeats unknown")
    reps = int_list(values[1])
    s = shapes[0]
    _check_reps(reps, len(s))
    return [tuple(d * r for d, r in zip(s, reps))]


@op("Tile", (6, 13), infer=_tile_infer, shape_deps=(1,), shape_op=True)
def _tile(x, repeats, *, out=None):
    reps = int_list(repeats)
    if out is None:
        # the kernel allocates: check the repeats here too (a caller may not have run the shape function)
        _check_reps(reps, x.dim())
        return x.repeat(reps)
    # write the tiles straight into out: view it as (r0, d0, r1, d1, ...) and broadcast x over it
    inter = [v for r, d in zip(reps, x.shape) for v in (r, d)]
    src = x.reshape([v for d in x.shape for v in (1, d)])
    out.view(inter).copy_(src.expand(inter))
    return out


# ---- Pad ----------------------------------------------------------------------------------------
def _pad_full(rank, pads, axes):
    """Pads as (begin, end) per axis of the input, from ONNX's [b0, b1, ..., e0, e1, ...]."""
    axes = list(range(rank)) if axes is None else norm_axes(axes, rank)
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad: {len(pads)} pads for {len(axes)} axes")
    full = [(0, 0)] * rank
    n = len(axes)
    for k, a in enumerate(axes):
        full[a] = (pads[k], pads[k + n])
    return full


def _pad_shape(s, full):
    out = []
    for a, (d, (b, e)) in enumerate(zip(s, full)):
        n = d + b + e if b + e >= 0 else d - (-b - e)
        if _static(n) and n < 0:
            raise ShapeError(f"Pad: pads ({b}, {e}) on axis {a} crop more than its size {d} (output size {n}; "
                             f"pads {full}, input shape {tuple(s)})")
        out.append(n)
    return tuple(out)


def _pad_index(d: int, b: int, e: int, mode: str, device) -> torch.Tensor:
    """Source index of each output position along one axis, for reflect/edge/wrap."""
    i = torch.arange(-b, d + e, device=device)
    if mode == "edge":
        return i.clamp(0, d - 1)
    if mode == "wrap":
        return i.remainder(d)
    if d == 1:  # reflect of one element: nothing to mirror
        return torch.zeros_like(i)
    period = 2 * (d - 1)
    m = i.remainder(period)
    return torch.where(m < d, m, period - m)


def _pad_kernel(x, full, mode, value, out):
    shape = _pad_shape(tuple(x.shape), full)  # pads from data: a negative size is a ShapeError
    if mode == "constant":
        if out is None:
            out = torch.empty(shape, dtype=x.dtype, device=x.device)
        out.fill_(value)
        src, dst = [], []
        for d, (b, e) in zip(x.shape, full):
            # negative pads crop the input; positive ones leave room in out
            src.append(slice(max(-b, 0), d - max(-e, 0)))
            dst.append(slice(max(b, 0), max(b, 0) + max(d - max(-b, 0) - max(-e, 0), 0)))
        if all(s.stop > s.start for s in src):
            out[tuple(dst)] = x[tuple(src)]
        return out
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"Pad: unknown mode {mode!r}")
    r = x
    for a, (b, e) in enumerate(full):
        if b == 0 and e == 0:
            continue
        d = r.shape[a]
        if b < 0 or e < 0:  # crop first, then pad what is left from the cropped data
            r = r.narrow(a, max(-b, 0), d - max(-b, 0) - max(-e, 0))
            b, e, d = max(b, 0), max(e, 0), r.shape[a]
        if b or e:
            if d == 0:
                raise ShapeError(f"Pad: mode {mode} cannot pad an empty axis {a}")
            r = r.index_select(a, _pad_index(d, b, e, mode, x.device))
    return _emit(r, out)


def _pad2_infer(shapes, values, *, pads, mode="constant", value=0.0):
    return [_pad_shape(shapes[0], _pad_full(len(shapes[0]), pads, None))]


@op("Pad", 2, infer=_pad2_infer)
def _pad2(x, *, pads, mode="constant", value=0.0, out=None):
    return _pad_kernel(x, _pad_full(x.dim(), pads, None), mode, value, out)


def _pad11_infer(shapes, values, *, mode="constant"):
    if values[1] is None:
        raise ValueError("Pad: pads unknown")
    axes = None
    if len(shapes) > 3 and shapes[3] is not None:
        if values[3] is None:
            raise ValueError("Pad: axes unknown")
        axes = int_list(values[3])
    return [_pad_shape(shapes[0], _pad_full(len(shapes[0]), int_list(values[1]), axes))]


def _pad11(x, pads, constant_value=None, axes=None, *, mode="constant", out=None):
    full = _pad_full(x.dim(), int_list(pads), _opt_list(axes))
    value = 0
    if constant_value is not None and constant_value.numel():
        value = first_item(constant_value)
    return _pad_kernel(x, full, mode, value, out)


op("Pad", (11, 13, 18, 19, 21, 23, 24, 25), infer=_pad11_infer, shape_deps=(1, 3))(_pad11)


# ---- DepthToSpace / SpaceToDepth ----------------------------------------------------------------
def _d2s_infer(shapes, values, *, blocksize, mode="DCR"):
    n, c, h, w = shapes[0]
    b = blocksize
    if _static(c) and c % (b * b):
        raise ShapeError(f"DepthToSpace: channels {c} not divisible by blocksize^2 = {b * b}")
    return [(n, c // (b * b), h * b, w * b)]


@op("DepthToSpace", (1, 11, 13, 28), infer=_d2s_infer)
def _d2s(x, *, blocksize, mode="DCR", out=None):
    n, c, h, w = x.shape
    b = blocksize
    c2 = c // (b * b)
    if mode == "DCR":
        r = x.reshape(n, b, b, c2, h, w).permute(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        r = x.reshape(n, c2, b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: unknown mode {mode!r}")
    if out is None:
        return r.reshape(n, c2, h * b, w * b)
    out.view(n, c2, h, b, w, b).copy_(r)
    return out


def _s2d_infer(shapes, values, *, blocksize, mode="DCR"):
    n, c, h, w = shapes[0]
    b = blocksize
    if (_static(h) and h % b) or (_static(w) and w % b):
        raise ShapeError(f"SpaceToDepth: spatial dims {h}x{w} not divisible by blocksize {b}")
    return [(n, c * b * b, h // b, w // b)]


@op("SpaceToDepth", (1, 13, 28), infer=_s2d_infer)
def _s2d(x, *, blocksize, mode="DCR", out=None):
    # mode arrived in opset 28; DCR is the layout of the earlier versions
    n, c, h, w = x.shape
    b = blocksize
    r = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":  # output channel (bh * b + bw) * c + ci
        r, mid = r.permute(0, 3, 5, 1, 2, 4), (n, b, b, c, h // b, w // b)
    elif mode == "CRD":  # output channel (ci * b + bh) * b + bw
        r, mid = r.permute(0, 1, 3, 5, 2, 4), (n, c, b, b, h // b, w // b)
    else:
        raise ValueError(f"SpaceToDepth: unknown mode {mode!r}")
    if out is None:
        return r.reshape(n, c * b * b, h // b, w // b)
    out.view(mid).copy_(r)
    return out


# ---- Trilu, CumSum, EyeLike, ReverseSequence ----------------------------------------------------
@op("Trilu", 14, infer=same_as_first)
def _trilu(x, k=None, *, upper=1, out=None):
    kk = 0 if k is None else int(first_item(k))
    f = torch.triu if upper else torch.tril
    return f(x, kk) if out is None else f(x, kk, out=out)


# the axis is read as a number on the host: given as a host tensor (shape_deps), never read back
@op("CumSum", (11, 14), infer=same_as_first, shape_deps=(1,))
def _cumsum(x, axis, *, exclusive=0, reverse=0, out=None):
    a = norm_axis(int(first_item(axis)), x.dim())
    src = x.flip(a) if reverse else x
    n = x.shape[a]
    if exclusive:
        r = torch.zeros_like(src)
        if n > 1:
            # the sum of the elements strictly before each position
            torch.cumsum(src.narrow(a, 0, n - 1), a, dtype=x.dtype, out=r.narrow(a, 1, n - 1))
    else:
        if out is not None and not reverse:
            return torch.cumsum(src, a, dtype=x.dtype, out=out)
        r = torch.cumsum(src, a, dtype=x.dtype)
    if reverse:
        r = r.flip(a)
    return _emit(r, out)


def _eyelike_infer(shapes, values, *, dtype=None, k=0):
    if len(shapes[0]) != 2:
        raise ShapeError(f"EyeLike: input must be 2-D, got shape {shapes[0]}")
    return [shapes[0]]


@op("EyeLike", (9, 22), infer=_eyelike_infer)
def _eyelike(x, *, dtype=None, k=0, out=None):
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype if dtype is None else torch_dtype(dtype), device=x.device)
    out.zero_()
    n, m = out.shape
    if -n < k < m:
        out.diagonal(k).fill_(1)
    return out


@op("ReverseSequence", (10, 28), infer=same_as_first)
def _reverse_sequence(x, sequence_lens, *, batch_axis=1, time_axis=0, out=None):
    t, b = x.shape[time_axis], x.shape[batch_axis]
    lens = sequence_lens.to(device=x.device, dtype=torch.int64).reshape(1, b)
    pos = torch.arange(t, device=x.device).reshape(t, 1)
    # position p of a sequence of length L reads L-1-p; positions past L stay in place
    idx = torch.where(pos < lens, lens - 1 - pos, pos)  # (t, b)
    if time_axis > batch_axis:
        idx = idx.t()
    view = [1] * x.dim()
    view[time_axis], view[batch_axis] = t, b
    idx = idx.reshape(view).expand(x.shape)
    return torch.gather(x, time_axis, idx) if out is None else torch.gather(x, time_axis, idx, out=out)

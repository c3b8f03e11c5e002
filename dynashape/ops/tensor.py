"""Tensor layout ops: Reshape, Squeeze, Transpose, Concat, Split, Slice, Pad, Tile, CumSum ...

Ops that only re-describe memory (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Slice) are
views: they return a tensor aliasing their input and get no buffer. The others write into the
``out`` buffer the runtime allocated from their shape function.
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from ..shape import Dimension
from .registry import op
from .shapes import broadcast, first_item, int_list, norm_axes, norm_axis, prod, same_as_first

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

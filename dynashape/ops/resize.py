"""Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9) in plain torch ops.

Resampling is separable, so an N-d resize is a chain of 1-d resizes, one per resized axis. For
one axis, a small table is built on the host: per output position the source coordinate
(coordinate_transformation_mode), then a few taps (neighbour indices, clamped to the edge as the
spec's edge padding does) and their weights (nearest: one tap of weight 1; linear: 2; cubic: 4;
antialias stretches the filter by 1/scale when downscaling). The axis is then resampled with one
index_select per tap and a weighted sum (a lerp for plain linear). Source coordinates are
computed in float32 in onnxruntime's order of operations (so halfway cases of the nearest modes
round as there), and the weights from them in float64; the tables are only output-length long.
They are built on the host because CUDA divides by a scalar as a multiplication by its
reciprocal, which moves halfway cases; they are cached on the input's device per geometry.

Older semantics: Upsample and Resize-10 use the asymmetric transform, and their nearest mode
rounds down when upsampling and up when downsampling (the behaviour of onnxruntime's legacy path).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import ShapeError
from .registry import op
from .shapes import dyn, int_list, norm_axes

_CTM_11 = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
           "tf_crop_and_resize")
_CTM_18 = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize")
_CTM_19 = _CTM_18 + ("half_pixel_symmetric",)
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# ---- the output size ----------------------------------------------------------------------------
def _present(v) -> bool:
    """An optional input given with data (opset 11 passes an empty tensor for 'absent')."""
    return v is not None and v.numel() > 0


def _targets(in_shape, scales, sizes, axes, policy: str, what: str):
    """Per resized axis: (axis, output size, scale). ``scales``/``sizes`` are lists or None;
    in_shape may hold Dimensions at compile time, whose output size is then dynamic (None)."""
    rank = len(in_shape)
    axes = norm_axes(axes, rank) if axes else list(range(rank))
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{what}: repeated axis in axes={axes}")
    if (scales is None) == (sizes is None):
        raise ShapeError(f"{what}: exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ShapeError(f"{what}: {len(given)} {'scales' if scales is not None else 'sizes'} for "
                         f"{len(axes)} axes of an input of rank {rank}")
    if scales is not None:
        out = []
        for a, s in zip(axes, scales):
            if not s > 0:
                raise ShapeError(f"{what}: scales must be > 0, got {scales}")
            d = in_shape[a]
            # floor(in * scale) with the float32 scale widened to float64, as ONNX's shape inference
            # and reference do (onnxruntime multiplies in float32 and can get one more)
            # (math.floor, not int(math.floor(...)): a symbolic dim stays symbolic)
            out.append((a, math.floor(d * s) if isinstance(d, int) else None, float(s)))
        return out
    if any(s < 0 for s in sizes):
        raise ShapeError(f"{what}: negative sizes {sizes}")
    if policy == "stretch":
        return [(a, int(s), s / in_shape[a] if isinstance(in_shape[a], int) and in_shape[a] else None)
                for a, s in zip(axes, sizes)]
    if policy not in ("not_larger", "not_smaller"):
        raise ShapeError(f"{what}: unknown keep_aspect_ratio_policy {policy!r}")
    if not all(isinstance(in_shape[a], int) and in_shape[a] for a in axes):
        return [(a, None, None) for a in axes]
    ratios = [s / in_shape[a] for a, s in zip(axes, sizes)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    # one common scale keeps the aspect ratio; sizes round half up
    return [(a, int(math.floor(scale * in_shape[a] + 0.5)), scale) for a in axes]


def _out_shape(in_shape, targets):
    shape = list(in_shape)
    for a, size, _ in targets:
        shape[a] = dyn() if size is None else size
    return tuple(shape)


def _resize_infer(shapes, values, *, axes=None, keep_aspect_ratio_policy="stretch", **_attrs):
    values = list(values) + [None] * (4 - len(values))
    scales = [float(v) for v in values[2].reshape(-1).tolist()] if _present(values[2]) else None
    sizes = int_list(values[3]) if _present(values[3]) else None
    return [_out_shape(shapes[0], _targets(shapes[0], scales, sizes, axes, keep_aspect_ratio_policy, "Resize"))]


def _scales_infer(shapes, values, **_attrs):
    """Upsample-9 and Resize-10: scales is input 1."""
    scales = [float(v) for v in values[1].reshape(-1).tolist()]
    return [_out_shape(shapes[0], _targets(shapes[0], scales, None, None, "stretch", "Resize"))]


# ---- one axis -----------------------------------------------------------------------------------
def _source_coords(y, in_len: int, out_len: int, scale: float, ctm: str, roi):
    """Source coordinate of each output position ``y`` (a float32 arange).

    float32 arithmetic in onnxruntime's order of operations: where a coordinate lands exactly
    halfway, or on the input's last position, the rounding then agrees with onnxruntime. The
    fractional output length ``scale * in_len`` is the spec's (the reference's) for every mode;
    onnxruntime uses the integer one for align_corners. ``roi``: (start, end) floats.
    """
    f = np.float32
    s = float(f(scale))
    width = f(scale) * f(in_len)
    if ctm == "half_pixel":
        return (y + 0.5) / s - 0.5
    if ctm == "half_pixel_symmetric":
        # centre the output on the input when the output length was rounded down
        offset = float(f(in_len) / f(2) * (f(1) - f(out_len) / width))
        return offset + (y + 0.5) / s - 0.5
    if ctm == "pytorch_half_pixel":  # the integer length here, as the spec and onnxruntime
        return (y + 0.5) / s - 0.5 if out_len > 1 else torch.zeros_like(y)
    if ctm == "align_corners":
        return y * float(in_len - 1) / float(width - 1) if width > 1 else torch.zeros_like(y)
    if ctm == "asymmetric":
        return y / s
    if ctm == "tf_half_pixel_for_nn":
        return (y + 0.5) / s
    if ctm == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_len > 1:
            return float(start * f(in_len - 1)) + y * float(end - start) * float(in_len - 1) / float(width - 1)
        return torch.full_like(y, float(f(0.5) * (start + end) * f(in_len - 1)))
    raise ShapeError(f"Resize: unknown coordinate_transformation_mode {ctm!r}")


def _nearest_index(x, mode: str, scale: float):
    if mode == "round_prefer_floor":
        return torch.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return torch.floor(x + 0.5)
    if mode == "floor":
        return torch.floor(x)
    if mode == "ceil":
        return torch.ceil(x)
    if mode == "simple":  # Upsample / Resize-10
        return torch.ceil(x) if scale < 1 else torch.floor(x)
    raise ShapeError(f"Resize: unknown nearest_mode {mode!r}")


def _keys(d, a: float):
    """The cubic convolution kernel of Keys (1981) with coefficient a."""
    d = d.abs()
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))


def _axis_table(in_len: int, out_len: int, scale: float, *, mode, ctm, nearest_mode, cubic_a, exclude_outside,
                antialias, roi):
    """(indices [out, taps], weights [out, taps] or None for nearest, extrapolated [out] or None)."""
    y = torch.arange(out_len, dtype=torch.float32)
    x = _source_coords(y, in_len, out_len, scale, ctm, roi)
    outside = (x < 0) | (x > in_len - 1) if ctm == "tf_crop_and_resize" else None
    x = x.to(torch.float64)  # exact; the weights are then computed in float64
    if mode == "nearest":
        idx = _nearest_index(x, nearest_mode, scale).clamp(0, in_len - 1).long()
        return idx[:, None], None, outside
    radius = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if antialias else 1.0  # antialias widens the filter when downscaling
    first = math.floor(-radius / stretch) + 1
    k = torch.arange(first, 2 - first, dtype=torch.float64)
    # base: the tap left of x, and x itself when x is an integer (ratio in (0, 1]), which puts
    # the tap window where the spec's "nearest neighbours, ties to the left" puts it
    base = torch.ceil(x) - 1
    d = (k[None, :] - (x - base)[:, None]) * stretch
    w = (1 - d.abs()).clamp(min=0) if mode == "linear" else _keys(d, cubic_a)
    if antialias:
        w = w / w.sum(1, keepdim=True)
    idx = (base[:, None] + k[None, :]).long()
    if exclude_outside:
        w = torch.where((idx >= 0) & (idx < in_len), w, torch.zeros_like(w))
        total = w.sum(1, keepdim=True)
        w = w / torch.where(total == 0, torch.ones_like(total), total)
    return idx.clamp(0, in_len - 1), w, outside


_TABLES: dict[tuple, tuple] = {}  # (axis geometry, attributes, device, dtype) -> tables on the device


def _device_table(in_len: int, out_len: int, scale: float, device, dtype, **how):
    """_axis_table's tensors on ``device`` (weights in ``dtype``), cached: a session resizing
    the same shapes again reuses them, with no host work nor copy. A fourth entry holds the
    second tap's weights when the table is two taps whose weights sum to 1 (plain linear): the
    axis is then one lerp, about twice as fast on a GPU as the general weighted sum."""
    key = (in_len, out_len, scale, device, dtype, *sorted(how.items()))
    hit = _TABLES.get(key)
    if hit is None:
        idx, w, outside = _axis_table(in_len, out_len, scale, **how)
        lerp = None
        if w is not None and w.shape[1] == 2 and bool(((w.sum(1) - 1).abs() < 1e-12).all()):
            lerp = w[:, 1].to(device=device, dtype=dtype)
        hit = (idx.to(device), None if w is None else w.to(device=device, dtype=dtype),
               None if outside is None else outside.to(device), lerp)
        if len(_TABLES) >= 512:
            _TABLES.clear()
        _TABLES[key] = hit
    return hit


_ONE_GATHER = 1 << 24  # elements: up to this, all taps of an axis are gathered at once


def _resample_axis(x, axis: int, idx, w, lerp):
    if w is None:
        return x.index_select(axis, idx[:, 0])
    shape = [1] * x.dim()
    shape[axis] = idx.shape[0]
    if lerp is not None:
        return torch.lerp(x.index_select(axis, idx[:, 0]), x.index_select(axis, idx[:, 1]), lerp.reshape(shape))
    out_len, taps = idx.shape
    if x.numel() // max(x.shape[axis], 1) * out_len * taps <= _ONE_GATHER:
        # every tap in one gather, then one weighted sum over the tap axis: few launches
        g = x.index_select(axis, idx.reshape(-1)).unflatten(axis, (out_len, taps))
        wshape = [1] * g.dim()
        wshape[axis], wshape[axis + 1] = out_len, taps
        return (g * w.reshape(wshape)).sum(axis + 1)
    r = x.index_select(axis, idx[:, 0]).mul_(w[:, 0].reshape(shape))
    for t in range(1, taps):  # one tap at a time: memory stays at two outputs' worth
        r.addcmul_(x.index_select(axis, idx[:, t]), w[:, t].reshape(shape))
    return r


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # integers are rounded at the end: float64 keeps sums that should land on .5 exactly there
    if dtype == torch.float64 or not dtype.is_floating_point:
        return torch.float64
    return torch.float32


def _nearest_upsample(x, targets, *, ctm, nearest_mode):
    """Nearest upsampling of the trailing (spatial) axes by powers of two (an FPN's x2), when the
    spec's source index of every output position is ``k // factor``: torch's own nearest
    interpolation computes exactly that (the scale 1 / 2^n is exact in floats), in one kernel that
    keeps a channels-last tensor channels-last. Anything else: None (the general tables serve)."""
    if x.dim() < 3 or x.dim() > 5 or x.numel() == 0 or not x.dtype.is_floating_point:
        return None
    spatial = set(range(2, x.dim()))
    resized = {a for a, size, _ in targets if size != x.shape[a]}
    if not resized or not resized <= spatial:
        return None
    sizes = list(x.shape[2:])
    for a, size, scale in targets:
        in_len = x.shape[a]
        if size == in_len:
            continue
        f = size // in_len if in_len else 0
        if f < 2 or f * in_len != size or f & (f - 1):
            return None
        idx, _, _, _ = _device_table(in_len, size, scale, torch.device("cpu"), torch.float32, mode="nearest",
                                     ctm=ctm, nearest_mode=nearest_mode, cubic_a=-0.75, exclude_outside=0,
                                     antialias=0, roi=None)
        if not torch.equal(idx[:, 0], torch.arange(size) // f):
            return None
        sizes[a - 2] = size
    return torch.nn.functional.interpolate(x, size=tuple(sizes), mode="nearest")


def _resample(x, targets, *, mode, ctm, nearest_mode="round_prefer_floor", cubic_a=-0.75, exclude_outside=0,
              antialias=0, extrapolation_value=0.0, roi=None):
    if mode not in ("nearest", "linear", "cubic"):
        raise ShapeError(f"Resize: unknown mode {mode!r}")
    if mode == "nearest" and ctm != "tf_crop_and_resize":
        fast = _nearest_upsample(x, targets, ctm=ctm, nearest_mode=nearest_mode)
        if fast is not None:
            return fast
    orig = x.dtype
    if mode != "nearest" or ctm == "tf_crop_and_resize":
        if orig == torch.bool:
            raise NotImplementedError(f"Resize of a bool tensor in mode {mode!r} / {ctm!r}")
        x = x.to(_compute_dtype(orig))
    # downscaled axes first: every later axis then works on less data
    for a, size, scale in sorted(targets, key=lambda t: t[1] / max(x.shape[t[0]], 1)):
        in_len = x.shape[a]
        lo_hi = None if roi is None else (roi[0][a], roi[1][a])
        if size == in_len and scale == 1.0 and ctm != "tf_crop_and_resize":
            continue  # the identity for every mode
        if size == 0 or x.numel() == 0:
            shape = list(x.shape)
            shape[a] = size
            x = x.new_empty(shape)
            continue
        if in_len == 0:
            raise ShapeError(f"Resize: cannot resize an empty axis {a} to {size}")
        idx, w, outside, lerp = _device_table(in_len, size, scale, x.device, x.dtype, mode=mode, ctm=ctm,
                                        nearest_mode=nearest_mode, cubic_a=cubic_a, exclude_outside=exclude_outside,
                                        antialias=antialias, roi=lo_hi)
        x = _resample_axis(x, a, idx, w, lerp)
        if outside is not None:
            shape = [1] * x.dim()
            shape[a] = size
            x = x.masked_fill(outside.reshape(shape), extrapolation_value)
    if x.dtype != orig:
        if not orig.is_floating_point and orig != torch.bool:
            info = torch.iinfo(orig)  # round half to even and saturate, as the spec's reference
            x = x.round().clamp(info.min, info.max)
        x = x.to(orig)
    return x


def _roi_pairs(roi, rank: int, targets):
    """roi as (starts, ends) per input axis, floats."""
    n = len(targets)
    flat = roi.reshape(-1).cpu().tolist()
    if len(flat) != 2 * n:
        raise ShapeError(f"Resize: roi has {len(flat)} values, expected {2 * n}")
    starts: list = [0.0] * rank
    ends: list = [1.0] * rank
    for i, (a, _, _) in enumerate(targets):
        starts[a], ends[a] = flat[i], flat[n + i]
    return starts, ends


# ---- Resize -------------------------------------------------------------------------------------
# scales and sizes define the shape; roi does not, but is listed so that it stays on the host,
# where the per-axis tables are built
_DEPS = (1, 2, 3)


def _resize(x, roi, scales, sizes, *, allowed_ctm, antialias=0, axes=None,
            coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
            extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
            nearest_mode="round_prefer_floor"):
    ctm = coordinate_transformation_mode
    if ctm not in allowed_ctm:
        raise ShapeError(f"Resize: coordinate_transformation_mode {ctm!r} is not one of {allowed_ctm}")
    if mode == "nearest" and nearest_mode not in _NEAREST:
        raise ShapeError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    sc = [float(v) for v in scales.reshape(-1).tolist()] if _present(scales) else None
    sz = int_list(sizes) if _present(sizes) else None
    targets = _targets(tuple(x.shape), sc, sz, axes, keep_aspect_ratio_policy, "Resize")
    roi_pairs = None
    if ctm == "tf_crop_and_resize":
        if not _present(roi):
            raise ShapeError("Resize: coordinate_transformation_mode tf_crop_and_resize needs roi")
        roi_pairs = _roi_pairs(roi, x.dim(), targets)
    return _resample(x, targets, mode=mode, ctm=ctm, nearest_mode=nearest_mode, cubic_a=cubic_coeff_a,
                     exclude_outside=exclude_outside, antialias=antialias,
                     extrapolation_value=extrapolation_value, roi=roi_pairs)


def _resize_from_18(allowed_ctm):
    """Opsets 18 and 19 differ only in the coordinate modes they allow (19 adds half_pixel_symmetric)."""
    def kernel(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
               coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
               extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
               nearest_mode="round_prefer_floor", out=None):
        return _resize(x, roi, scales, sizes, allowed_ctm=allowed_ctm, antialias=antialias, axes=axes,
                       coordinate_transformation_mode=coordinate_transformation_mode, cubic_coeff_a=cubic_coeff_a,
                       exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                       keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode, nearest_mode=nearest_mode)
    return kernel


op("Resize", 18, infer=_resize_infer, shape_deps=_DEPS, writes_out=False)(_resize_from_18(_CTM_18))
op("Resize", 19, infer=_resize_infer, shape_deps=_DEPS, writes_out=False)(_resize_from_18(_CTM_19))


@op("Resize", (11, 13), infer=_resize_infer, shape_deps=_DEPS, writes_out=False)
def _resize11(x, roi=None, scales=None, sizes=None, *, coordinate_transformation_mode="half_pixel",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, mode="nearest",
              nearest_mode="round_prefer_floor", out=None):
    return _resize(x, roi, scales, sizes, allowed_ctm=_CTM_11,
                   coordinate_transformation_mode=coordinate_transformation_mode, cubic_coeff_a=cubic_coeff_a,
                   exclude_outside=exclude_outside, extrapolation_value=extrapolation_value, mode=mode,
                   nearest_mode=nearest_mode)


# ---- Resize-10 and Upsample ---------------------------------------------------------------------
def _legacy(x, scales: list[float], mode: str, what: str):
    if mode not in ("nearest", "linear"):
        raise ShapeError(f"{what}: unknown mode {mode!r} (nearest or linear)")
    targets = _targets(tuple(x.shape), scales, None, None, "stretch", what)
    return _resample(x, targets, mode=mode, ctm="asymmetric", nearest_mode="simple")


@op("Resize", 10, infer=_scales_infer, shape_deps=(1,), writes_out=False)
def _resize10(x, scales, *, mode="nearest", out=None):
    return _legacy(x, [float(v) for v in scales.reshape(-1).tolist()], mode, "Resize")


@op("Upsample", 9, infer=_scales_infer, shape_deps=(1,), writes_out=False)
def _upsample9(x, scales, *, mode="nearest", out=None):
    return _legacy(x, [float(v) for v in scales.reshape(-1).tolist()], mode, "Upsample")


def _upsample7_infer(shapes, values, *, scales, mode="nearest"):
    return [_out_shape(shapes[0], _targets(shapes[0], list(scales), None, None, "stretch", "Upsample"))]


@op("Upsample", 7, infer=_upsample7_infer, writes_out=False)
def _upsample7(x, *, scales, mode="nearest", out=None):
    return _legacy(x, [float(v) for v in scales], mode, "Upsample")

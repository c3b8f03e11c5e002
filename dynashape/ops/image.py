"""Image ops: GridSample, AffineGrid, CenterCropPad, Col2Im, RoiAlign, DeformConv, MaxUnpool.

All in plain torch ops (index arithmetic, gather / index_add, matmul), N-d where the spec is, on
CPU and CUDA alike. Interpolating ops build per-tap index and weight tensors and accumulate one
gather per tap combination, which keeps memory at a few times the output's size. GridSample
takes torch's grid_sample where it has the case (4-D, and 5-D but cubic; float inputs).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .conv import spatial_attrs, window_out_sizes
from .registry import op
from .shapes import int_list, norm_axes


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where interpolation is computed: float32/float64 as given, wider for halves and ints."""
    if dtype in (torch.float32, torch.float64):
        return dtype
    return torch.float32 if dtype.is_floating_point else torch.float64


def _keys(d, a: float = -0.75):
    """Keys' cubic convolution kernel with coefficient a."""
    d = d.abs()
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))


def _gather_taps(x, taps):
    """Sum over every combination of per-axis taps of weight * x[n, c, i1, ..., ir].

    x: (N, C, D1..Dr); taps: per spatial axis a list of (index (N, P) long, weight (N, P) or None).
    Returns (N, C, P)."""
    n, c = x.shape[:2]
    dims = x.shape[2:]
    flat = x.reshape(n, c, -1)
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    acc = None
    for combo in itertools.product(*taps):
        idx = sum(i * s for (i, _), s in zip(combo, strides))
        v = flat.gather(2, idx[:, None, :].expand(n, c, idx.shape[1]))
        w = None
        for _, wi in combo:
            if wi is not None:
                w = wi if w is None else w * wi
        if w is not None:
            v = v * w[:, None, :]
        acc = v if acc is None else acc.add_(v)
    return acc


# GridSample ------------------------------------------------------------------------------------
def _reflect(x, lo: float, hi: float):
    """Reflect coordinates outside [lo, hi] by the borders until inside (the spec's rule)."""
    span = hi - lo
    if span <= 0:  # a single pixel with align_corners: every coordinate maps onto it
        return torch.full_like(x, lo)
    below = x < lo
    dx = torch.where(below, lo - x, x - hi)
    flips = torch.trunc(dx / span)
    rest = dx - flips * span
    even = torch.remainder(flips, 2) == 0
    inside_from_lo = torch.where(even, lo + rest, hi - rest)
    inside_from_hi = torch.where(even, hi - rest, lo + rest)
    reflected = torch.where(below, inside_from_lo, inside_from_hi)
    return torch.where(below | (x > hi), reflected, x)


def _grid_axis_taps(g, size: int, mode: str, padding_mode: str, align_corners: int):
    """Taps of one spatial axis from its normalized grid coordinates g (N, P)."""
    if align_corners:
        x = (g + 1) / 2 * (size - 1)
        lo, hi = 0.0, float(size - 1)
    else:
        x = ((g + 1) * size - 1) / 2
        lo, hi = -0.5, size - 0.5
    if mode == "nearest":
        x = torch.round(x)  # halfway rounds to even, as the spec says
    outside = (x < lo) | (x > hi)
    if padding_mode == "border" and mode != "cubic":
        # cubic clamps its four taps only, not the coordinate (as torch and onnxruntime; onnx's
        # reference clamps both, which changes the weights near the border)
        x = torch.where(outside, x.clamp(0, size - 1), x)
    elif padding_mode == "reflection":
        x = _reflect(x, lo, hi)
    if mode == "nearest":
        base, offsets, weights = torch.trunc(x), (0,), (None,)
    else:
        base = torch.floor(x)
        f = x - base
        if mode == "linear":
            offsets, weights = (0, 1), (1 - f, f)
        else:
            offsets = (-1, 0, 1, 2)
            weights = tuple(_keys(f - o) for o in offsets)
    taps = []
    for o, w in zip(offsets, weights):
        i = base + o
        if padding_mode == "zeros":
            valid = (i >= 0) & (i <= size - 1)
            w = valid.to(x.dtype) if w is None else torch.where(valid, w, torch.zeros_like(w))
        elif padding_mode == "reflection":
            i = torch.trunc(_reflect(i, lo, hi))
        taps.append((i.clamp(0, size - 1).long(), w))
    return taps


_TORCH_MODES = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


def _grid_sample(x, grid, mode: str, padding_mode: str, align_corners: int):
    if mode not in ("linear", "nearest", "cubic"):
        raise ShapeError(f"GridSample: unknown mode {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ShapeError(f"GridSample: unknown padding_mode {padding_mode!r}")
    r = x.dim() - 2
    if r < 1 or grid.dim() != r + 2 or grid.shape[-1] != r or grid.shape[0] != x.shape[0]:
        raise ShapeError(f"GridSample: grid {tuple(grid.shape)} does not fit input {tuple(x.shape)}")
    if x.numel() == 0 or grid.numel() == 0:
        return x.new_zeros((*x.shape[:2], *grid.shape[1:-1]))
    if r in (2, 3) and x.dtype.is_floating_point and not (mode == "cubic" and r == 3):
        # torch's kernel is the spec's model (the spec cites it) and one fused launch
        cd = _float_dtype(x.dtype)
        y = F.grid_sample(x.to(cd), grid.to(cd), _TORCH_MODES[mode], padding_mode, bool(align_corners))
        return y.to(x.dtype)
    return _grid_sample_gather(x, grid, mode, padding_mode, align_corners)


def _grid_sample_gather(x, grid, mode: str, padding_mode: str, align_corners: int):
    """Any rank and mode: per axis taps from the grid, one gather per tap combination."""
    r = x.dim() - 2
    n, c = x.shape[:2]
    out_spatial = tuple(grid.shape[1:-1])
    g = grid.reshape(n, -1, r).to(_float_dtype(grid.dtype))
    # grid's last axis lists the coordinates innermost first: component r-1-i is spatial axis i
    taps = [_grid_axis_taps(g[..., r - 1 - i], x.shape[2 + i], mode, padding_mode, align_corners)
            for i in range(r)]
    cd = _float_dtype(x.dtype)
    taps = [[(i, None if w is None else w.to(cd)) for i, w in t] for t in taps]
    y = _gather_taps(x.to(cd), taps).reshape(n, c, *out_spatial)
    return y.to(x.dtype)  # integer inputs: computed in float, cast (truncated) at the end


def _grid_infer(shapes, values, **_attrs):
    x, g = shapes[0], shapes[1]
    return [(x[0], x[1], *g[1:-1])]


@op("GridSample", (20, 22), infer=_grid_infer, writes_out=False)
def _grid_sample20(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros", out=None):
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@op("GridSample", 16, infer=_grid_infer, writes_out=False)
def _grid_sample16(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros", out=None):
    if x.dim() != 4:
        raise ShapeError(f"GridSample-16 takes 4-D inputs only, got shape {tuple(x.shape)}")
    if mode not in _MODES_16:
        raise ShapeError(f"GridSample-16: unknown mode {mode!r} (bilinear, nearest or bicubic)")
    return _grid_sample(x, grid, _MODES_16[mode], padding_mode, align_corners)


# AffineGrid ------------------------------------------------------------------------------------
def _affine_infer(shapes, values, *, align_corners=0):
    size = int_list(values[1])
    if len(size) not in (4, 5):
        raise ShapeError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    return [(shapes[0][0], *size[2:], len(size) - 2)]


def _base_coords(length: int, align_corners: int, dtype, device):
    """Evenly spaced positions in [-1, 1]: pixel centres, or corners with align_corners."""
    if length == 1:
        # the centre, as torch's affine_grid (which the spec cites). With align_corners the spec
        # is silent and the references disagree: onnxruntime puts it at 1, onnx's reference at -1
        return torch.zeros(1, dtype=dtype, device=device)
    i = torch.arange(length, dtype=dtype, device=device)
    if align_corners:
        return i * (2 / (length - 1)) - 1
    return (2 * i + 1) / length - 1


@op("AffineGrid", 20, infer=_affine_infer, shape_deps=(1,), writes_out=False)
def _affine_grid(theta, size, *, align_corners=0, out=None):
    size = int_list(size)
    r = len(size) - 2
    if r not in (2, 3) or tuple(theta.shape[1:]) != (r, r + 1) or theta.shape[0] != size[0]:
        raise ShapeError(f"AffineGrid: theta {tuple(theta.shape)} does not fit size {size}")
    spatial = size[2:]
    axes = [_base_coords(d, align_corners, theta.dtype, theta.device) for d in spatial]
    mesh = torch.meshgrid(*axes, indexing="ij")
    # homogeneous positions (x, y[, z], 1): x runs along the innermost axis
    base = torch.stack([*reversed(mesh), torch.ones_like(mesh[0])], dim=-1).reshape(-1, r + 1)
    grid = base @ theta.transpose(1, 2)  # (N, P, r)
    return grid.reshape(size[0], *spatial, r)


# CenterCropPad ---------------------------------------------------------------------------------
def _crop_pad_plan(in_shape, target: list[int], axes):
    rank = len(in_shape)
    axes = norm_axes(axes, rank) if axes else list(range(rank))
    if len(target) != len(axes):
        raise ShapeError(f"CenterCropPad: {len(target)} sizes for axes {axes}")
    out = list(in_shape)
    for a, t in zip(axes, target):
        if t < 0:
            raise ShapeError(f"CenterCropPad: negative size {t}")
        out[a] = t
    return axes, out


def _crop_pad_infer(shapes, values, *, axes=None):
    return [tuple(_crop_pad_plan(shapes[0], int_list(values[1]), axes)[1])]


@op("CenterCropPad", 18, infer=_crop_pad_infer, shape_deps=(1,))
def _center_crop_pad(x, shape, *, axes=None, out=None):
    axes, out_shape = _crop_pad_plan(tuple(x.shape), int_list(shape), axes)
    src = [slice(None)] * x.dim()
    dst = [slice(None)] * x.dim()
    for a in axes:
        d, t = x.shape[a], out_shape[a]
        if t < d:  # crop: the window starts rounded down
            b = (d - t) // 2
            src[a] = slice(b, b + t)
        elif t > d:  # pad: the odd pixel goes to the end
            b = (t - d) // 2
            dst[a] = slice(b, b + d)
    y = x.new_zeros(out_shape) if out is None else out.zero_()
    y[tuple(dst)] = x[tuple(src)]
    return y


# Col2Im ----------------------------------------------------------------------------------------
def _col2im_plan(x_shape, image: list[int], block: list[int], dilations, pads, strides):
    n = len(image)
    if n < 1 or len(block) != n:
        raise ShapeError(f"Col2Im: image_shape {image} and block_shape {block} differ in length")
    k, s, d, p = spatial_attrs(n, block, strides, dilations, pads, "Col2Im")
    kprod = math.prod(k)
    if len(x_shape) != 3 or (isinstance(x_shape[1], int) and x_shape[1] % kprod):
        raise ShapeError(f"Col2Im: input {tuple(x_shape)} is not (N, C * {kprod}, L)")
    blocks = [(image[i] + p[i] + p[n + i] - (d[i] * (k[i] - 1) + 1)) // s[i] + 1 for i in range(n)]
    if min(blocks) < 1 or (isinstance(x_shape[2], int) and x_shape[2] != math.prod(blocks)):
        raise ShapeError(f"Col2Im: input has {x_shape[2]} blocks, image {image} with block {block}, pads {p}, "
                         f"strides {s}, dilations {d} gives {blocks}")
    return k, s, d, p, blocks


def _col2im_infer(shapes, values, *, dilations=None, pads=None, strides=None):
    image, block = int_list(values[1]), int_list(values[2])
    _col2im_plan(shapes[0], image, block, dilations, pads, strides)
    return [(shapes[0][0], shapes[0][1] // math.prod(block), *image)]


@op("Col2Im", 18, infer=_col2im_infer, shape_deps=(1, 2), writes_out=False)
def _col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None, out=None):
    image, block = int_list(image_shape), int_list(block_shape)
    k, s, d, p, blocks = _col2im_plan(tuple(x.shape), image, block, dilations, pads, strides)
    n_dims = len(image)
    padded = [image[i] + p[i] + p[n_dims + i] for i in range(n_dims)]
    kprod = math.prod(k)
    nb, c = x.shape[0], x.shape[1] // kprod
    dev = x.device
    # flat position in the padded image of (kernel offset, block): one index per column entry
    pos = torch.zeros((1, 1), dtype=torch.long, device=dev)
    for i in range(n_dims):
        ki = torch.arange(k[i], device=dev) * d[i]
        bi = torch.arange(blocks[i], device=dev) * s[i]
        pos = pos[:, None, :, None] * padded[i] + ki[None, :, None, None] + bi[None, None, None, :]
        pos = pos.reshape(pos.shape[0] * k[i], -1)
    img = x.new_zeros((nb, c, math.prod(padded)))
    img.index_add_(2, pos.reshape(-1), x.reshape(nb, c, -1))
    img = img.reshape(nb, c, *padded)
    return img[(slice(None), slice(None), *(slice(p[i], p[i] + image[i]) for i in range(n_dims)))]


# RoiAlign --------------------------------------------------------------------------------------
_ROI_CHUNK = 1 << 25  # elements gathered at once: the taps of a chunk of rois


def _roi_infer(shapes, values, *, output_height=1, output_width=1, **_attrs):
    return [(shapes[1][0], shapes[0][1], output_height, output_width)]


def _roi_axis(start, bin_size, grid, n_bins: int, g_max: int, size: int):
    """Per roi, bin and sample of one axis: (low index, high index, low weight, high weight),
    each (R, n_bins, g_max); samples beyond a roi's grid and samples off the map weigh 0."""
    ph = torch.arange(n_bins, device=start.device, dtype=start.dtype)[None, :, None]
    it = torch.arange(g_max, device=start.device, dtype=start.dtype)[None, None, :]
    pos = start[:, None, None] + ph * bin_size[:, None, None] + (it + 0.5) * bin_size[:, None, None] / \
        grid[:, None, None].clamp(min=1)
    used = (it < grid[:, None, None]) & (pos >= -1.0) & (pos <= size)
    pos = pos.clamp(min=0)
    low = torch.floor(pos)
    at_end = low >= size - 1
    low = torch.where(at_end, torch.full_like(low, size - 1), low)
    high = torch.where(at_end, low, low + 1)
    pos = torch.where(at_end, low, pos)
    frac = pos - low
    zero = torch.zeros_like(frac)
    w_low = torch.where(used, 1 - frac, zero)
    w_high = torch.where(used, frac, zero)
    return low.long(), high.long(), w_low, w_high


def _roi_align(x, rois, batch_indices, *, half_pixel: bool, mode: str, output_height: int, output_width: int,
               sampling_ratio: int, spatial_scale: float):
    if mode not in ("avg", "max"):
        raise ShapeError(f"RoiAlign: unknown mode {mode!r}")
    if x.dim() != 4 or rois.dim() != 2 or rois.shape[1] != 4 or batch_indices.shape[0] != rois.shape[0]:
        raise ShapeError(f"RoiAlign: X {tuple(x.shape)}, rois {tuple(rois.shape)}, batch_indices "
                         f"{tuple(batch_indices.shape)} do not fit")
    n, c, h, w = x.shape
    oh, ow = output_height, output_width
    nr = rois.shape[0]
    if nr == 0 or c == 0:
        return x.new_zeros((nr, c, oh, ow))
    cd = _float_dtype(x.dtype)
    dev = x.device
    # the sample tables are built on the host: the adaptive grid size needs the rois there anyway,
    # and CUDA's division by a scalar (a multiplication by its reciprocal) could move the ceil
    b = rois.cpu().to(cd) * spatial_scale - (0.5 if half_pixel else 0.0)
    x1, y1, x2, y2 = b.unbind(1)
    rw, rh = x2 - x1, y2 - y1
    if not half_pixel:  # the legacy mode makes malformed rois 1x1
        rw, rh = rw.clamp(min=1.0), rh.clamp(min=1.0)
    bin_h, bin_w = rh / oh, rw / ow
    if sampling_ratio > 0:
        grid_h = grid_w = torch.full_like(rh, float(sampling_ratio))
        gh_max = gw_max = sampling_ratio
    else:  # adaptive: ceil(roi size / output size) samples per bin, per roi
        grid_h, grid_w = torch.ceil(rh / oh), torch.ceil(rw / ow)
        gh_max = max(int(grid_h.max().item()), 1)
        gw_max = max(int(grid_w.max().item()), 1)
    count = (grid_h * grid_w).clamp(min=1)
    ylo, yhi, wyl, wyh = (t.to(dev, non_blocking=True) for t in _roi_axis(y1, bin_h, grid_h, oh, gh_max, h))
    xlo, xhi, wxl, wxh = (t.to(dev, non_blocking=True) for t in _roi_axis(x1, bin_w, grid_w, ow, gw_max, w))
    grid_h, grid_w, count = grid_h.to(dev), grid_w.to(dev), count.to(dev)
    # every (roi, bin) reads taps = samples x 4 corners: a row index and a weight per tap,
    # laid out (roi, ph, pw, iy, ix, corner y, corner x)
    yi, wy = torch.stack([ylo, yhi], -1), torch.stack([wyl, wyh], -1)  # (R, oh, Gh, 2)
    xi, wx = torch.stack([xlo, xhi], -1), torch.stack([wxl, wxh], -1)  # (R, ow, Gw, 2)
    base = batch_indices.to(dev).long() * (h * w)
    idx = (base[:, None, None, None, None, None, None] + yi[:, :, None, :, None, :, None] * w
           + xi[:, None, :, None, :, None, :])
    wt = wy[:, :, None, :, None, :, None] * wx[:, None, :, None, :, None, :]
    taps = gh_max * gw_max * 4
    idx, wt = idx.reshape(nr, oh * ow, taps), wt.reshape(nr, oh * ow, taps)
    if mode == "avg":
        wt = wt / count[:, None, None]
    else:  # samples beyond a roi's own grid do not count in its max
        inside = ((torch.arange(gh_max, device=dev)[None, :] < grid_h[:, None])[:, :, None, None, None]
                  & (torch.arange(gw_max, device=dev)[None, :] < grid_w[:, None])[:, None, :, None, None])
        inside = inside.expand(nr, gh_max, gw_max, 2, 2).reshape(nr, 1, taps)
    # channels last, one row per (image, y, x): all taps of a chunk of rois are one index_select
    rows = x.to(cd).permute(0, 2, 3, 1).reshape(n * h * w, c)
    step = max(1, _ROI_CHUNK // (oh * ow * taps * c))
    outs = []
    for s in range(0, nr, step):
        sl = slice(s, min(s + step, nr))
        r = sl.stop - sl.start
        v = rows.index_select(0, idx[sl].reshape(-1)).reshape(r * oh * ow, taps, c)
        if mode == "avg":
            y = torch.bmm(wt[sl].reshape(r * oh * ow, 1, taps), v)
        else:
            # the spec's max: the largest weighted corner of any sample in the bin (a sample off
            # the map counts as 0); a roi without samples (a zero-sized adaptive grid) gives 0
            y = (v * wt[sl].reshape(r * oh * ow, taps, 1)).reshape(r, oh * ow, taps, c)
            y = y.masked_fill(~inside[sl, :, :, None], float("-inf")).amax(2)
            y = torch.where(torch.isneginf(y), torch.zeros_like(y), y)
        outs.append(y.reshape(r, oh, ow, c).permute(0, 3, 1, 2))
    return torch.cat(outs).to(x.dtype)


@op("RoiAlign", (16, 22), infer=_roi_infer, writes_out=False)
def _roi_align16(x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0, out=None):
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ShapeError(f"RoiAlign: unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    return _roi_align(x, rois, batch_indices, half_pixel=coordinate_transformation_mode == "half_pixel", mode=mode,
                      output_height=output_height, output_width=output_width, sampling_ratio=sampling_ratio,
                      spatial_scale=spatial_scale)


@op("RoiAlign", 10, infer=_roi_infer, writes_out=False)
def _roi_align10(x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0, out=None):
    # opset 10 has no coordinate_transformation_mode: it behaves as output_half_pixel
    return _roi_align(x, rois, batch_indices, half_pixel=False, mode=mode, output_height=output_height,
                      output_width=output_width, sampling_ratio=sampling_ratio, spatial_scale=spatial_scale)


# DeformConv ------------------------------------------------------------------------------------
def _deform_plan(x_shape, w_shape, dilations, kernel_shape, pads, strides):
    n = len(x_shape) - 2
    if n < 1 or len(w_shape) != n + 2:
        raise ShapeError(f"DeformConv: input {tuple(x_shape)} and weight {tuple(w_shape)} do not fit")
    kernel = list(kernel_shape) if kernel_shape else list(w_shape[2:])
    k, s, d, p = spatial_attrs(n, kernel, strides, dilations, pads, "DeformConv")
    return n, k, s, d, p, window_out_sizes(list(x_shape[2:]), k, s, d, p, "NOTSET")


def _deform_infer(shapes, values, *, dilations=None, group=1, kernel_shape=None, offset_group=1, pads=None,
                  strides=None):
    x, wt = shapes[0], shapes[1]
    *_, sizes = _deform_plan(x, wt, dilations, kernel_shape, pads, strides)
    return [(x[0], wt[0], *sizes)]


@op("DeformConv", (19, 22), infer=_deform_infer, writes_out=False)
def _deform_conv(x, weight, offset, bias=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                 offset_group=1, pads=None, strides=None, out=None):
    n, k, s, d, p, sizes = _deform_plan(x.shape, weight.shape, dilations, kernel_shape, pads, strides)
    nb, c = x.shape[:2]
    oc = weight.shape[0]
    kk, og, npos = math.prod(k), offset_group, math.prod(sizes)
    if c != weight.shape[1] * group or oc % group or c % og:
        raise ShapeError(f"DeformConv: {c} input channels, weight {tuple(weight.shape)}, group={group}, "
                         f"offset_group={og} do not fit")
    if tuple(offset.shape) != (nb, og * kk * n, *sizes):
        raise ShapeError(f"DeformConv: offset {tuple(offset.shape)} should be {(nb, og * kk * n, *sizes)}")
    cd = _float_dtype(x.dtype)
    off = offset.to(cd).reshape(nb, og, kk, n, npos)
    dev = x.device
    # undeformed sampling position of (kernel offset, output position) along each axis
    kpos = torch.stack(torch.meshgrid(*[torch.arange(ki, device=dev, dtype=cd) * di for ki, di in zip(k, d)],
                                      indexing="ij"), 0).reshape(n, kk)
    opos = torch.stack(torch.meshgrid(*[torch.arange(o, device=dev, dtype=cd) * si - pi
                                        for o, si, pi in zip(sizes, s, p[:n])], indexing="ij"), 0).reshape(n, npos)
    taps = []
    for i in range(n):
        pos = (kpos[i][:, None] + opos[i][None, :]) + off[:, :, :, i, :]  # (N, og, K, P)
        low = torch.floor(pos)
        frac = pos - low
        axis = []
        for t, wt in ((low, 1 - frac), (low + 1, frac)):  # linear taps; outside the input reads 0
            valid = (t >= 0) & (t <= x.shape[2 + i] - 1)
            axis.append((t.clamp(0, x.shape[2 + i] - 1).long().reshape(nb * og, kk * npos),
                         torch.where(valid, wt, torch.zeros_like(wt)).reshape(nb * og, kk * npos)))
        taps.append(axis)
    xg = x.to(cd).reshape(nb * og, c // og, *x.shape[2:])
    cols = _gather_taps(xg, taps).reshape(nb, og, c // og, kk, npos)
    if mask is not None:
        cols = cols * mask.to(cd).reshape(nb, og, 1, kk, npos)
    cols = cols.reshape(nb, group, (c // group) * kk, npos)
    y = weight.to(cd).reshape(group, oc // group, (c // group) * kk) @ cols  # (N, g, oC/g, P)
    y = y.reshape(nb, oc, *sizes)
    if bias is not None:
        y = y + bias.to(cd).reshape(1, oc, *([1] * n))
    return y.to(x.dtype)


# MaxUnpool -------------------------------------------------------------------------------------
def _unpool_sizes(x_shape, kernel_shape, pads, strides):
    n = len(x_shape) - 2
    if not kernel_shape or len(kernel_shape) != n:
        raise ShapeError(f"MaxUnpool: kernel_shape {kernel_shape} does not fit input {tuple(x_shape)}")
    s = list(strides) if strides else [1] * n
    p = list(pads) if pads else [0] * (2 * n)
    return [(x_shape[2 + i] - 1) * s[i] - (p[i] + p[n + i]) + kernel_shape[i] for i in range(n)]


def _unpool_infer(shapes, values, *, kernel_shape=None, pads=None, strides=None):
    if len(values) > 2 and values[2] is not None:
        return [tuple(int_list(values[2]))]
    x = shapes[0]
    return [(x[0], x[1], *_unpool_sizes(x, kernel_shape, pads, strides))]


@op("MaxUnpool", (9, 11, 22), infer=_unpool_infer, shape_deps=(2,), writes_out=False)
def _max_unpool(x, indices, output_shape=None, *, kernel_shape=None, pads=None, strides=None, out=None):
    if tuple(indices.shape) != tuple(x.shape):
        raise ShapeError(f"MaxUnpool: indices {tuple(indices.shape)} differ from X {tuple(x.shape)}")
    if output_shape is not None:
        # the indices are positions in the tensor that was pooled, which output_shape names
        # (as onnxruntime; pads are then ignored)
        shape = int_list(output_shape)
        if len(shape) != x.dim() or shape[:2] != list(x.shape[:2]):
            raise ShapeError(f"MaxUnpool: output_shape {shape} does not fit X {tuple(x.shape)}")
    else:
        shape = [*x.shape[:2], *_unpool_sizes(tuple(x.shape), kernel_shape, pads, strides)]
    y = x.new_zeros(math.prod(shape))
    idx = indices.reshape(-1).long()
    lo_hi = torch.stack([idx.min(), idx.max()]).tolist() if idx.numel() else [0, 0]
    if lo_hi[0] < 0 or lo_hi[1] >= max(y.numel(), 1):
        raise ShapeError(f"MaxUnpool: indices outside [0, {y.numel()}) for output shape {shape}")
    y[idx] = x.reshape(-1)
    return y.reshape(shape)


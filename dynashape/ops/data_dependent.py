"""Ops whose output shape depends on input values: NonZero, Unique, Compress.

They register no shape function (infer=None): the runtime calls them with out=None and takes
the shapes of what they return, which therefore must be exact, never padded.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import torch

from ..errors import IndexOutOfRangeError
from . import host_sync, native
from .registry import op
from .shapes import first_item, norm_axis


@op("NonZero", (9, 13), infer=None)
def _nonzero(x, *, out=None):
    if x.dim() == 0:  # a scalar is treated as a 1-element vector, like numpy's nonzero of atleast_1d
        x = x.reshape(1)
    host_sync.count("NonZero", x)  # torch.nonzero reads the count back to size its result
    return torch.nonzero(x).t().contiguous()


@op("Unique", (11, 28), infer=None)
def _unique(x, *, axis=None, sorted=1, out=None):
    host_sync.count("Unique", x)  # torch.unique reads its result's size back
    if axis is None:
        src, a = x.reshape(-1), 0
        y, inverse, counts = torch.unique(src, sorted=True, return_inverse=True, return_counts=True)
    else:
        a = norm_axis(axis, x.dim())
        y, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=a)
    n = x.shape[a] if axis is not None else src.numel()
    nu = counts.numel()
    # index of the first occurrence of each unique value (or slice)
    first = torch.full((nu,), n, dtype=torch.int64, device=x.device)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=x.device), "amin")
    if not sorted:
        # ONNX's unsorted order is the order of first occurrence
        order = torch.argsort(first)
        y = y.index_select(a, order)
        first, counts = first[order], counts[order]
        rank = torch.empty_like(order)
        rank[order] = torch.arange(nu, device=x.device)
        inverse = rank[inverse]
    return y.contiguous(), first, inverse.reshape(-1), counts


@op("Compress", (9, 11, 28), infer=None)
def _compress(x, condition, *, axis=None, out=None):
    """The condition may be shorter than the axis: elements past its end are dropped. A longer
    one may only hold False past the axis's end: a True there selects an index that does not
    exist, IndexOutOfRangeError (the reference evaluator raises too; onnxruntime ignores it). The
    tail is looked at only when the condition is longer than the axis (a size known on the host),
    so the usual call reads nothing more."""
    src, a = (x.reshape(-1), 0) if axis is None else (x, norm_axis(axis, x.dim()))
    n = src.shape[a]
    cond = condition.reshape(-1)
    if cond.numel() > n:
        past = torch.nonzero(cond[n:].to(torch.bool)).reshape(-1)
        if past.numel():
            where = "of the flattened input" if axis is None else str(a)
            raise IndexOutOfRangeError(
                f"Compress: the condition selects index {n + int(past[0])} along axis {where}, which is out of "
                f"range for size {n} (the condition has {cond.numel()} entries; those past {n} must be false)")
        cond = cond[:n]
    host_sync.count("Compress", x)  # the selected count sizes the result
    idx = torch.nonzero(cond.to(device=x.device, dtype=torch.bool)).reshape(-1)
    return src.index_select(a, idx)


# ---- NonMaxSuppression --------------------------------------------------------------------------
def _scalar_or(t, default, cast):
    """An optional scalar input: absent or empty means the spec's default."""
    if t is None or t.numel() == 0:
        return default
    return cast(first_item(t))


def _box_corners(boxes, center_point_box: int):
    """Boxes as (y_min, x_min, y_max, x_max) whatever their format."""
    if center_point_box:
        xc, yc, w, h = boxes.unbind(-1)
        return torch.stack((yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2), -1)
    y1, x1, y2, x2 = boxes.unbind(-1)  # any two diagonal corners
    return torch.stack((torch.minimum(y1, y2), torch.minimum(x1, x2), torch.maximum(y1, y2), torch.maximum(x1, x2)), -1)


def _nms_host(corners: np.ndarray, scores: np.ndarray, limit: int, iou_thr: float, score_thr) -> torch.Tensor:
    """NonMaxSuppression in numpy where nms.c cannot be built: the same selection (float32 IoU, stable
    descending order) from the whole candidates x candidates IoU matrix, one vectorized step per kept
    box; fine for a few hundred candidates, seconds for thousands."""
    rows: list[tuple[int, int, int]] = []
    n_batches, n_classes, _ = scores.shape
    for b in range(n_batches):
        for c in range(n_classes):
            s = scores[b, c]
            cand = np.flatnonzero(s > np.float32(score_thr)) if score_thr is not None else np.arange(s.shape[0])
            if cand.size == 0:
                continue
            # best score first; equal scores keep the lower box index first (a stable sort of -score)
            order = cand[np.argsort(-s[cand], kind="stable")]
            k = corners[b, order]
            area = (k[:, 2] - k[:, 0]) * (k[:, 3] - k[:, 1])
            lo = np.maximum(k[:, None, :2], k[None, :, :2])
            hi = np.minimum(k[:, None, 2:], k[None, :, 2:])
            wh = np.maximum(hi - lo, np.float32(0))
            inter = wh[..., 0] * wh[..., 1]
            with np.errstate(invalid="ignore", divide="ignore"):
                over = inter / (area[:, None] + area[None, :] - inter) > np.float32(iou_thr)
            alive = np.ones(order.shape[0], dtype=bool)
            i, n = 0, 0
            while True:
                rows.append((b, c, int(order[i])))
                n += 1
                if n >= limit:
                    break
                alive &= ~over[i]
                rest = alive[i + 1:]
                j = int(rest.argmax()) if rest.size else 0
                if not rest.size or not rest[j]:
                    break
                i += 1 + j
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)


_NMS_LOCK = threading.Lock()  # nms.c keeps its sort's state in a global


def _nms_native(corners: torch.Tensor, scores: torch.Tensor, limit: int, iou_thr: float, score_thr):
    """The selection in C (ops/csrc/nms.c: each candidate against the kept boxes only), or None where
    the kernel cannot be built (counted: ``nms_torch_fallbacks``)."""
    fn = native.function("nms", "nms_select", "iiippididp", ctypes.c_int64, fallbacks="nms")
    if fn is None:
        return None
    nb, nc, n = scores.shape
    out = torch.empty((nb * nc * min(limit, n), 3), dtype=torch.int64)
    with _NMS_LOCK:
        rows = fn(nb, nc, n, corners.data_ptr(), scores.data_ptr(), limit, iou_thr, score_thr is not None,
                  0.0 if score_thr is None else score_thr, out.data_ptr())
    if rows < 0:
        raise MemoryError("NonMaxSuppression: no memory for the candidates' order")
    native.count("nms_native")
    return out[:rows].clone()


@op("NonMaxSuppression", (10, 11), infer=None)
def _nms(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None, *,
         center_point_box=0, out=None):
    limit = _scalar_or(max_output_boxes_per_class, 0, int)
    iou_thr = _scalar_or(iou_threshold, 0.0, float)
    score_thr = _scalar_or(score_threshold, None, float)
    if limit <= 0 or scores.numel() == 0:
        return torch.empty((0, 3), dtype=torch.int64, device=scores.device)
    # The selection is sequential and its size decides the output shape: it runs on the host, from
    # one copy of the boxes and scores (one counted read on a GPU)
    host_sync.count("NonMaxSuppression", scores)
    corners = _box_corners(boxes, center_point_box).float().cpu().contiguous()
    host_scores = scores.float().cpu().contiguous()
    rows = _nms_native(corners, host_scores, limit, iou_thr, score_thr)
    if rows is None:
        rows = _nms_host(corners.numpy(), host_scores.numpy(), limit, iou_thr, score_thr)
    return rows.to(scores.device)

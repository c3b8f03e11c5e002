"""torchvision's ops for the CPU torch of these machines.

PyPI's torchvision wheel is a CUDA build: its C ops do not load against a CPU-only torch, and
importing torchvision then fails (transformers and ultralytics import it). Import this module first:
it defines torchvision's two NMS ops (a plain greedy selection: the exporters only trace through it;
torchvision's own ONNX symbolic writes NonMaxSuppression into the graph) and tells torchvision that
its ops are there.
"""
import torch

_lib = torch.library.Library("torchvision", "DEF")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _iou(box: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    lo = torch.maximum(box[:2], others[:, :2])
    hi = torch.minimum(box[2:], others[:, 2:])
    inter = (hi - lo).clamp(min=0).prod(-1)
    area = (box[2:] - box[:2]).prod()
    return inter / (area + (others[:, 2:] - others[:, :2]).prod(-1) - inter)


def _nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    order = scores.argsort(descending=True)
    keep: list[int] = []
    for i in order.tolist():
        if not keep or bool((_iou(dets[i], dets[keep]) <= iou_threshold).all()):
            keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


_lib.impl("nms", _nms, "CPU")
_lib.impl("qnms", _nms, "CPU")

import torchvision.extension as _ext  # noqa: E402  (after the ops exist: its import registers fakes for them)

_ext._has_ops = lambda: True
_ext._assert_has_ops = lambda: None

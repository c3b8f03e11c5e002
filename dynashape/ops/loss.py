"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both take scores of shape (N, C, d1, ..., dk) and integer targets of shape (N, d1, ..., dk).
An element whose target equals ``ignore_index`` contributes 0 to the loss and 0 to the
denominator of the mean; ``ignore_index`` may lie outside [0, C) (negative, or >= C). The mean
divides by the sum of the class weights the kept elements picked (their count without weights).
SoftmaxCrossEntropyLoss is NegativeLogLikelihoodLoss on LogSoftmax(scores, axis=1) and can also
output that log-probability tensor.
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from .registry import op

_HALF = (torch.float16, torch.bfloat16)
_REDUCTIONS = ("none", "sum", "mean")


def _loss_shapes(op_type: str, scores, target, reduction: str):
    if reduction not in _REDUCTIONS:
        raise ShapeError(f"{op_type}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if len(scores) < 2:
        raise ShapeError(f"{op_type}: input must have shape (N, C, d1, ...), got {tuple(scores)}")
    if len(target) != len(scores) - 1:
        raise ShapeError(f"{op_type}: target of shape {tuple(target)} does not match input of shape "
                         f"{tuple(scores)}: expected (N, d1, ...)")
    return tuple(target) if reduction == "none" else ()


def _nll_infer(shapes, values, *, ignore_index=None, reduction="mean"):
    return [_loss_shapes("NegativeLogLikelihoodLoss", shapes[0], shapes[1], reduction)]


def _sce_infer(shapes, values, *, ignore_index=None, reduction="mean", _n_outputs=1):
    # the log_prob output (when the node has it) is shaped as the scores
    return [_loss_shapes("SoftmaxCrossEntropyLoss", shapes[0], shapes[1], reduction), tuple(shapes[0])]


def _nll(logp: torch.Tensor, target: torch.Tensor, weight, ignore_index, reduction: str) -> torch.Tensor:
    t = target.long()
    keep = None
    if ignore_index is not None:
        keep = t != ignore_index
        # an ignored element may hold any value, even one no class has: point it at class 0 so
        # that the gathers stay in range; its weight of 0 below drops it
        t = t.masked_fill(~keep, 0)
    loss = -logp.gather(1, t.unsqueeze(1)).squeeze(1)
    w = None if weight is None else weight[t]
    if keep is not None:
        w = keep.to(logp.dtype) if w is None else w * keep
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    # half-precision sums over many elements lose too much: accumulate in float32
    acc = torch.float32 if logp.dtype in _HALF else logp.dtype
    total = loss.sum(dtype=acc)
    if reduction == "mean":
        total = total / (loss.numel() if w is None else w.sum(dtype=acc))
    return total.to(logp.dtype)


def _log_softmax(scores: torch.Tensor) -> torch.Tensor:
    if scores.dtype in _HALF:
        return torch.log_softmax(scores, 1, dtype=torch.float32).to(scores.dtype)
    return torch.log_softmax(scores, 1)


@op("NegativeLogLikelihoodLoss", (12, 13, 22), infer=_nll_infer)
def _negative_log_likelihood_loss(x, target, weight=None, *, ignore_index=None, reduction="mean", out=None):
    r = _nll(x, target, weight, ignore_index, reduction)
    return r if out is None else out.copy_(r)


@op("SoftmaxCrossEntropyLoss", (12, 13), infer=_sce_infer)
def _softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean",
                                _n_outputs=1, out=None):
    logp = _log_softmax(scores)
    loss = _nll(logp, labels, weights, ignore_index, reduction)
    if _n_outputs == 1:
        return loss if out is None else out.copy_(loss)
    if out is None:
        return loss, logp
    return tuple(r if o is None else o.copy_(r) for o, r in zip(out, (loss, logp)))

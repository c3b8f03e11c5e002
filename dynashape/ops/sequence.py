"""Sequences and optionals.

A sequence is a Python list of tensors, an optional is its value or None. Kernels never mutate
a list they are given (a constant or another node's output may be the same list): they build a
new one. Their results have no shape to infer, so the runtime takes them as the kernels return
them (see PrimitiveInst: any non-tensor input or output makes a node data-dependent).
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from .registry import op
from .shapes import first_item, norm_axis


def _position(pos, n: int, inserting: bool = False) -> int:
    """A position tensor as a list index; inserting allows n (append)."""
    p = int(first_item(pos))
    hi = n if inserting else n - 1
    if not -n <= p <= hi:
        raise ShapeError(f"position {p} is out of range for a sequence of length {n}")
    return p + n if p < 0 else p


@op("SequenceEmpty", 11, infer=None)
def _sequence_empty(*, dtype=1, _device=None, out=None):
    torch_dtype(dtype)  # an unknown element type fails here, at the first run
    return []


@op("SequenceConstruct", 11, infer=None)
def _sequence_construct(*tensors, out=None):
    return list(tensors)


@op("SequenceInsert", 11, infer=None)
def _sequence_insert(seq, tensor, position=None, *, out=None):
    p = len(seq) if position is None else _position(position, len(seq), inserting=True)
    return [*seq[:p], tensor, *seq[p:]]


@op("SequenceAt", 11, infer=None)
def _sequence_at(seq, position, *, out=None):
    return seq[_position(position, len(seq))]


@op("SequenceErase", 11, infer=None)
def _sequence_erase(seq, position=None, *, out=None):
    p = len(seq) - 1 if position is None else _position(position, len(seq))
    return seq[:p] + seq[p + 1:]


@op("SequenceLength", 11, infer=None)
def _sequence_length(seq, *, _device=None, out=None):
    return torch.tensor(len(seq), dtype=torch.int64, device=_device)


@op("ConcatFromSequence", 11, infer=None)
def _concat_from_sequence(seq, *, axis, new_axis=0, out=None):
    if not seq:
        raise ShapeError("ConcatFromSequence of an empty sequence has no defined type or shape")
    if new_axis:
        return torch.stack(seq, norm_axis(axis, seq[0].dim() + 1))
    return torch.cat(seq, norm_axis(axis, seq[0].dim()))


@op("SplitToSequence", 11, infer=None)
def _split_to_sequence(x, split=None, *, axis=0, keepdims=1, out=None):
    a = norm_axis(axis, x.dim())
    if split is None:
        parts = torch.split(x, 1, a)  # one element per slice; keepdims decides whether the axis stays
        return [p.squeeze(a) if not keepdims else p for p in parts]
    sizes = split.reshape(-1).tolist() if split.dim() else int(split)
    return list(torch.split(x, sizes, a))


@op("Optional", 15, infer=None)
def _optional(x=None, *, type=None, out=None):
    return x


@op("OptionalHasElement", (15, 18), infer=None)
def _optional_has_element(x=None, *, _device=None, out=None):
    return torch.tensor(x is not None, device=_device)


@op("OptionalGetElement", (15, 18), infer=None)
def _optional_get_element(x, *, out=None):
    if x is None:
        raise ShapeError("OptionalGetElement of an empty optional")
    return x

"""Helpers for shape functions. Each works on ints (run time) and on Dimensions (compile time)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ShapeError
from ..shape import Dimension, broadcast_dims
from ..shape.symint import SymInt, same_dim
from . import host_sync

Dim = "int | Dimension"


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [norm_axis(a, rank) for a in axes]


def same_as_first(shapes, values, **_attrs):
    return [shapes[0]]


def _identical(a, b) -> bool:
    """The same dims, decided without a guard: a symbolic dim is only ever compared with the same
    expression (``batch == 1`` asked of a tuple compare would make one specialization for batch 1
    and another for the rest, where broadcasting against a literal 1 needs no decision at all)."""
    return len(a) == len(b) and all(x is y or (isinstance(x, int) and isinstance(y, int) and same_dim(x, y))
                                    for x, y in zip(a, b))


def broadcast(shapes, values=None, **_attrs):
    first = shapes[0]
    # the common case, and cheap: no per-dim work
    if all(s is first or (s is not None and _identical(s, first)) for s in shapes):
        return [first]
    out: tuple = ()
    for s in shapes:
        if s is not None:
            out = broadcast_dims(out, s)
    return [out]


def prod(dims) -> int | Dimension:
    p: int | Dimension = 1
    for d in dims:
        p = d * p if isinstance(d, Dimension) else p * d
    return p


def is_static(dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def first_item(t):
    """The first element of a tensor (or of a symbolic value at compile time) as a Python number:
    a one-element tensor's ``item()`` directly (``t.reshape(-1)[0].item()`` costs ~3 us a call,
    ten times as much, and scalar inputs are read on every call). A device tensor's read is a host
    sync, counted (ops/host_sync.py)."""
    if getattr(t, "is_cuda", False):
        host_sync.count("scalar input read on the host", t)
    return t.item() if t.numel() == 1 else t.reshape(-1)[0].item()


def int_list(value) -> list[int]:
    """A shape-input value (CPU tensor, or a symbolic one at compile time) as a list of ints.
    Ints (SymInts included) are kept as they are: ``int()`` would pin a symbolic dim. A device
    tensor's read is a host sync, counted (ops/host_sync.py)."""
    if getattr(value, "is_cuda", False):
        host_sync.count("shape input read on the host", value)
    return [v if type(v) is int or isinstance(v, SymInt) else int(v) for v in value.reshape(-1).tolist()]


def dyn() -> Dimension:
    return Dimension.dynamic()


def dim_ceildiv_or_dyn(start, limit, delta) -> int:
    """Number of elements of Range(start, limit, delta)."""
    import math
    n = math.ceil((limit - start) / delta)  # an int for ints and floats; symbolic for SymInts
    return max(n, 0)

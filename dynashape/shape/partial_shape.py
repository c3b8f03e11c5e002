"""PartialShape: a static-rank shape whose dimensions may be dynamic ranges."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..errors import ShapeError
from .dimension import Dimension, DimLike


class PartialShape:
    """An immutable sequence of :class:`Dimension` with a known rank."""

    __slots__ = ("dims",)

    def __init__(self, dims: Iterable[DimLike | tuple] | str = ()) -> None:
        if isinstance(dims, str):  # "[1..8,3,224,224]", what repr prints (OpenVINO's notation)
            dims = _split(dims)
        self.dims: tuple[Dimension, ...] = tuple(Dimension.of(d) for d in dims)

    @staticmethod
    def of(shape: PartialShape | Iterable[DimLike]) -> PartialShape:
        return shape if isinstance(shape, PartialShape) else PartialShape(shape)

    # sequence protocol ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.dims)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __iter__(self) -> Iterator[Dimension]:
        return iter(self.dims)

    def __getitem__(self, i):
        return PartialShape(self.dims[i]) if isinstance(i, slice) else self.dims[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartialShape):
            return self.dims == other.dims
        if isinstance(other, (tuple, list)):
            return self == PartialShape(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.dims)

    def __repr__(self) -> str:
        return "[" + ",".join(repr(d) for d in self.dims) + "]"

    # queries -------------------------------------------------------------------------------
    @property
    def is_static(self) -> bool:
        return all(d.is_static for d in self.dims)

    def to_static(self, fill: str | None = None) -> tuple[int, ...]:
        """Concrete shape. Dynamic dims raise unless ``fill`` picks 'min', 'max' or 'opt'."""
        out = []
        for i, d in enumerate(self.dims):
            if d.is_static:
                out.append(d.min)
            elif fill == "min":
                out.append(d.min)
            elif fill == "max" and d.max is not None:
                out.append(d.max)
            elif fill == "opt" and d.optimals:
                out.append(d.optimals[-1])
            else:
                raise ShapeError(f"axis {i} of {self} is dynamic and has no {fill or 'static'} value")
        return tuple(out)

    def mismatch(self, shape: Sequence[int]) -> str | None:
        """Why a concrete shape does not fit, or None when it does."""
        if len(shape) != len(self.dims):
            return f"rank {len(shape)} given, rank {len(self.dims)} expected"
        for axis, (d, v) in enumerate(zip(self.dims, shape)):
            if not d.contains(v):
                return f"axis {axis} is {v}, expected a value in {d.range_str()}"
        return None

    def compatible(self, shape: Sequence[int] | PartialShape) -> bool:
        if isinstance(shape, PartialShape):
            try:
                self.merge(shape)
            except ShapeError:
                return False
            return True
        return self.mismatch(shape) is None

    # algebra -------------------------------------------------------------------------------
    def merge(self, other: PartialShape | Iterable[DimLike]) -> PartialShape:
        """Both shapes describe the same tensor: intersect dim by dim."""
        o = PartialShape.of(other)
        if len(o) != len(self):
            raise ShapeError(f"cannot merge {self} with {o}: ranks differ")
        return PartialShape(a.merge(b) for a, b in zip(self.dims, o.dims))

    def broadcast(self, other: PartialShape | Iterable[DimLike]) -> PartialShape:
        """Numpy-style multidirectional broadcast."""
        o = PartialShape.of(other)
        return PartialShape(broadcast_dims(self.dims, o.dims))


def broadcast_dim(a: Dimension | int, b: Dimension | int) -> Dimension | int:
    """Broadcast of two dims, each an int or a Dimension; ints in give an int out."""
    if isinstance(a, int) and isinstance(b, int):
        # a literal 1 first: against it nothing needs deciding (no guard on a symbolic dim)
        if type(b) is int and b == 1:
            return a
        if type(a) is int and a == 1:
            return b
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        raise ShapeError(f"dimensions {a} and {b} do not broadcast")
    da, db = Dimension.of(a), Dimension.of(b)
    if db.is_static and db.min == 1:
        return a
    if da.is_static and da.min == 1:
        return b
    if da.known_equal(db):
        return a
    if da.is_static and db.is_static:
        raise ShapeError(f"dimensions {a} and {b} do not broadcast")
    # One side may still be 1 at run time: the result is at least the larger minimum.
    if not da.contains(1) and not db.contains(1):
        merged = da.merge(db)
        return merged.min if merged.is_static else merged
    if da.is_static:
        return a if da.min != 0 else Dimension.dynamic()
    if db.is_static:
        return b if db.min != 0 else Dimension.dynamic()
    hi = None if da.max is None or db.max is None else max(da.max, db.max)
    return Dimension(min(da.min, db.min), hi)


def broadcast_dims(a: Sequence, b: Sequence) -> tuple:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(broadcast_dim(x, y) for x, y in zip(a, b))


def _split(text: str) -> list[str]:
    t = text.strip()
    if not (t.startswith("[") and t.endswith("]")):
        raise ShapeError(f"bad shape {text!r}: expected [d0,d1,...] (e.g. [1..8,3,224,224])")
    inner = t[1:-1].strip()
    if not inner:
        return []
    return inner.split(",")

"""A dimension that may be dynamic: a range [min, max] with optional hints.

The same type serves at compile time (ranges propagate through shape functions by interval
arithmetic) and in user options (``Dimension(1, 64, optimals=(1, 8))``). An int behaves as a
fixed Dimension wherever one is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

from ..errors import ShapeError

DimLike = Union["Dimension", int, None]


@dataclass(frozen=True)
class Dimension:
    """A dimension range; ``max=None`` means unbounded, ``min == max`` means fixed.

    ``symbol`` names the ONNX dim_param the dimension came from: two dims with the same symbol
    are known to be equal even when their range is wide, which shape functions use to prove
    that, say, two inputs sharing "batch" broadcast without a runtime check.
    """

    min: int = 0
    max: int | None = None
    optimals: tuple[int, ...] = ()
    symbol: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.min < 0:
            raise ShapeError(f"Dimension min must be >= 0, got {self.min}")
        if self.max is not None and self.max < self.min:
            raise ShapeError(f"Dimension max {self.max} is below min {self.min}")
        if not self.optimals:  # (the common case: a model's load makes ~10,000 Dimensions)
            return
        bad = [o for o in self.optimals if not self.contains(o)]
        if bad:
            raise ShapeError(f"optimal values {bad} lie outside the range {self.range_str()}")
        if self.optimals != tuple(sorted(set(self.optimals))):
            object.__setattr__(self, "optimals", tuple(sorted(set(self.optimals))))

    # construction -------------------------------------------------------------------------
    @staticmethod
    def of(value: DimLike | tuple) -> Dimension:
        """Coerce an int (fixed), None (fully dynamic), a (min, max) tuple or a Dimension."""
        if isinstance(value, Dimension):
            return value
        if value is None:
            return _DYNAMIC
        if type(value) is int and 0 <= value < _FIXED_CACHE:  # immutable: one instance per small value
            d = _FIXED.get(value)
            if d is None:
                d = _FIXED[value] = Dimension(value, value)
            return d
        if isinstance(value, tuple):
            return Dimension(*value)
        if isinstance(value, str):
            return Dimension.parse(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:  # ONNX and torch use -1 for "unknown"
                return Dimension()
            return Dimension(value, value)
        raise ShapeError(f"cannot make a Dimension from {value!r} ({type(value).__name__})")

    @staticmethod
    def parse(text: str) -> Dimension:
        """The inverse of ``repr``: ``"3"`` (fixed), ``"?"`` or ``"-1"`` (dynamic), ``"1..8"``,
        ``"1.."``, ``"..8"``, with an optional ``"name:"`` in front and ``"@4/8"`` (optimal
        values) behind; OpenVINO writes dims so, less the name and the optimals."""
        t = text.strip()
        symbol = None
        if ":" in t:
            symbol, t = (x.strip() for x in t.split(":", 1))
            if not symbol.isidentifier():
                raise ShapeError(f"bad dimension {text!r}: {symbol!r} is not a name")
        body, _, opt = t.partition("@")
        try:
            optimals = tuple(int(o) for o in opt.split("/")) if opt else ()
            body = body.strip()
            if body in ("?", "-1", ""):
                lo, hi = 0, None
            elif ".." in body:
                a, b = body.split("..", 1)
                lo, hi = (int(a) if a.strip() else 0), (int(b) if b.strip() else None)
            else:
                lo = hi = int(body)
        except ValueError:
            raise ShapeError(f"bad dimension {text!r}: expected N, MIN..MAX, MIN.., ..MAX or ?, "
                             f"optionally name: in front and @OPT/... behind") from None
        return Dimension(lo, hi, optimals, symbol)

    @staticmethod
    def dynamic(symbol: str | None = None) -> Dimension:
        return Dimension(0, None, (), symbol)

    def with_symbol(self, symbol: str | None) -> Dimension:
        return Dimension(self.min, self.max, self.optimals, symbol)

    # queries ------------------------------------------------------------------------------
    @property
    def is_static(self) -> bool:
        return self.max is not None and self.min == self.max

    @property
    def is_dynamic(self) -> bool:
        return not self.is_static

    def contains(self, value: int) -> bool:
        return value >= self.min and (self.max is None or value <= self.max)

    def known_equal(self, other: DimLike) -> bool:
        """True when both are provably the same value (same fixed value or same symbol)."""
        o = Dimension.of(other)
        if self.is_static and o.is_static:
            return self.min == o.min
        return self.symbol is not None and self.symbol == o.symbol

    def range_str(self) -> str:
        hi = "inf" if self.max is None else str(self.max)
        return f"[{self.min}, {hi}]"

    def __int__(self) -> int:
        if not self.is_static:
            raise ShapeError(f"dimension {self} is dynamic; it has no single value")
        return self.min

    def __repr__(self) -> str:
        if self.is_static:
            return str(self.min)
        name = f"{self.symbol}:" if self.symbol else ""
        if self.min == 0 and self.max is None:
            body = "?"
        else:
            body = f"{self.min}..{'' if self.max is None else self.max}"
        opt = f"@{'/'.join(map(str, self.optimals))}" if self.optimals else ""
        return f"{name}{body}{opt}"

    # set operations -----------------------------------------------------------------------
    def merge(self, other: DimLike) -> Dimension:
        """Intersection of two ranges that must describe the same dimension."""
        o = Dimension.of(other)
        lo = max(self.min, o.min)
        his = [h for h in (self.max, o.max) if h is not None]
        hi = min(his) if his else None
        if hi is not None and hi < lo:
            raise ShapeError(f"dimensions {self} and {o} cannot be equal: their ranges do not overlap")
        opts = tuple(v for v in set(self.optimals) | set(o.optimals) if lo <= v and (hi is None or v <= hi))
        return Dimension(lo, hi, opts, self.symbol or o.symbol)

    def union(self, other: DimLike) -> Dimension:
        """Smallest range holding both (used where either may occur, e.g. If branches)."""
        o = Dimension.of(other)
        hi = None if self.max is None or o.max is None else max(self.max, o.max)
        sym = self.symbol if self.symbol == o.symbol else None
        return Dimension(min(self.min, o.min), hi, (), sym)

    # interval arithmetic, so shape functions written with + - * // work on ranges -------------
    def __add__(self, other: DimLike) -> Dimension | int:
        o = Dimension.of(other)
        hi = None if self.max is None or o.max is None else self.max + o.max
        return _fold(Dimension(self.min + o.min, hi))

    __radd__ = __add__

    def __sub__(self, other: DimLike) -> Dimension | int:
        o = Dimension.of(other)
        if self.known_equal(o):
            return 0
        lo = max(0, self.min - (o.max if o.max is not None else self.min))
        hi = None if self.max is None else max(0, self.max - o.min)
        return _fold(Dimension(lo, hi))

    def __rsub__(self, other: DimLike) -> Dimension | int:
        return Dimension.of(other) - self

    def __mul__(self, other: DimLike) -> Dimension | int:
        o = Dimension.of(other)
        if o.is_static and o.min == 1:
            return self
        if self.is_static and self.min == 1:
            return o
        if (o.is_static and o.min == 0) or (self.is_static and self.min == 0):
            return 0
        hi = None if self.max is None or o.max is None else self.max * o.max
        return _fold(Dimension(self.min * o.min, hi))

    __rmul__ = __mul__

    def __floordiv__(self, other: DimLike) -> Dimension | int:
        o = Dimension.of(other)
        if o.is_static and o.min == 1:
            return self
        lo = self.min // o.max if o.max else 0
        hi = None if self.max is None else (self.max // max(o.min, 1))
        return _fold(Dimension(lo, hi))

    def ceildiv(self, other: DimLike) -> Dimension | int:
        o = Dimension.of(other)
        lo = -(-self.min // o.max) if o.max else 0
        hi = None if self.max is None else -(-self.max // max(o.min, 1))
        return _fold(Dimension(lo, hi))


def _fold(d: Dimension) -> Dimension | int:
    return d.min if d.is_static else d


def dim_ceildiv(a: Dimension | int, b: Dimension | int) -> Dimension | int:
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return Dimension.of(a).ceildiv(b)


# Exporters write these where they mean "unknown", not "the same as every other axis so named":
# PaddleOCR writes '?', tf2onnx 'unk__123', some tools '-1', 'None', 'dim_0' or 'DynamicDimension'.
_PLACEHOLDER = re.compile(r"^(\?|-1|none|null|unk__\d+|dim_?\d*|DynamicDimension.*|)$", re.IGNORECASE)


def is_placeholder(name: str | None) -> bool:
    """Whether a dim name means "unknown" rather than a symbol shared by the axes carrying it."""
    return name is None or bool(_PLACEHOLDER.match(name.strip()))



_DYNAMIC = Dimension()  # Dimension.of(None): frozen, so one instance serves
_FIXED: dict[int, Dimension] = {}  # Dimension.of(n) for small n
_FIXED_CACHE = 1 << 16

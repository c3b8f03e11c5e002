"""Symbolic integer expressions: the dims of a shape program, written over the input symbols.

An ``Expr`` is a polynomial with integer coefficients in *atoms*; an atom is a symbol name
(``"batch"``) or an opaque operation that does not distribute (``a // b``, ``a % b``,
``max(a, b)``, ``min(a, b)``). The form is canonical (terms sorted, like terms merged, zero
terms dropped), so two expressions that are equal as polynomials compare and hash equal: that is
what lets a shape program decide ``past + seq == seq + past`` without looking at any value.

Small on purpose: shape arithmetic in exported models is sums and products of dims, with the
odd floor division (convolutions, pooling) and clamp (Slice). Anything richer stays opaque.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

INF = float("inf")
Bounds = tuple[float, float]


class Op:
    """An opaque atom: ``kind`` is one of ``//``, ``%``, ``max``, ``min``; args are Exprs."""

    __slots__ = ("kind", "args", "key", "_hash")

    def __init__(self, kind: str, args: tuple[Expr, ...]) -> None:
        self.kind, self.args = kind, args
        self.key = f"{kind}({', '.join(a.key for a in args)})"
        self._hash = hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, Op) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash


Atom = "str | Op"


def _akey(a) -> str:
    return a if isinstance(a, str) else a.key


class Expr:
    """const + sum(coeff * product(atoms)); immutable and canonical."""

    __slots__ = ("const", "terms", "key", "_hash", "_free")

    def __init__(self, const: int, terms: tuple = ()) -> None:
        self.const = const
        self.terms = terms  # ((atoms tuple sorted by key, coeff), ...) sorted by atom keys
        parts = [str(const)] if const or not terms else []
        parts += [f"{c}*{'*'.join(_akey(a) for a in m)}" for m, c in terms]
        self.key = " + ".join(parts)
        self._hash = hash(self.key)
        self._free: frozenset[str] | None = None

    # ---- identity ----------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, Expr) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Expr({source(self)})"

    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def free(self) -> frozenset[str]:
        """The symbol names this expression reads (through opaque atoms too)."""
        if self._free is None:
            names: set[str] = set()
            for mono, _ in self.terms:
                for a in mono:
                    if isinstance(a, str):
                        names.add(a)
                    else:
                        for arg in a.args:
                            names |= arg.free
            self._free = frozenset(names)
        return self._free


def const(c: int) -> Expr:
    return Expr(int(c))


def sym(name: str) -> Expr:
    return Expr(0, (((name,), 1),))


def as_expr(x: Expr | int) -> Expr:
    return x if isinstance(x, Expr) else Expr(int(x))


def as_int(e: Expr | int) -> int | None:
    """The value of a constant expression, else None."""
    if isinstance(e, Expr):
        return e.const if not e.terms else None
    return int(e)


def _make(const_: int, acc: dict) -> Expr:
    terms = tuple(sorted(((m, c) for m, c in acc.items() if c), key=lambda t: tuple(_akey(a) for a in t[0])))
    return Expr(const_, terms)


def add(a: Expr | int, b: Expr | int) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if not b.terms:
        return a if not b.const else Expr(a.const + b.const, a.terms)
    if not a.terms:
        return b if not a.const else Expr(a.const + b.const, b.terms)
    acc = dict(a.terms)
    for m, c in b.terms:
        acc[m] = acc.get(m, 0) + c
    return _make(a.const + b.const, acc)


def scale(a: Expr | int, k: int) -> Expr:
    a = as_expr(a)
    if k == 1:
        return a
    if k == 0:
        return Expr(0)
    return Expr(a.const * k, tuple((m, c * k) for m, c in a.terms))


def neg(a: Expr | int) -> Expr:
    return scale(a, -1)


def sub(a: Expr | int, b: Expr | int) -> Expr:
    return add(a, neg(b))


def mul(a: Expr | int, b: Expr | int) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if not a.terms:
        return scale(b, a.const)
    if not b.terms:
        return scale(a, b.const)
    acc: dict = {}
    a_items = [((), a.const)] + list(a.terms) if a.const else list(a.terms)
    b_items = [((), b.const)] + list(b.terms) if b.const else list(b.terms)
    const_ = 0
    for ma, ca in a_items:
        for mb, cb in b_items:
            m = tuple(sorted(ma + mb, key=_akey))
            if not m:
                const_ += ca * cb
            else:
                acc[m] = acc.get(m, 0) + ca * cb
    return _make(const_, acc)


def _atom(op: Op) -> Expr:
    return Expr(0, (((op,), 1),))


def _multiple(a: Expr, b: Expr) -> int | None:
    """k when ``a == k * b`` as polynomials (Reshape's -1: 64*(p+1) over 16*(p+1) is 4)."""
    if not b.terms:
        return None
    m, c = b.terms[0]
    ca = dict(a.terms).get(m, 0)
    if ca % c:
        return None
    k = ca // c
    return k if sub(a, scale(b, k)).key == "0" else None


def _divide_by_monomial(a: Expr, b: Expr) -> Expr | None:
    """``a / b`` when ``b`` is one term ``c * m`` dividing every term of ``a`` exactly (as in
    ``batch * seq * 64 // seq``), else None."""
    if len(b.terms) != 1 or b.const or a.const:
        return None
    (m, c), = b.terms
    acc: dict = {}
    for ma, ca in a.terms:
        rest = list(ma)
        for atom in m:
            if atom not in rest:
                return None
            rest.remove(atom)
        if ca % c:
            return None
        key = tuple(rest)
        if not key:
            return None  # a constant term: keep it simple
        acc[key] = acc.get(key, 0) + ca // c
    return _make(0, acc)


def floordiv(a: Expr | int, b: Expr | int, ranges: Mapping | None = None) -> Expr:
    a, b = as_expr(a), as_expr(b)
    k = _multiple(a, b)
    if k is not None:
        return Expr(k)
    q = _divide_by_monomial(a, b)
    if q is not None:
        return q
    kb = as_int(b)
    if kb is not None:
        if kb == 0:
            raise ZeroDivisionError("shape expression divided by zero")
        if not a.terms:
            return Expr(a.const // kb)
        if kb == 1:
            return a
        if kb > 0 and a.const % kb == 0 and all(c % kb == 0 for _, c in a.terms):
            return Expr(a.const // kb, tuple((m, c // kb) for m, c in a.terms))
        if kb > 0 and ranges is not None:
            lo, hi = bounds(a, ranges)
            if lo >= 0 and hi < kb:
                return Expr(0)
    return _atom(Op("//", (a, b)))


def mod(a: Expr | int, b: Expr | int, ranges: Mapping | None = None) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if _multiple(a, b) is not None or _divide_by_monomial(a, b) is not None:
        return Expr(0)
    kb = as_int(b)
    if kb is not None:
        if kb == 0:
            raise ZeroDivisionError("shape expression modulo zero")
        if not a.terms:
            return Expr(a.const % kb)
        if kb == 1 or (all(c % kb == 0 for _, c in a.terms)):
            return Expr(a.const % kb)
        if kb > 0 and ranges is not None:
            lo, hi = bounds(a, ranges)
            if lo >= 0 and hi < kb:
                return a
    return _atom(Op("%", (a, b)))


def _minmax(kind: str, a: Expr | int, b: Expr | int, ranges: Mapping | None) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a == b:
        return a
    lo, hi = bounds(sub(a, b), ranges or {})
    if lo >= 0:
        return a if kind == "max" else b
    if hi <= 0:
        return b if kind == "max" else a
    args = tuple(sorted((a, b), key=lambda e: e.key))
    return _atom(Op(kind, args))


def maximum(a: Expr | int, b: Expr | int, ranges: Mapping | None = None) -> Expr:
    return _minmax("max", a, b, ranges)


def minimum(a: Expr | int, b: Expr | int, ranges: Mapping | None = None) -> Expr:
    return _minmax("min", a, b, ranges)


# ---- evaluation -------------------------------------------------------------------------------
def evaluate(e: Expr | int, env: Mapping[str, int]) -> int:
    if not isinstance(e, Expr):
        return int(e)
    total = e.const
    for mono, c in e.terms:
        p = c
        for a in mono:
            p *= env[a] if isinstance(a, str) else _eval_op(a, env)
        total += p
    return total


def _eval_op(op: Op, env: Mapping[str, int]) -> int:
    x, y = (evaluate(a, env) for a in op.args)
    if op.kind == "//":
        return x // y
    if op.kind == "%":
        return x % y
    return max(x, y) if op.kind == "max" else min(x, y)


def _mul_bounds(x: Bounds, y: Bounds) -> Bounds:
    vals = []
    for p in x:
        for q in y:
            if (p == 0 and abs(q) == INF) or (q == 0 and abs(p) == INF):
                vals.append(0)
            else:
                vals.append(p * q)
    return min(vals), max(vals)


def _atom_bounds(a, ranges: Mapping) -> Bounds:
    if isinstance(a, str):
        return ranges.get(a, (0, INF))
    x, y = (bounds(arg, ranges) for arg in a.args)
    if a.kind == "max":
        return max(x[0], y[0]), max(x[1], y[1])
    if a.kind == "min":
        return min(x[0], y[0]), min(x[1], y[1])
    if a.kind == "%":
        if y[0] > 0:
            return (0, y[1] - 1) if x[0] >= 0 else (-(y[1] - 1), y[1] - 1)
        return -INF, INF
    # floor division by a positive divisor is monotone in the dividend
    if y[0] > 0 and y[0] == y[1] and y[0] != INF:
        d = y[0]
        return (x[0] // d if x[0] != -INF else -INF), (x[1] // d if x[1] != INF else INF)
    if y[0] > 0 and x[0] >= 0:
        return 0, (x[1] // y[0] if x[1] != INF else INF)
    return -INF, INF


def bounds(e: Expr | int, ranges: Mapping) -> Bounds:
    """Interval of values ``e`` can take when each symbol lies in ``ranges[name]`` (inclusive;
    a symbol not listed is a size: [0, inf))."""
    if not isinstance(e, Expr):
        return e, e
    lo = hi = e.const
    for mono, c in e.terms:
        b: Bounds = (c, c)
        for a in mono:
            b = _mul_bounds(b, _atom_bounds(a, ranges))
        lo, hi = lo + b[0], hi + b[1]
    return lo, hi


# ---- Python source ----------------------------------------------------------------------------
def source(e: Expr | int, name: Callable[[str], str] | None = None) -> str:
    """Python source computing ``e``; ``name`` maps a symbol to the variable that holds it."""
    if not isinstance(e, Expr):
        return str(int(e))
    name = name or (lambda s: s)
    parts: list[str] = []
    for mono, c in e.terms:
        factors = [name(a) if isinstance(a, str) else _op_source(a, name) for a in mono]
        body = "*".join(factors)
        if c == 1:
            parts.append(body)
        elif c == -1:
            parts.append(f"-{body}")
        else:
            parts.append(f"{c}*{body}")
    if e.const or not parts:
        parts.append(str(e.const))
    text = parts[0]
    for p in parts[1:]:
        text += f" - {p[1:]}" if p.startswith("-") else f" + {p}"
    return text


def _op_source(op: Op, name) -> str:
    x, y = (source(a, name) for a in op.args)
    if op.kind in ("max", "min"):
        return f"{op.kind}({x}, {y})"
    return f"(({x}) {op.kind} ({y}))"


def monotone(e: Expr | int) -> bool:
    """Whether ``e`` never decreases when any symbol grows (sizes planned at an upper bound of
    the symbols must be upper bounds of the sizes): non-negative coefficients over symbols and
    over floor divisions, max and min of such expressions by positive constants."""
    if not isinstance(e, Expr):
        return True
    for mono, c in e.terms:
        if c < 0:
            return False
        for a in mono:
            if isinstance(a, str):
                continue
            if not _monotone_atom(a):
                return False
            # in a product, a factor that may be negative turns growth of the others into decrease
            if len(mono) > 1 and not _nonnegative(a):
                return False
    return True


def _monotone_atom(a: Op) -> bool:
    if a.kind in ("max", "min"):
        return all(monotone(x) for x in a.args)
    return a.kind == "//" and monotone(a.args[0]) and (as_int(a.args[1]) or 0) > 0


def _nonnegative(e: Expr | Op) -> bool:
    """Sure to be >= 0 for any non-negative symbols (an atom already known monotone)."""
    if isinstance(e, Op):
        if e.kind == "max":
            return any(_nonnegative(x) for x in e.args)
        if e.kind == "min":
            return all(_nonnegative(x) for x in e.args)
        return _nonnegative(e.args[0])  # // by a positive constant
    return e.const >= 0 and all(c >= 0 and all(isinstance(a, str) or _nonnegative(a) for a in m) for m, c in e.terms)

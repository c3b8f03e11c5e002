"""SymInt and ShapeEnv: the op shape functions, run over symbols instead of numbers.

A shape program is derived by running every node's ordinary shape function (the same one the
interpreter calls with ints) on ``SymInt``s: ints that also carry an ``Expr`` over the input
symbols. Arithmetic builds expressions. A decision (``d == 1``, ``max(st, 0)``, ``if d:``) is
first tried from the symbols' ranges; when the ranges cannot decide it, the *hint* (the value
of the signature being traced) answers it and the answer is recorded as a guard. The program is
valid for every signature that satisfies its guards; one that does not gets a program of its own.

``int(d)`` / ``float(d)`` turn a SymInt into a plain number: the value is pinned by a guard
(``d == 7``), which is always right but makes the program specific to that value. A symbol
without a hint (a dim that only exists once a data-dependent node ran) cannot answer a
decision: ``NeedsConcrete`` is raised and the caller runs that node concretely instead.

SymInt subclasses int so that shape functions take their run-time (int) paths unchanged; what
Python does on an int without asking the object (``range(d)``, ``lst[d]``) silently uses the
hint, which the shape program detects after the fact (a dim that became a plain int while no
guard pinned it) and treats as a node to run concretely.
"""

from __future__ import annotations

import itertools

from . import expr as E

Expr = E.Expr
_BIG = 1 << 62  # dims above this do not exist: lets ranges decide "d < INT64_MAX" and the like
UNHINTED = (1 << 40) + 7  # the int value of a SymInt nobody may read: absurd, so that silent use fails loudly


class NeedsConcrete(Exception):
    """A decision depends on a symbol whose value exists only at run time."""


class Guard:
    """``expr <kind> 0`` with kind one of ``==``, ``!=``, ``>=``; true for the traced signature."""

    __slots__ = ("kind", "expr")

    def __init__(self, kind: str, expr: Expr) -> None:
        self.kind, self.expr = kind, expr

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.expr.key

    def holds(self, env) -> bool:
        v = E.evaluate(self.expr, env)
        return v == 0 if self.kind == "==" else v != 0 if self.kind == "!=" else v >= 0

    def source(self, name) -> str:
        return f"{E.source(self.expr, name)} {self.kind} 0"

    def __repr__(self) -> str:
        return f"Guard({self.source(lambda s: s)})"


class ShapeEnv:
    """The symbols of one trace: hints, ranges, guards and the replacements guards allow."""

    def __init__(self) -> None:
        self.hints: dict[str, int] = {}
        self.ranges: dict[str, tuple[float, float]] = {}
        self.order: dict[str, int] = {}  # creation order: a later symbol is replaced by an earlier one
        self.replace: dict[str, Expr] = {}
        self.guards: dict[tuple[str, str], Guard] = {}
        self.pins = 0  # guards made by int()/float(): each makes the program specific to one value
        self._n = itertools.count()
        # expression -> its value at the hints: a symbol's hint is set once, when it is made, so a
        # value never changes; a trace asks again and again for the same sizes (a YOLOv8n trace
        # evaluated 24,564 expression nodes, 36 ms of its 230)
        self._values: dict[Expr, int] = {}

    # ---- symbols ------------------------------------------------------------------------------
    def symbol(self, name: str, hint: int | None, lo: int = 0, hi: int | None = None) -> SymInt:
        if name in self.order:
            raise ValueError(f"symbol {name!r} made twice")
        self.order[name] = next(self._n)
        self.ranges[name] = (lo, _BIG if hi is None else hi)
        if hint is not None:
            self.hints[name] = int(hint)
        return SymInt(self.hint_of(E.sym(name)), E.sym(name), self)

    def wrap(self, e: Expr | int) -> SymInt:
        """A SymInt with the hint's value. A constant stays a SymInt: it was derived from symbols
        (say ``seq`` after a guard made it 1), which tells it from a dim a shape function fixed
        by using a symbol as a plain number (see ``compile/shape_program.py``)."""
        e = self.canon(e)
        return SymInt(self.hint_of(e), e, self)

    def canon(self, e: Expr | int) -> Expr:
        e = E.as_expr(e)
        if self.replace and e.free & self.replace.keys():
            e = substitute(e, self.replace)
        return e

    def hint_of(self, e: Expr) -> int:
        v = self._values.get(e)
        if v is not None:
            return v
        try:
            v = E.evaluate(e, self.hints)
        except KeyError:
            return UNHINTED
        self._values[e] = v
        return v

    def hinted(self, e: Expr) -> bool:
        return all(s in self.hints for s in e.free)

    # ---- decisions ----------------------------------------------------------------------------
    def decide(self, kind: str, e: Expr) -> bool:
        """Truth of ``e <kind> 0`` (kind ``==``, ``!=``, ``>=``): from ranges, else from the hint
        (recorded as a guard)."""
        e = self.canon(e)
        lo, hi = E.bounds(e, self.ranges)
        if kind == ">=":
            if lo >= 0:
                return True
            if hi < 0:
                return False
        else:
            if lo == hi == 0:
                return kind == "=="
            if lo > 0 or hi < 0:
                return kind == "!="
        if not self.hinted(e):
            raise NeedsConcrete(f"{E.source(e)} {kind} 0 depends on a value known only at run time")
        v = self.hint_of(e)
        truth = v == 0 if kind == "==" else v != 0 if kind == "!=" else v >= 0
        if truth:
            self._guard(kind, e)
        elif kind == ">=":
            self._guard(">=", E.sub(E.neg(e), 1))  # not (e >= 0)  <=>  -e - 1 >= 0
        else:
            self._guard("!=" if kind == "==" else "==", e)
        return truth

    def _guard(self, kind: str, e: Expr) -> None:
        g = Guard(kind, e)
        self.guards.setdefault(g.key, g)
        if kind == "==":
            self._learn_equality(e)
        else:
            self._refine_range(kind, e)

    def _refine_range(self, kind: str, e: Expr) -> None:
        """A guard on one symbol (``c*s + k >= 0``, ``c*s + k != 0``) narrows its range; a range
        narrowed to one value is an equality, learnt as one (``seq >= 1`` and ``seq <= 1`` make
        ``seq == 1``: a second pass of the trace then knows it from the start, as if a node had
        asked ``seq == 1`` itself)."""
        if len(e.terms) != 1:
            return
        mono, c = e.terms[0]
        if len(mono) != 1 or not isinstance(mono[0], str) or mono[0] in self.replace:
            return
        name, k = mono[0], e.const
        lo, hi = self.ranges.get(name, (0, _BIG))
        if kind == ">=":
            if c > 0:
                lo = max(lo, -(k // c))  # c*s >= -k  ->  s >= ceil(-k / c)
            else:
                hi = min(hi, k // -c)  # -|c|*s + k >= 0  ->  s <= floor(k / |c|)
        elif kind == "!=" and k % c == 0:
            v = -k // c
            lo, hi = (lo + 1, hi) if v == lo else (lo, hi - 1) if v == hi else (lo, hi)
        self.ranges[name] = (lo, hi)
        if lo == hi:
            self._guard("==", E.sub(E.sym(name), int(lo)))

    def _learn_equality(self, e: Expr) -> None:
        """``e == 0`` with a symbol of coefficient +-1 in a linear ``e``: later expressions use the
        solved form, so that e.g. ``seq == 1`` makes ``past + seq`` into ``past + 1``."""
        if any(len(m) != 1 for m, _ in e.terms):
            return
        cands = [(self.order.get(m[0], -1), m[0], c) for m, c in e.terms
                 if isinstance(m[0], str) and c in (1, -1) and m[0] not in self.replace]
        if not cands:
            return
        _, name, c = max(cands)  # the newest symbol goes: expressions keep the oldest names
        rest = E.sub(e, E.scale(E.sym(name), c))  # e = c*name + rest = 0  ->  name = -rest / c
        value = E.scale(rest, -c)  # c is +-1, so -rest/c == -c*rest
        self.replace[name] = value
        for k, v in list(self.replace.items()):
            if name in v.free:
                self.replace[k] = substitute(v, {name: value})

    def pin(self, s: SymInt) -> int:
        """``int(s)``: the value, made true for every signature by a guard."""
        e = self.canon(s.expr)
        if E.as_int(e) is not None:
            return E.as_int(e)
        if not self.hinted(e):
            raise NeedsConcrete(f"the value of {E.source(e)} is known only at run time")
        v = E.evaluate(e, self.hints)
        self.pins += 1
        self._guard("==", E.sub(e, v))
        return v

    def guard_list(self) -> list[Guard]:
        return list(self.guards.values())


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """``e`` with the symbols of ``mapping`` replaced by their expressions."""
    total: Expr = E.const(e.const)
    for mono, c in e.terms:
        p: Expr = E.const(c)
        for a in mono:
            if isinstance(a, str):
                p = E.mul(p, mapping.get(a, E.sym(a)))
            else:
                args = [substitute(x, mapping) for x in a.args]
                p = E.mul(p, _rebuild(a.kind, args))
        total = E.add(total, p)
    return total


def _rebuild(kind: str, args: list[Expr]) -> Expr:
    if kind == "//":
        return E.floordiv(*args)
    if kind == "%":
        return E.mod(*args)
    return E.maximum(*args) if kind == "max" else E.minimum(*args)


def _other(o) -> Expr | None:
    if isinstance(o, SymInt):
        return o.expr
    if isinstance(o, int):
        return E.const(o)
    return None


class SymInt(int):
    """An int that is also an expression over the trace's symbols (see the module docstring)."""

    def __new__(cls, value: int, expr: Expr, env: ShapeEnv):
        obj = int.__new__(cls, value)
        obj.expr = expr
        obj.env = env
        return obj

    def __repr__(self) -> str:
        return f"SymInt({E.source(self.expr)}={int.__int__(self)})"

    __hash__ = int.__hash__

    # ---- arithmetic: a new expression -------------------------------------------------------
    def _arith(self, o, fn, flt, swap: bool = False):
        oe = _other(o)
        if oe is None:
            if isinstance(o, float) and o.is_integer():  # 2.0 is exact: the same as 2 (a Cast to float)
                oe = E.const(int(o))
            elif isinstance(o, float):  # other float arithmetic pins the value
                a = float(self)
                return flt(o, a) if swap else flt(a, o)
            else:
                return NotImplemented
        a, b = (oe, self.expr) if swap else (self.expr, oe)
        return self.env.wrap(fn(a, b))

    def __add__(self, o):
        return self._arith(o, E.add, lambda a, b: a + b)

    def __radd__(self, o):
        return self._arith(o, E.add, lambda a, b: a + b, True)

    def __sub__(self, o):
        return self._arith(o, E.sub, lambda a, b: a - b)

    def __rsub__(self, o):
        return self._arith(o, E.sub, lambda a, b: a - b, True)

    def __mul__(self, o):
        if isinstance(o, (list, tuple, str)):
            return NotImplemented
        if isinstance(o, float):
            scaled = _by_dyadic(self, o)
            if scaled is not None:
                return scaled
        return self._arith(o, E.mul, lambda a, b: a * b)

    def __rmul__(self, o):
        if isinstance(o, (list, tuple, str)):
            return o * int(self)  # repeating a sequence pins the count
        if isinstance(o, float):
            scaled = _by_dyadic(self, o)
            if scaled is not None:
                return scaled
        return self._arith(o, E.mul, lambda a, b: a * b, True)

    def _div_ranges(self):
        return self.env.ranges

    def _nonzero(self, divisor) -> None:
        """A symbolic divisor is not zero for this signature (a guard where the ranges do not say
        so): the simplifications of ``//`` and ``%`` (``k*b // b == k``) hold only then, and a zero
        divisor must fail here, as it fails in the interpreter, not vanish into a constant."""
        e = divisor if isinstance(divisor, E.Expr) else _other(divisor)
        if e is None:
            return
        e = self.env.canon(e)  # a symbol a guard has made 0 is 0
        if (e.const == 0) if e.is_const else not self.env.decide("!=", e):
            raise ZeroDivisionError(f"{E.source(e)} is 0: integer division or modulo by zero")

    def __floordiv__(self, o):
        self._nonzero(o)
        return self._arith(o, lambda a, b: E.floordiv(a, b, self._div_ranges()), lambda a, b: a // b)

    def __rfloordiv__(self, o):
        self._nonzero(self)
        return self._arith(o, lambda a, b: E.floordiv(a, b, self._div_ranges()), lambda a, b: a // b, True)

    def __mod__(self, o):
        self._nonzero(o)
        return self._arith(o, lambda a, b: E.mod(a, b, self._div_ranges()), lambda a, b: a % b)

    def __rmod__(self, o):
        self._nonzero(self)
        return self._arith(o, lambda a, b: E.mod(a, b, self._div_ranges()), lambda a, b: a % b, True)

    def __divmod__(self, o):
        return self // o, self % o

    def __truediv__(self, o):
        oe = _other(o)
        if oe is None and isinstance(o, float) and o.is_integer() and o:
            oe = E.const(int(o))
        if oe is None:
            return float(self) / o if isinstance(o, float) else NotImplemented
        self._nonzero(oe)
        return SymFrac(self.expr, oe, self.env)

    def __rtruediv__(self, o):
        oe = _other(o)
        if oe is None and isinstance(o, float) and o.is_integer():
            oe = E.const(int(o))
        if oe is None:
            return o / float(self) if isinstance(o, float) else NotImplemented
        self._nonzero(self)
        return SymFrac(oe, self.expr, self.env)

    def __neg__(self):
        return self.env.wrap(E.neg(self.expr))

    def __pos__(self):
        return self

    def __abs__(self):
        return self if self >= 0 else -self

    def __pow__(self, o, mod_=None):
        if isinstance(o, int) and not isinstance(o, SymInt) and o >= 0 and mod_ is None:
            r: int | SymInt = 1
            for _ in range(o):
                r = r * self
            return r
        return pow(int(self), int(o) if isinstance(o, SymInt) else o, mod_)

    def __trunc__(self):
        return self

    def __floor__(self):
        return self

    def __ceil__(self):
        return self

    def __round__(self, n=None):
        return self

    # ---- decisions: a guard when the ranges cannot tell --------------------------------------
    def _cmp(self, o, kind: str, flip: bool, off: int = 0):
        oe = _other(o)
        if oe is None:
            if isinstance(o, float):
                return _FLOAT_CMP[(kind, flip, off)](float(self), o)
            return NotImplemented
        d = E.sub(oe, self.expr) if flip else E.sub(self.expr, oe)
        return self.env.decide(kind, E.add(d, off) if off else d)

    def __eq__(self, o):
        return self._cmp(o, "==", False)

    def __ne__(self, o):
        return self._cmp(o, "!=", False)

    def __ge__(self, o):  # self - o >= 0
        return self._cmp(o, ">=", False)

    def __le__(self, o):  # o - self >= 0
        return self._cmp(o, ">=", True)

    def __gt__(self, o):  # self - o - 1 >= 0
        return self._cmp(o, ">=", False, -1)

    def __lt__(self, o):  # o - self - 1 >= 0
        return self._cmp(o, ">=", True, -1)

    def __bool__(self):
        return self.env.decide("!=", self.expr)

    # ---- leaving the symbolic world: pinned by a guard ----------------------------------------
    def __int__(self):
        return self.env.pin(self)

    def __index__(self):
        return self.env.pin(self)

    def __float__(self):
        return float(self.env.pin(self))

    def _bits(self, o, fn):
        return fn(int(self), int(o) if isinstance(o, SymInt) else o)

    def __and__(self, o):
        return self._bits(o, lambda a, b: a & b)

    __rand__ = __and__

    def __or__(self, o):
        return self._bits(o, lambda a, b: a | b)

    __ror__ = __or__

    def __xor__(self, o):
        return self._bits(o, lambda a, b: a ^ b)

    __rxor__ = __xor__

    def __lshift__(self, o):
        return self._bits(o, lambda a, b: a << b)

    def __rshift__(self, o):
        return self._bits(o, lambda a, b: a >> b)

    def __invert__(self):
        return ~int(self)


def _by_dyadic(d: SymInt, f: float):
    """``d * f`` for a float with a short binary fraction (2.0, 0.5, 1.5: Resize scales): an
    exact SymInt for a whole number, else a fraction whose floor and ceil stay symbolic. Such a
    product is exact in float64 too, so the result is the one plain floats give; other floats pin."""
    if f != f or f in (float("inf"), float("-inf")):
        return None
    p, q = f.as_integer_ratio()
    if q == 1:
        return d * p
    if q > (1 << 16):
        return None
    return SymFrac(E.mul(d.expr, p), E.const(q), d.env)


_FLOAT_CMP = {
    ("==", False, 0): lambda a, b: a == b, ("!=", False, 0): lambda a, b: a != b,
    (">=", False, 0): lambda a, b: a >= b, (">=", True, 0): lambda a, b: a <= b,
    (">=", False, -1): lambda a, b: a > b, (">=", True, -1): lambda a, b: a < b,
}


class SymFrac:
    """``a / b`` of two SymInts: what shape functions write as ``math.ceil((l - s) / d)``.
    ceil and floor stay symbolic; anything else pins the value to a float."""

    def __init__(self, num: Expr, den: Expr, env: ShapeEnv) -> None:
        self.num, self.den, self.env = num, den, env

    def _value(self) -> float:
        n, d = (self.env.pin(SymInt(self.env.hint_of(x), x, self.env)) if E.as_int(x) is None else E.as_int(x)
                for x in (self.num, self.den))
        return n / d

    def __floor__(self):
        return self.env.wrap(E.floordiv(self.num, self.den, self.env.ranges))

    def __ceil__(self):  # ceil(a / b) = -((-a) // b)
        return self.env.wrap(E.neg(E.floordiv(E.neg(self.num), self.den, self.env.ranges)))

    def __trunc__(self):
        num_nonneg = SymInt(self.env.hint_of(self.num), self.num, self.env) >= 0 if E.as_int(self.num) is None \
            else E.as_int(self.num) >= 0
        return self.__floor__() if num_nonneg else self.__ceil__()

    def __int__(self):
        return int(self.__trunc__())

    def __float__(self):
        return self._value()

    def __getattr__(self, name):  # any other use: as the float it stands for
        return getattr(self._value(), name)

    __hash__ = None


def _as_float(op: str):
    return lambda self, *a: getattr(float(self), op)(*a)


# Arithmetic and comparisons on a fraction: those of the float it stands for (the value pinned).
for _op in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
            "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__neg__", "__round__", "__floordiv__",
            "__rfloordiv__"):
    setattr(SymFrac, _op, _as_float(_op))


def is_sym(x) -> bool:
    return isinstance(x, SymInt)


def expr_of(x) -> Expr:
    """The expression of a dim (an int is a constant), with the symbols its specialization's
    guards have fixed put in (a SymInt made before the guard that made ``batch`` 1 still holds
    ``batch``; products made after it hold 1: compared as they were, ``seq * batch`` was ``seq``
    while ``batch`` was not 1, and a reshape of batch 1 was taken for a copy)."""
    return x.env.canon(x.expr) if isinstance(x, SymInt) else E.const(int(x))


def same_dim(a, b) -> bool:
    """``a`` and ``b`` (ints or SymInts) are the same expression: equal for every value of the
    symbols, decided without a guard."""
    return expr_of(a) == expr_of(b)


def same_dims(a, b) -> bool:
    """Two shapes (None: unknown) of the same rank whose dims are the same expressions."""
    return a is not None and b is not None and len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def is_one(d) -> bool:
    """``d`` is 1 for every value of the symbols (a literal 1, or a dim a guard has made 1, say
    seq in a decode step), decided without a guard. A symbolic dim is not asked whether it is 1:
    where the answer would not change the result, asking only splits the specializations (one for
    batch 1, another for the rest)."""
    e = expr_of(d)
    return e.is_const and e.const == 1


"""Hypothesis strategies for shape expressions, shared by the Expr and SymInt tests.

A ``Tree`` is an ``Expr`` built by the functions of ``dynashape.shape.expr`` together with a
reference: the same computation written with Python's own ints (``+ - * // % max min``), so a
property can compare ``evaluate`` (and ``source``, ``bounds`` ...) with an independent answer.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping

from hypothesis import strategies as st

from dynashape.shape import expr as E

NAMES = ("a", "b", "c")


class Tree:
    __slots__ = ("expr", "ref", "text")

    def __init__(self, expr: E.Expr, ref: Callable[[Mapping[str, int]], int], text: str) -> None:
        self.expr, self.ref, self.text = expr, ref, text

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return f"<{self.text}>"


def sym(name: str) -> Tree:
    return Tree(E.sym(name), lambda env: env[name], name)


def const(c: int) -> Tree:
    return Tree(E.const(c), lambda env: c, str(c))


_PY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
       "max": max, "min": min}


def apply(op: str, x: Tree, y: Tree, ranges: Mapping | None = None) -> Tree:
    """``x op y`` as an Expr (with ``ranges`` where the function takes them) and as Python."""
    if op in ("//", "%") and E.as_int(y.expr) == 0:
        y = const(1)  # a divisor that is the constant 0 cannot even be built
    if op == "+":
        e = E.add(x.expr, y.expr)
    elif op == "-":
        e = E.sub(x.expr, y.expr)
    elif op == "*":
        e = E.mul(x.expr, y.expr)
    elif op == "//":
        e = E.floordiv(x.expr, y.expr, ranges)
    elif op == "%":
        e = E.mod(x.expr, y.expr, ranges)
    elif op == "max":
        e = E.maximum(x.expr, y.expr, ranges)
    else:
        e = E.minimum(x.expr, y.expr, ranges)
    fn = _PY[op]
    text = f"{op}({x.text}, {y.text})" if op in ("max", "min") else f"({x.text} {op} {y.text})"
    return Tree(e, lambda env: fn(x.ref(env), y.ref(env)), text)


def neg(x: Tree) -> Tree:
    return Tree(E.neg(x.expr), lambda env: -x.ref(env), f"-{x.text}")


def scale(x: Tree, k: int) -> Tree:
    return Tree(E.scale(x.expr, k), lambda env: k * x.ref(env), f"{k}*{x.text}")


def leaves(names=NAMES, lo: int = -6, hi: int = 6) -> st.SearchStrategy[Tree]:
    return st.one_of(st.sampled_from(names).map(sym), st.integers(lo, hi).map(const))


def trees(ranges: Mapping | None = None, ops=tuple(_PY), max_leaves: int = 8,
          names=NAMES) -> st.SearchStrategy[Tree]:
    """Random expressions over ``names``; the atoms (``// % max min``) get ``ranges``."""
    def extend(children):
        binary = st.builds(lambda op, x, y: apply(op, x, y, ranges), st.sampled_from(ops), children, children)
        unary = st.one_of(children.map(neg), st.builds(scale, children, st.integers(-3, 3)))
        return st.one_of(binary, unary)
    return st.recursive(leaves(names), extend, max_leaves=max_leaves)


def polys(max_leaves: int = 8) -> st.SearchStrategy[Tree]:
    """Polynomials only (no opaque atoms)."""
    return trees(ops=("+", "-", "*"), max_leaves=max_leaves)


def envs(names=NAMES, hi: int = 12) -> st.SearchStrategy[dict]:
    """Non-negative symbol values (dims are sizes)."""
    return st.fixed_dictionaries({n: st.integers(0, hi) for n in names})


@st.composite
def ranged(draw, names=NAMES, top: int = 20):
    """(ranges, tree built with those ranges, values inside the ranges)."""
    ranges = {}
    for n in names:
        lo = draw(st.integers(0, top))
        ranges[n] = (lo, draw(st.integers(lo, top)))
    tree = draw(trees(ranges))
    env = {n: draw(st.integers(lo, hi)) for n, (lo, hi) in ranges.items()}
    return ranges, tree, env


def value(t: Tree, env: Mapping[str, int]) -> int | None:
    """The reference value, or None where Python divides by zero."""
    try:
        return t.ref(env)
    except ZeroDivisionError:
        return None


def opaque_atoms(e: E.Expr) -> list[E.Expr]:
    """Every opaque atom of ``e`` (at any depth) as an expression of its own."""
    out: list[E.Expr] = []
    for mono, _ in e.terms:
        for a in mono:
            if isinstance(a, E.Op):
                out.append(E.Expr(0, (((a,), 1),)))
                for arg in a.args:
                    out.extend(opaque_atoms(arg))
    return out

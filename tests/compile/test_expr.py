"""Expr: canonical integer polynomials over symbols with opaque atoms (``// % max min``).

Unit tests of the canonical form and of every simplification, and hypothesis properties that
compare ``evaluate``, ``source``, ``bounds`` and ``monotone`` with Python's own integers."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from dynashape.shape import expr as E

from . import exprgen as G

a, b, c = E.sym("a"), E.sym("b"), E.sym("c")
PROPS = settings(max_examples=200, deadline=None)


def run_source(e: E.Expr, env: dict, name=None) -> int:
    src = E.source(e, name)
    return eval(compile(src, "<expr>", "eval"), {"__builtins__": {}, "max": max, "min": min}, dict(env))  # noqa: S307


# ---- canonical form ------------------------------------------------------------------------------
def test_equal_polynomials_are_equal_objects():
    assert E.add(a, b) == E.add(b, a)
    assert hash(E.add(a, b)) == hash(E.add(b, a))
    assert E.mul(E.add(a, b), c) == E.add(E.mul(a, c), E.mul(b, c))
    assert E.sub(a, a) == E.const(0)
    assert E.as_int(E.sub(E.add(a, b), E.add(b, a))) == 0
    assert E.mul(E.add(a, 1), E.sub(a, 1)) == E.sub(E.mul(a, a), 1)
    assert E.add(a, a) == E.scale(a, 2) == E.mul(2, a)
    assert E.neg(E.neg(E.add(a, 3))) == E.add(a, 3)
    assert len({E.add(a, b), E.add(b, a), E.sub(E.add(a, E.add(b, c)), c)}) == 1


def test_different_polynomials_differ():
    assert E.add(a, b) != E.mul(a, b)
    assert a != b
    assert E.add(a, 1) != E.add(a, 2)
    assert E.mul(a, a) != E.scale(a, 2)
    assert E.floordiv(a, b) != E.floordiv(b, a)
    assert E.mod(a, 3) != E.floordiv(a, 3)


def test_constants():
    assert E.const(7).is_const and E.as_int(E.const(7)) == 7
    assert E.as_int(a) is None
    assert E.as_int(5) == 5
    assert E.as_int(E.sub(E.add(a, 4), a)) == 4
    assert not E.add(a, 1).is_const
    assert E.add(a, 1).free == frozenset({"a"})
    assert E.floordiv(E.mul(a, b), E.add(c, 1)).free == frozenset({"a", "b", "c"})


def test_opaque_atoms_are_canonical_in_their_arguments():
    assert E.floordiv(E.add(a, b), 2) == E.floordiv(E.add(b, a), 2)
    assert E.maximum(a, b) == E.maximum(b, a)
    assert E.minimum(E.add(a, 1), b) == E.minimum(b, E.add(1, a))
    assert E.add(E.floordiv(a, 2), E.floordiv(a, 2)) == E.scale(E.floordiv(a, 2), 2)
    assert E.sub(E.mod(a, 3), E.mod(a, 3)) == E.const(0)


@PROPS
@given(p=G.trees(), q=G.trees(), r=G.trees())
def test_ring_laws_hold_as_equalities_of_objects(p, q, r):
    P, Q, R = p.expr, q.expr, r.expr
    assert E.add(P, Q) == E.add(Q, P) and hash(E.add(P, Q)) == hash(E.add(Q, P))
    assert E.mul(P, Q) == E.mul(Q, P)
    assert E.add(E.add(P, Q), R) == E.add(P, E.add(Q, R))
    assert E.mul(E.mul(P, Q), R) == E.mul(P, E.mul(Q, R))
    assert E.mul(E.add(P, Q), R) == E.add(E.mul(P, R), E.mul(Q, R))
    assert E.sub(P, P) == E.const(0)
    assert E.add(P, 0) == P and E.mul(P, 1) == P and E.mul(P, 0) == E.const(0)
    assert E.neg(E.neg(P)) == P
    assert E.sub(P, Q) == E.add(P, E.neg(Q))


# ---- evaluate --------------------------------------------------------------------------------------
@PROPS
@given(t=G.trees(), env=G.envs())
def test_evaluate_agrees_with_python(t, env):
    want = G.value(t, env)
    assume(want is not None)
    assert E.evaluate(t.expr, env) == want


@PROPS
@given(p=G.trees(), q=G.trees(), k=st.integers(-7, 7), env=G.envs())
def test_evaluate_is_a_ring_homomorphism(p, q, k, env):
    vp, vq = G.value(p, env), G.value(q, env)
    assume(vp is not None and vq is not None)
    assert E.evaluate(p.expr, env) == vp and E.evaluate(q.expr, env) == vq
    assert E.evaluate(E.add(p.expr, q.expr), env) == vp + vq
    assert E.evaluate(E.sub(p.expr, q.expr), env) == vp - vq
    assert E.evaluate(E.mul(p.expr, q.expr), env) == vp * vq
    assert E.evaluate(E.neg(p.expr), env) == -vp
    assert E.evaluate(E.scale(p.expr, k), env) == k * vp
    assert E.evaluate(E.const(k), env) == k
    assert E.evaluate(E.sym("b"), env) == env["b"]


def test_evaluate_plain_ints_and_missing_symbols():
    assert E.evaluate(5, {}) == 5
    with pytest.raises(KeyError):
        E.evaluate(E.add(a, 1), {"b": 1})


# ---- floor division and modulo ---------------------------------------------------------------------
@PROPS
@given(x=G.trees(), y=G.trees(), env=G.envs())
def test_floordiv_and_mod_agree_with_python(x, y, env):
    vx, vy = G.value(x, env), G.value(y, env)
    assume(vx is not None and vy is not None and vy != 0)
    assert E.evaluate(E.floordiv(x.expr, y.expr), env) == vx // vy
    assert E.evaluate(E.mod(x.expr, y.expr), env) == vx % vy


@PROPS
@given(y=G.trees().filter(lambda t: not t.expr.is_const), k=st.integers(-9, 9), env=G.envs())
def test_an_exact_multiple_divides_to_its_factor(y, k, env):
    x = E.scale(y.expr, k)
    assert E.floordiv(x, y.expr) == E.const(k)
    assert E.mod(x, y.expr) == E.const(0)
    vy = G.value(y, env)
    assume(vy is not None and vy != 0)
    assert E.evaluate(x, env) // vy == k and E.evaluate(x, env) % vy == 0


@PROPS
@given(p=G.trees(), coef=st.sampled_from([-3, -1, 1, 2, 5]), names=st.lists(st.sampled_from(G.NAMES), min_size=1,
                                                                            max_size=3), env=G.envs())
def test_division_by_a_monomial(p, coef, names, env):
    m = E.const(coef)
    for n in names:
        m = E.mul(m, E.sym(n))
    x = E.mul(p.expr, m)
    q, r = E.floordiv(x, m), E.mod(x, m)
    if p.expr.const == 0:  # every term of x is a multiple of m: the quotient is p itself
        assert q == p.expr and r == E.const(0)
    vp, vm = G.value(p, env), E.evaluate(m, env)
    assume(vp is not None and vm != 0)
    assert E.evaluate(q, env) == (vp * vm) // vm == vp
    assert E.evaluate(r, env) == 0


def test_floordiv_simplifications():
    p1 = E.add(E.sym("p"), 1)
    assert E.floordiv(E.scale(p1, 64), E.scale(p1, 16)) == E.const(4)  # Reshape's -1
    assert E.floordiv(E.mul(E.mul(b, c), 64), c) == E.scale(b, 64)  # batch * seq * 64 // seq
    assert E.floordiv(E.add(E.scale(a, 4), 8), 4) == E.add(a, 2)
    assert E.floordiv(a, 1) == a
    assert E.floordiv(7, 2) == E.const(3) and E.floordiv(-7, 2) == E.const(-4)
    assert E.floordiv(E.add(E.scale(a, 4), 2), 4).terms[0][0][0].kind == "//"  # not exact: opaque
    assert E.floordiv(a, 8, {"a": (0, 7)}) == E.const(0)  # the ranges say so
    assert E.floordiv(a, 8, {"a": (0, 8)}) != E.const(0)
    assert E.floordiv(a, 8) != E.const(0)  # without ranges a is any size
    with pytest.raises(ZeroDivisionError):
        E.floordiv(a, 0)


def test_mod_simplifications():
    assert E.mod(E.scale(a, 6), 3) == E.const(0)
    assert E.mod(E.add(E.scale(a, 6), 4), 3) == E.const(1)
    assert E.mod(E.add(E.scale(a, 6), -4), 3) == E.const(2)  # Python's sign: of the divisor
    assert E.mod(a, 1) == E.const(0)
    assert E.mod(-7, 2) == E.const(1) and E.mod(7, -2) == E.const(-1)
    assert E.mod(E.mul(a, b), b) == E.const(0)
    assert E.mod(a, 8, {"a": (0, 7)}) == a
    assert E.mod(a, 8, {"a": (1, 9)}) != a
    with pytest.raises(ZeroDivisionError):
        E.mod(a, 0)


@PROPS
@given(lo=st.integers(0, 30), span=st.integers(0, 30), k=st.integers(1, 70), off=st.integers(0, 5), data=st.data())
def test_division_by_a_constant_within_ranges(lo, span, k, off, data):
    ranges = {"a": (lo, lo + span)}
    x = E.add(a, off)
    v = data.draw(st.integers(lo, lo + span))
    q, r = E.floordiv(x, k, ranges), E.mod(x, k, ranges)
    assert E.evaluate(q, {"a": v}) == (v + off) // k
    assert E.evaluate(r, {"a": v}) == (v + off) % k
    if k > 1 and lo + span + off < k:  # the whole range is below the divisor
        assert q == E.const(0) and r == x


@PROPS
@given(data=st.data())
def test_atoms_built_with_ranges_agree_with_python_inside_the_ranges(data):
    ranges, t, env = data.draw(G.ranged())
    want = G.value(t, env)
    assume(want is not None)
    assert E.evaluate(t.expr, env) == want


# ---- max and min -----------------------------------------------------------------------------------
def test_max_min_simplifications():
    assert E.maximum(a, a) == a and E.minimum(a, a) == a
    assert E.maximum(E.add(a, 1), a) == E.add(a, 1)
    assert E.minimum(E.add(a, 1), a) == a
    assert E.maximum(a, 0) == a  # a symbol is a size
    assert E.minimum(a, 0) == E.const(0)
    assert E.maximum(a, 5, {"a": (6, 10)}) == a
    assert E.minimum(a, 5, {"a": (6, 10)}) == E.const(5)
    opaque = E.maximum(a, 5)
    assert opaque.terms[0][0][0].kind == "max"
    assert [E.evaluate(opaque, {"a": v}) for v in range(8)] == [max(v, 5) for v in range(8)]


# ---- bounds ----------------------------------------------------------------------------------------
@PROPS
@given(data=st.data())
def test_bounds_contain_every_value_inside_the_ranges(data):
    ranges, t, env = data.draw(G.ranged())
    v = G.value(t, env)
    assume(v is not None)
    lo, hi = E.bounds(t.expr, ranges)
    assert lo <= v <= hi


@PROPS
@given(t=G.trees(), env=G.envs(hi=40))
def test_bounds_of_unlisted_symbols_are_sizes(t, env):
    v = G.value(t, env)
    assume(v is not None)
    lo, hi = E.bounds(t.expr, {})
    assert lo <= v <= hi


@PROPS
@given(coefs=st.lists(st.integers(-5, 5), min_size=3, max_size=3), k=st.integers(-9, 9),
       spans=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=3, max_size=3))
def test_bounds_of_a_linear_expression_are_exact(coefs, k, spans):
    e = E.const(k)
    ranges = {}
    for n, cf, (lo, w) in zip(G.NAMES, coefs, spans):
        e = E.add(e, E.scale(E.sym(n), cf))
        ranges[n] = (lo, lo + w)
    corners = [k + sum(cf * (lo + w if pick else lo) for cf, (lo, w), pick in zip(coefs, spans, picks))
               for picks in [(i & 1, i & 2, i & 4) for i in range(8)]]
    assert E.bounds(e, ranges) == (min(corners), max(corners))


def test_bounds_examples():
    assert E.bounds(E.sub(a, b), {"a": (2, 5), "b": (1, 3)}) == (-1, 4)
    assert E.bounds(E.mul(a, b), {"a": (2, 5), "b": (1, 3)}) == (2, 15)
    assert E.bounds(E.floordiv(a, 4), {"a": (3, 17)}) == (0, 4)
    assert E.bounds(E.mod(a, 4), {"a": (0, 100)}) == (0, 3)
    assert E.bounds(E.maximum(a, b), {"a": (2, 5), "b": (1, 9)}) == (2, 9)
    assert E.bounds(a, {}) == (0, math.inf)
    assert E.bounds(7, {}) == (7, 7)


# ---- source ----------------------------------------------------------------------------------------
@PROPS
@given(t=G.trees(), env=G.envs())
def test_source_evaluates_like_evaluate(t, env):
    want = G.value(t, env)
    assume(want is not None)
    assert run_source(t.expr, env) == E.evaluate(t.expr, env) == want
    renamed = {f"s_{k}": v for k, v in env.items()}
    assert run_source(t.expr, renamed, lambda s: f"s_{s}") == want


def test_source_examples():
    assert E.source(E.add(a, 1)) == "a + 1"
    assert E.source(E.sub(1, a)) == "-a + 1"
    assert E.source(E.sub(E.scale(a, 3), E.scale(b, 2))) == "3*a - 2*b"
    assert E.source(E.const(-4)) == "-4"
    assert E.source(E.const(0)) == "0"
    assert E.source(5) == "5"
    assert E.source(E.floordiv(E.neg(a), b)) == "((-a) // (b))"
    assert E.source(E.add(a, 2), lambda s: f"s_{s}") == "s_a + 2"


# ---- monotone --------------------------------------------------------------------------------------
def test_monotone_examples():
    assert E.monotone(E.add(E.mul(a, b), E.add(E.scale(a, 2), 3)))
    assert E.monotone(E.sub(a, 5))  # a constant does not matter
    assert E.monotone(E.floordiv(E.add(a, 1), 2))
    assert E.monotone(E.maximum(a, E.scale(b, 2)))
    assert E.monotone(E.minimum(a, 3))
    assert E.monotone(7) and E.monotone(E.const(-7))
    assert not E.monotone(E.neg(a))
    assert not E.monotone(E.sub(a, b))
    assert not E.monotone(E.mod(a, 3))
    assert not E.monotone(E.floordiv(a, b))  # a larger b gives less
    assert not E.monotone(E.floordiv(a, -2))
    assert not E.monotone(E.maximum(E.sub(5, a), b))


def _grows(e: E.Expr, env: dict, name: str) -> tuple[int, int]:
    up = dict(env)
    up[name] += 1
    return E.evaluate(e, env), E.evaluate(e, up)


def _defined(e: E.Expr, env: dict, name: str) -> bool:
    up = dict(env, **{name: env[name] + 1})
    try:
        E.evaluate(e, env), E.evaluate(e, up)
    except ZeroDivisionError:
        return False
    return True


@PROPS
@given(t=G.trees(), env=G.envs(), name=st.sampled_from(G.NAMES))
def test_monotone_expressions_never_decrease_when_their_atoms_are_sizes(t, env, name):
    """For shapes every opaque atom is a size (>= 0): then ``monotone`` must mean non-decreasing."""
    e = t.expr
    assume(E.monotone(e) and _defined(e, env, name))
    up = dict(env, **{name: env[name] + 1})
    assume(all(E.evaluate(x, env) >= 0 and E.evaluate(x, up) >= 0 for x in G.opaque_atoms(e)))
    before, after = _grows(e, env, name)
    assert after >= before


@PROPS
@given(t=G.trees(), env=G.envs(), name=st.sampled_from(G.NAMES))
@example(t=G.apply("*", G.sym("b"), G.apply("//", G.apply("-", G.sym("a"), G.const(5)), G.const(2))),
         env={"a": 0, "b": 0, "c": 0}, name="b")
def test_monotone_means_non_decreasing_for_any_symbol_values(t, env, name):
    e = t.expr
    assume(E.monotone(e) and _defined(e, env, name))
    before, after = _grows(e, env, name)
    assert after >= before


@PROPS
@given(t=G.polys(), env=G.envs(), name=st.sampled_from(G.NAMES))
def test_a_polynomial_that_decreases_is_not_monotone(t, env, name):
    e = t.expr
    before, after = _grows(e, env, name)
    if after < before:
        assert not E.monotone(e)

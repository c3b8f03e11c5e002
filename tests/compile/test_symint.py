"""SymInt and ShapeEnv: arithmetic builds expressions, decisions come from ranges or become guards,
``int()`` pins, equality guards teach replacements, and an unhinted symbol asks for a concrete run."""

from __future__ import annotations

import itertools
import math
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.shape import expr as E
from dynashape.shape.symint import NeedsConcrete, ShapeEnv, SymFrac, SymInt, expr_of

NAMES = ("a", "b", "c")
PROPS = settings(max_examples=120, deadline=None)
GRID = list(itertools.product(range(7), repeat=3))  # every (a, b, c) in [0, 6]^3


def make_env(**hints):
    env = ShapeEnv()
    return env, [env.symbol(n, h) for n, h in hints.items()]


def value(s) -> int:
    """The int a SymInt stands for, read without pinning it."""
    return int.__int__(s)


# ---- arithmetic builds expressions -----------------------------------------------------------------
def test_arithmetic_builds_the_expressions():
    env, (a, b) = make_env(a=5, b=3)
    A, B = E.sym("a"), E.sym("b")
    cases = [
        (a + b, E.add(A, B), 8), (a - b, E.sub(A, B), 2), (a * b, E.mul(A, B), 15),
        (2 * a, E.scale(A, 2), 10), (a + 1, E.add(A, 1), 6), (1 + a, E.add(A, 1), 6),
        (10 - a, E.sub(10, A), 5), (-a, E.neg(A), -5), (a * 2.0, E.scale(A, 2), 10),
        (a ** 2, E.mul(A, A), 25), (a * b + 1, E.add(E.mul(A, B), 1), 16),
        (a // 2, E.floordiv(A, 2), 2), (a % 3, E.mod(A, 3), 2), (a // b, E.floordiv(A, B), 1),
        (7 // a, E.floordiv(7, A), 1), (7 % a, E.mod(7, A), 2), (a + b - a, B, 3),
    ]
    for got, want, v in cases:
        assert isinstance(got, SymInt), got
        assert got.expr == want, (got, want)
        assert value(got) == v == E.evaluate(want, {"a": 5, "b": 3})
    # building expressions decides nothing, except that a symbolic divisor is not zero: the
    # simplifications of // and % (k*b // b == k) hold only then, and a zero must fail as in Python
    assert {str(g) for g in env.guards.values()} == {"Guard(a != 0)", "Guard(b != 0)"} and env.pins == 0


def test_floats_that_are_not_whole_pin():
    env, (a,) = make_env(a=5)
    assert a * 0.3 == pytest.approx(1.5)
    assert env.pins == 1
    assert [g.source(str) for g in env.guard_list()] == ["a - 5 == 0"]


def int_programs():
    leaf = st.one_of(st.sampled_from(NAMES), st.integers(-4, 6))

    def extend(ch):
        return st.one_of(st.tuples(st.sampled_from(["+", "-", "*"]), ch, ch), st.tuples(st.just("neg"), ch),
                         st.tuples(st.sampled_from(["//", "%"]), ch, st.integers(1, 5)))
    return st.recursive(leaf, extend, max_leaves=6)


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


def run_program(p, env):
    """Evaluate a program with Python operators: on ints, or on SymInts (building expressions)."""
    if isinstance(p, str):
        return env[p]
    if isinstance(p, int):
        return p
    if p[0] == "neg":
        return -run_program(p[1], env)
    return _OPS[p[0]](run_program(p[1], env), run_program(p[2], env))


hints_st = st.tuples(*(st.integers(0, 6) for _ in NAMES))


@PROPS
@given(p=int_programs(), hints=hints_st)
def test_arithmetic_on_symints_computes_what_ints_compute(p, hints):
    env = ShapeEnv()
    syms = {n: env.symbol(n, h) for n, h in zip(NAMES, hints)}
    got = run_program(p, syms)
    assert value(got) == run_program(p, dict(zip(NAMES, hints)))
    assert env.guards == {} and env.pins == 0
    e = expr_of(got)
    for point in GRID[::7]:  # the expression holds at other values too, not only at the hints
        vals = dict(zip(NAMES, point))
        assert E.evaluate(e, vals) == run_program(p, vals)


# ---- decisions -------------------------------------------------------------------------------------
def test_comparisons_the_ranges_decide_record_no_guard():
    env = ShapeEnv()
    a = env.symbol("a", 5)
    n = env.symbol("n", 4, lo=1, hi=64)
    assert (a >= 0) is True
    assert (a == -1) is False and (a != -1) is True
    assert (a + 1 > 0) is True and (a < -2) is False
    assert (n == 0) is False and bool(n) is True and (n <= 64) is True and (n > 64) is False
    assert (n * 2 >= 2) is True
    assert abs(a) is a
    assert max(a, 0) is a
    assert env.guards == {} and env.pins == 0


@pytest.mark.parametrize("cmp, truth_at", [
    (lambda a: a == 1, lambda v: v == 1), (lambda a: a != 1, lambda v: v != 1),
    (lambda a: a > 3, lambda v: v > 3), (lambda a: a < 3, lambda v: v < 3),
    (lambda a: a >= 5, lambda v: v >= 5), (lambda a: a <= 4, lambda v: v <= 4),
    (lambda a: a > 10, lambda v: v > 10), (lambda a: bool(a - 5), lambda v: v != 5),
])
def test_an_undecidable_comparison_records_a_guard_that_holds_for_the_hint(cmp, truth_at):
    env, (a,) = make_env(a=5)
    got = cmp(a)
    assert got is truth_at(5)
    guards = env.guard_list()
    assert len(guards) == 1
    assert guards[0].holds({"a": 5})
    # the guard says exactly when the answer stays the same
    for v in range(0, 20):
        assert guards[0].holds({"a": v}) == (truth_at(v) == got), v
    assert env.pins == 0


cmp_st = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
_CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@PROPS
@given(steps=st.lists(st.tuples(int_programs(), cmp_st, int_programs()), min_size=1, max_size=5), hints=hints_st)
def test_every_decision_stays_right_wherever_its_guards_hold(steps, hints):
    """The specialization is valid for every signature its guards accept: each decision taken at
    the hints has the same answer at every point of the grid that satisfies all the guards."""
    env = ShapeEnv()
    syms = {n: env.symbol(n, h) for n, h in zip(NAMES, hints)}
    at_hint = dict(zip(NAMES, hints))
    answers = []
    for x, op, y in steps:
        got = _CMP[op](run_program(x, syms), run_program(y, syms))
        assert got is _CMP[op](run_program(x, at_hint), run_program(y, at_hint))
        answers.append((x, op, y, got))
    guards = env.guard_list()
    assert all(g.holds(at_hint) for g in guards)
    for point in GRID:
        vals = dict(zip(NAMES, point))
        if all(g.holds(vals) for g in guards):
            for x, op, y, got in answers:
                assert _CMP[op](run_program(x, vals), run_program(y, vals)) is got, (point, x, op, y)


# ---- int() pins ------------------------------------------------------------------------------------
def test_int_pins_the_value_with_an_equality_guard():
    env, (a, b) = make_env(a=5, b=3)
    assert int(a + b) == 8
    assert env.pins == 1
    (g,) = env.guard_list()
    assert g.kind == "==" and g.holds({"a": 5, "b": 3}) and not g.holds({"a": 5, "b": 4})
    assert g.expr == E.sub(E.add(E.sym("a"), E.sym("b")), 8)
    assert float(b) == 3.0  # float() pins too
    assert env.pins == 2 and all(g.holds({"a": 5, "b": 3}) for g in env.guard_list())
    assert not any(g.holds({"a": 4, "b": 3}) for g in env.guard_list())


def test_a_pinned_symbol_becomes_its_value_in_later_expressions():
    env, (a, b) = make_env(a=5, b=3)
    assert int(a) == 5
    assert (a + b).expr == E.add(E.sym("b"), 5)
    assert (a * 2).expr == E.const(10)


def test_int_of_a_constant_expression_does_not_pin():
    env, (a,) = make_env(a=5)
    assert int(a - a + 3) == 3
    assert env.pins == 0 and env.guards == {}


# ---- replacements learned from equality guards -----------------------------------------------------
def test_an_equality_guard_on_a_linear_expression_becomes_a_replacement():
    env = ShapeEnv()
    past = env.symbol("past", 7)
    seq = env.symbol("seq", 1)
    assert (seq == 1) is True
    assert env.replace == {"seq": E.const(1)}
    assert (past + seq).expr == E.add(E.sym("past"), 1)
    assert env.canon(E.add(E.sym("past"), E.sym("seq"))) == E.add(E.sym("past"), 1)
    assert (seq * past).expr == E.sym("past")
    assert (seq > 0) is True and len(env.guard_list()) == 1  # known now: no new guard


def test_the_newest_symbol_is_replaced_by_the_older_one():
    env, (a, b) = make_env(a=4, b=4)
    assert (b == a) is True
    assert env.replace == {"b": E.sym("a")}
    assert (a - b).expr == E.const(0)
    assert (b * 2 + a).expr == E.scale(E.sym("a"), 3)


def test_a_replacement_is_substituted_into_earlier_ones():
    env, (a, b, c) = make_env(a=2, b=5, c=7)
    assert (c == b + 2) is True  # c -> b + 2
    assert (b == a + 3) is True  # b -> a + 3, and c -> a + 5
    assert env.canon(E.sym("c")) == E.add(E.sym("a"), 5)
    assert (a + b + c).expr == E.add(E.scale(E.sym("a"), 3), 8)
    assert value(a + b + c) == 14


def test_a_nonlinear_equality_teaches_nothing():
    env, (a, b) = make_env(a=2, b=3)
    assert (a * b == 6) is True
    assert env.replace == {}
    assert len(env.guard_list()) == 1


# ---- symbols without hints -------------------------------------------------------------------------
def test_a_symbol_without_a_hint_needs_a_concrete_run():
    env = ShapeEnv()
    a = env.symbol("a", 5)
    u = env.symbol("u", None)
    with pytest.raises(NeedsConcrete):
        _ = u == 3
    with pytest.raises(NeedsConcrete):
        _ = u + a > 7
    with pytest.raises(NeedsConcrete):
        int(u)
    with pytest.raises(NeedsConcrete):
        bool(u - 1)
    assert (u >= 0) is True  # the ranges still decide what they can
    assert (u + a + 1 > 0) is True
    assert (u * 2 + 1).expr == E.add(E.scale(E.sym("u"), 2), 1)  # arithmetic is fine
    assert env.guards == {} and env.pins == 0


# ---- fractions: ceil and floor stay symbolic -------------------------------------------------------
def test_ceil_of_a_quotient_stays_symbolic():
    env, (a, b) = make_env(a=5, b=3)
    q = a / b
    assert isinstance(q, SymFrac)
    r = math.ceil(q)
    assert isinstance(r, SymInt) and value(r) == 2
    assert r.expr.free == frozenset({"a", "b"})
    for x, y in itertools.product(range(0, 15), range(1, 7)):
        assert E.evaluate(r.expr, {"a": x, "b": y}) == math.ceil(x / y)
    fl = math.floor(a / b)
    assert fl.expr == E.floordiv(E.sym("a"), E.sym("b"))
    assert env.pins == 0 and {str(g) for g in env.guards.values()} == {"Guard(b != 0)"}


@pytest.mark.parametrize("factor", [0.5, 1.5, 0.25, 2.0])
def test_floor_and_ceil_of_a_dyadic_product_stay_symbolic(factor):
    env, (a,) = make_env(a=7)
    lo, hi = math.floor(a * factor), math.ceil(a * factor)
    assert isinstance(lo, SymInt) and isinstance(hi, SymInt)
    assert value(lo) == math.floor(7 * factor) and value(hi) == math.ceil(7 * factor)
    for v in range(40):
        assert E.evaluate(lo.expr, {"a": v}) == math.floor(v * factor)
        assert E.evaluate(hi.expr, {"a": v}) == math.ceil(v * factor)
    assert env.pins == 0 and env.guards == {}


def test_floor_of_half_is_floor_division_by_two():
    env, (a,) = make_env(a=9)
    assert math.floor(a * 0.5).expr == E.floordiv(E.sym("a"), 2)
    assert env.pins == 0


def test_a_fraction_used_as_a_number_pins():
    env, (a, b) = make_env(a=5, b=2)
    assert float(a / b) == 2.5
    assert env.pins == 2


def test_floor_with_ranges_folds_to_a_constant():
    env = ShapeEnv()
    a = env.symbol("a", 3, lo=1, hi=7)
    assert math.floor(a / 8).expr == E.const(0)
    up = math.ceil(a / 8)  # not folded (a negative dividend inside), but right over the range
    assert [E.evaluate(up.expr, {"a": v}) for v in range(1, 8)] == [1] * 7
    assert env.pins == 0 and env.guards == {}


def test_a_symbolic_divisor_that_is_zero_fails_like_python():
    env, (a, b) = make_env(a=5, b=0)
    for f in (lambda: a // b, lambda: a % b, lambda: a / b, lambda: 7 // b, lambda: (a * b) // b):
        with pytest.raises(ZeroDivisionError):
            f()
    env, (a, b) = make_env(a=0, b=3)
    assert value((a * b) // b) == 0 and str(next(iter(env.guards.values()))) == "Guard(b != 0)"


# ---- guards on one symbol narrow its range ------------------------------------------------------------
def test_guards_on_one_symbol_narrow_its_range_to_an_equality():
    """``seq != 0`` (seq >= 1 with its range starting at 0) and ``seq <= 1`` pin seq: learnt as
    ``seq == 1`` (a replacement), as if a node had asked it, so later expressions fold."""
    env, (seq, past) = make_env(seq=1, past=7)
    assert seq != 0 and seq <= 1
    assert env.replace == {"seq": E.const(1)}
    assert E.source((past + seq).expr) == "past + 1"
    # decided by the narrowed range, no new guard: seq >= 1 holds for every signature of these guards
    n = len(env.guards)
    assert seq >= 1 and len(env.guards) == n


def test_a_narrowed_range_decides_later_questions_without_guards():
    env, (n,) = make_env(n=5)
    assert n >= 3  # n - 3 >= 0: the range becomes [3, inf)
    before = len(env.guards)
    assert n != 0 and n > 2 and not (n < 3)
    assert len(env.guards) == before
    assert env.ranges["n"][0] == 3 and not env.replace

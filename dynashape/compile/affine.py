"""Index-affine values: small host tensors whose elements are expressions of their own indices.

Exported decoders build their causal mask from the past length: ``Range(0, past + seq)``
compared with ``Range(0, seq) + past``, unsqueezed and broadcast. Such a tensor is, element by
element, an expression of its indices and the input symbols: ``mask[i, j] = (j <= past + i)``.
Followed symbolically, the shape program can tell when a mask is true everywhere (a decode step:
``seq == 1``, every key is in the past) and the attention then runs without one, and nothing
builds it.

A value here is ``Affine(dims, expr, pred)``: element ``(i0, i1, ...)`` is ``expr`` with the
index symbols ``_i0, _i1, ...`` in place, or, when ``pred`` is set (``==``, ``!=``, ``>=``), the
truth of ``expr <pred> 0``. Only expressions linear in the indices with constant coefficients
are followed; anything else is not an Affine (the node then runs as usual).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..shape import expr as E
from ..shape.symint import ShapeEnv, SymInt, expr_of
from ..shape.symint import substitute as subst

IDX = "_i"


def idx(k: int) -> str:
    return f"{IDX}{k}"


@dataclass(frozen=True)
class Affine:
    dims: tuple  # ints and SymInts
    expr: E.Expr
    pred: str | None = None

    @property
    def rank(self) -> int:
        return len(self.dims)


def _is_index(name: str) -> bool:
    return name.startswith(IDX)


def _linear_in_indices(e: E.Expr) -> dict[str, int] | None:
    """Coefficients of the index symbols when ``e`` is linear in them with int coefficients."""
    coeffs: dict[str, int] = {}
    for mono, c in e.terms:
        if any(not isinstance(a, str) and any(_is_index(n) for arg in a.args for n in arg.free) for a in mono):
            return None  # an index inside a floor division or a max: not followed
        names = [a for a in mono if isinstance(a, str) and _is_index(a)]
        if not names:
            continue
        if len(names) != 1 or len(mono) != 1:
            return None
        coeffs[names[0]] = coeffs.get(names[0], 0) + c
    return coeffs


def _without_indices(e: E.Expr) -> E.Expr:
    acc = E.const(e.const)
    for mono, c in e.terms:
        if not any(isinstance(a, str) and _is_index(a) for a in mono):
            acc = E.add(acc, E.Expr(0, ((mono, c),)))
    return acc


def extremes(a: Affine) -> tuple[E.Expr, E.Expr] | None:
    """(min, max) of ``a.expr`` over its index box, as expressions of the input symbols."""
    coeffs = _linear_in_indices(a.expr)
    if coeffs is None:
        return None
    lo = hi = _without_indices(a.expr)
    for k, d in enumerate(a.dims):
        c = coeffs.get(idx(k), 0)
        if not c:
            continue
        span = E.scale(E.sub(expr_of(d), 1), c)  # c * (d - 1)
        if c > 0:
            hi = E.add(hi, span)
        else:
            lo = E.add(lo, span)
    return lo, hi


def always(a: Affine, env: ShapeEnv) -> bool | None:
    """True / False when the predicate holds at every index / at none (a guard where the ranges
    cannot tell), None when it depends on the index or is not a predicate."""
    if a.pred is None or any(expr_of(d).terms == () and int(expr_of(d).const) == 0 for d in a.dims):
        return None
    ex = extremes(a)
    if ex is None:
        return None
    lo, hi = ex
    if any(not env.hinted(x) for x in (lo, hi)):
        return None
    if a.pred == ">=":
        if env.decide(">=", lo):
            return True
        return False if not env.decide(">=", hi) else None
    if a.pred == "==":
        if env.decide("==", lo) and env.decide("==", hi):
            return True
        return None
    if env.decide(">=", E.sub(lo, 1)) or env.decide(">=", E.sub(E.neg(hi), 1)):  # != 0 everywhere
        return True
    return None


# ---- following ops ---------------------------------------------------------------------------------
def of_sval(sv, env: ShapeEnv) -> Affine | None:
    """A small known tensor whose elements are all one expression (a broadcast scalar)."""
    flat = sv.flat()
    if not flat or any(isinstance(x, bool) for x in flat):
        return None
    first = expr_of(flat[0])
    if any(expr_of(x) != first for x in flat[1:]):
        return None
    return Affine(tuple(sv.shape), env.canon(first))


def _remap(e: E.Expr, mapping: dict[int, int | None]) -> E.Expr:
    """Index symbol k becomes index ``mapping[k]`` (None: the index is always 0)."""
    sub = {}
    for name in e.free:
        if _is_index(name):
            k = int(name[len(IDX):])
            to = mapping.get(k, k)
            sub[name] = E.const(0) if to is None else E.sym(idx(to))
    return subst(e, sub) if sub else e


def _broadcast_to(a: Affine, dims: tuple) -> E.Expr | None:
    """``a``'s expression indexed by the broadcast output's indices."""
    pad = len(dims) - a.rank
    if pad < 0:
        return None
    mapping: dict[int, int | None] = {}
    for k, d in enumerate(a.dims):
        out_k = k + pad
        one = isinstance(d, int) and not isinstance(d, SymInt) and d == 1 or (
            isinstance(d, SymInt) and not d.expr.terms and d.expr.const == 1)
        mapping[k] = None if one else out_k
    return _remap(a.expr, mapping)


def _reindexed(a: Affine, out_dims: tuple) -> Affine | None:
    """Unsqueeze / Squeeze / Reshape that only add or drop axes of 1: indices move, values stay."""
    src = [k for k, d in enumerate(a.dims) if not _one(d)]
    dst = [k for k, d in enumerate(out_dims) if not _one(d)]
    if len(src) != len(dst):
        return None
    mapping: dict[int, int | None] = {k: None for k in range(a.rank)}
    for s, d in zip(src, dst):
        if expr_of(a.dims[s]) != expr_of(out_dims[d]):
            return None
        mapping[s] = d
    return Affine(tuple(out_dims), _remap(a.expr, mapping), a.pred)


def _has_index(e: E.Expr) -> bool:
    return any(_is_index(n) for n in e.free)


def _one(d) -> bool:
    return expr_of(d).terms == () and expr_of(d).const == 1


_CMP = {"Less": ("lt"), "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge", "Equal": "eq"}


def evaluate(node, ins: list, svals: list, out_dims: tuple, env: ShapeEnv) -> Affine | None:
    """The Affine of ``node``'s first output, or None."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or out_dims is None:
        return None
    xs = [a if a is not None else (of_sval(s, env) if s is not None else None) for a, s in zip(ins, svals)]
    if op == "Range":
        if any(s is None for s in svals) or len(out_dims) != 1:
            return None
        start, delta = (expr_of(s.flat()[0]) for s in (svals[0], svals[2]))
        return Affine(tuple(out_dims), E.add(start, E.mul(delta, E.sym(idx(0)))))
    if op in ("Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten") and xs[0] is not None:
        return _reindexed(xs[0], tuple(out_dims))
    if op == "Cast" and xs[0] is not None and xs[0].pred is None and node.attrs.get("to") in (6, 7):
        return xs[0]
    if op == "Expand" and xs[0] is not None and xs[0].pred is None:
        e = _broadcast_to(xs[0], tuple(out_dims))
        return None if e is None else Affine(tuple(out_dims), e)
    if op in ("Add", "Sub", "Mul") + tuple(_CMP):
        if len(xs) != 2 or any(x is None or x.pred is not None for x in xs):
            return None
        a, b = (_broadcast_to(x, tuple(out_dims)) for x in xs)
        if a is None or b is None:
            return None
        if op == "Add":
            return Affine(tuple(out_dims), E.add(a, b))
        if op == "Sub":
            return Affine(tuple(out_dims), E.sub(a, b))
        if op == "Mul":
            return Affine(tuple(out_dims), E.mul(a, b))
        kind = _CMP[op]
        if kind == "le":
            return Affine(tuple(out_dims), E.sub(b, a), ">=")
        if kind == "lt":
            return Affine(tuple(out_dims), E.sub(E.sub(b, a), 1), ">=")
        if kind == "ge":
            return Affine(tuple(out_dims), E.sub(a, b), ">=")
        if kind == "gt":
            return Affine(tuple(out_dims), E.sub(E.sub(a, b), 1), ">=")
        return Affine(tuple(out_dims), E.sub(a, b), "==")
    if op == "Where" and len(xs) == 3 and xs[0] is not None and xs[0].pred is not None \
            and all(x is not None and x.pred is None and not _has_index(x.expr) for x in xs[1:]):
        truth = always(xs[0], env)  # a mask made from a condition that is the same everywhere
        if truth is None:
            return None
        return Affine(tuple(out_dims), xs[1].expr if truth else xs[2].expr)
    if op == "Not" and xs[0] is not None and xs[0].pred is not None:
        a = xs[0]
        if a.pred == "==":
            return Affine(a.dims, a.expr, "!=")
        if a.pred == "!=":
            return Affine(a.dims, a.expr, "==")
        return Affine(a.dims, E.sub(E.neg(a.expr), 1), ">=")
    return None

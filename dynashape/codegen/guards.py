"""``accepts(shapes)``: whether input shapes meet a specialization's guards.

Its ranks, the dims its inputs share, and every guard the making of its code asked of the input
symbols (the step plan's included): a specialization serves exactly the shapes it was built for.
"""

from __future__ import annotations

from ..compile.shape_program import Trace


def accepts_source(t: Trace, symvar: dict[str, str], input_symbols: set[str], symname) -> tuple[list[str], list]:
    """The lines of ``accepts`` and the keys of the guards it checks."""
    out = ["def accepts(shapes):"]

    def put(line: str, indent: int = 1) -> None:
        out.append("    " * indent + line)

    ranks = t.input_ranks
    conds = []
    for i, r in enumerate(ranks):
        has = f"shapes[{i}] is not None and len(shapes[{i}]) == {r}"
        conds.append(f"shapes[{i}] is None" if r is None else has)
    put("if not (" + " and ".join(conds or ["True"]) + "):")
    put("return False", indent=2)
    for d in t.input_dims:
        if d.defines:
            put(f"{symvar[d.symbol]} = shapes[{d.input}][{d.axis}]")
    eq = [f"shapes[{d.input}][{d.axis}] == {symvar[d.symbol]}" for d in t.input_dims if not d.defines]
    guards = [g for g in t.guards if g.expr.free <= input_symbols]
    accepted = [g.key for g in guards]
    conds = eq + [f"({gd.source(symname)})" for gd in guards]
    put("return " + (" and ".join(conds) if conds else "True"))
    return out, accepted

"""Values of a decode step made at the KV capacity ``C`` instead of the count of keys seen.

A whole-step graph (``step_graph.py``) must not depend on the past length ``g`` as a host number.
Masks made from an ``attention_mask`` input or from the length itself do, through their shapes:
``[batch, 1, 1, g + n]``. They are made at the capacity instead, in two ways:

- *mask lines*: lines of position-wise ops (elementwise, views, broadcasts; a gather whose indices
  are capacity values) over an input read padded to ``C``: element ``j`` of the result depends on
  element ``j`` of the inputs only, so the first ``g + n`` are what the model makes, and the rest
  is never read (the attention gives keys beyond the length a weight of 0 whatever the mask says);
- *capacity values*: values the shape program makes on the host from the length (a causal mask, a
  ``Range`` over the keys, gather indices), made by ``prep(<key symbols>, C, ...)`` once per bucket,
  outside the graph. Whether one is the same at the capacity is not proven here: the runtime
  compares it with the value at the real length and at a larger capacity, and refuses the bucket
  when the first positions differ (a sliding window, an index from the end).

``total`` is the source of the count of keys seen (the present's length); ``aliases`` are the
variables of inputs' dims that stand for it (an ``attention_mask`` whose length is its own symbol).
"""

from __future__ import annotations

import re

from .regions import Member, _rhs_reads, targets

# ops whose lines a mask over the keys may run through at the capacity: each element of their
# results depends only on the same key position of their inputs, or they move elements without
# mixing key positions
MASK_OPS = frozenset({"Cast", "CastLike", "Not", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater",
                      "GreaterOrEqual", "Where", "Add", "Sub", "Mul", "Div", "Neg", "Min", "Max", "Identity",
                      "Unsqueeze", "Squeeze", "Reshape", "Expand"})
# gathers: position-wise only when their indices are capacity values (checked non-negative)
GATHER_OPS = frozenset({"Gather", "GatherND", "GatherElements"})


class Refused(Exception):
    """Why a specialization has no whole-step function."""


def mentions(src: str, var: str) -> bool:
    return re.search(rf"(?<!\w){var}(?!\w)", src) is not None


def at_capacity(src: str, total: str, aliases: tuple[str, ...] = ()) -> str:
    """``src`` with the count of keys seen (``total``, a source, or an alias) made ``C``."""
    for var in aliases:
        src = re.sub(rf"(?<!\w){var}(?!\w)", "C", src)
    if re.fullmatch(r"\w+", total):
        return re.sub(rf"(?<!\w){total}(?!\w)", "C", src)
    return src.replace(f"({total})", "C").replace(total, "C")


def mask_line(line: str, name: str, total: str, aliases: tuple[str, ...], gvar: str, kv_locals: set[str]) -> str:
    """A line of a mask over the keys seen, made at the capacity instead."""
    if set(_rhs_reads(line)) & kv_locals or "st." in line:
        raise Refused(f"node {name!r} makes a mask from the KV cache or the request state")
    new = at_capacity(line, total, aliases)
    if mentions(new, gvar):
        raise Refused(f"node {name!r} reads the growing length as a number")
    return new


def prep_source(cap: list[str], groups: list[tuple[frozenset, list[str]]], members: dict[str, Member],
                fills: dict[str, tuple], total: str, aliases: tuple[str, ...], g: str, gvar: str,
                keyvars: list[str]) -> tuple[str, list[str]]:
    """``def prep(<keyvars>, C, <live-ins>) -> <cap>``: the group lines that make the capacity
    values ``cap`` (and what they read that depends on ``g``) at the capacity; and its live-ins
    (members that do not depend on ``g``)."""
    ordered = [line for _, glines in groups for line in glines]
    where = {t: i for i, line in enumerate(ordered) for t in targets(line)}
    picked: dict[str, tuple[int, str]] = {}
    live: list[str] = []
    stack = list(cap)
    while stack:
        n = stack.pop()
        if n in picked:
            continue
        if n not in where:
            raise Refused(f"{n!r} is made per value of {g!r} outside the groups")
        if n in fills:  # one value everywhere: made at the capacity as a fill
            value, dt, dims, on_device = fills[n]
            dims = [at_capacity(d, total, aliases) for d in dims]
            dev = ", device=DEV" if on_device else ""
            picked[n] = (where[n], f"{n} = torch.full(({', '.join(dims)}{',' if len(dims) == 1 else ''}), "
                                   f"{value!r}, dtype={dt}{dev})")
            continue
        line = ordered[where[n]]
        new = at_capacity(line, total, aliases)
        if mentions(new, gvar):
            raise Refused(f"{n!r} is made from the growing length as a number")
        if "st." in new or "A[" in new or "off[" in new:
            raise Refused(f"{n!r} is made in a way a capacity value cannot be ({line.strip()[:60]})")
        for t in targets(line):
            picked[t] = (where[n], new)
        for r in _rhs_reads(line):
            m = members.get(r)
            if m is None:
                continue
            if g in m.group_syms:
                stack.append(r)
            elif r not in live:
                live.append(r)
    lines = []
    for _, line in sorted(set(picked.values())):
        lines.append(line)
    src = [f"def prep({', '.join(keyvars + ['C'] + live)}):"] + ["    " + x for x in lines]
    src.append(f"    return ({', '.join(cap)}{',' if len(cap) == 1 else ''})")
    return "\n".join(src) + "\n", live

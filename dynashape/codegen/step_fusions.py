"""Rewrites of the whole step's lines that only the step can make: its KV writes are its own.

``fuse_rope_append``: per attention, the rotary embedding of its queries and keys
(``RotaryHalf``) and the writes of its keys and values into their storages (``_kv_write``)
become one call, ``q, present_k, present_v = _rope_append(q, k, v, cos, sin, KSk, KSv, axis,
IDX)`` (``ops/rope_append.py``: one kernel on CUDA instead of four per decoder layer). Only when
the four lines are exactly that: both rotations by the same cos and sin, the rotated values read
by nothing else, nothing between them reading what they make.
"""

from __future__ import annotations

import re

_ROPE = re.compile(r"^(\w+) = k_RotaryHalf\w*\((\w+), (\w+), (\w+)\)$")
_WRITE = re.compile(r"^(\w+) = _kv_write\((KS\d+), (\d+), IDX, (\w+)\)$")
_ATTN = re.compile(r"^\w+ = _kv_attn\((\w+), (KS\d+), (KS\d+), ")


def _uses(name: str, lines: list[str], results: list[str]) -> int:
    """How many times the lines' right-hand sides and the results read ``name``."""
    pat = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")
    return sum(len(pat.findall(x.split(" = ", 1)[1] if " = " in x else x)) for x in lines) + results.count(name)


def fuse_rope_append(lines: list[str], results: list[str]) -> list[str]:
    lines = list(lines)
    at = 0
    while at < len(lines):
        m = _ATTN.match(lines[at])
        found = _four(lines[:at], m.group(1), m.group(2), m.group(3), lines, results) if m else None
        if found is not None:
            idx, new = found
            last = max(idx)
            lines[last] = new
            for i in sorted(idx, reverse=True):
                if i != last:
                    del lines[i]
            at -= len(idx) - 1  # the lines taken out all stood before the attention
        at += 1
    return lines


def _four(before: list[str], q_rot: str, ks: str, vs: str, lines: list[str], results: list[str]):
    """The indices of the four lines feeding an attention and the fused line, or None."""
    defs = {}
    for i, x in enumerate(before):
        for rx in (_ROPE, _WRITE):
            m = rx.match(x)
            if m:
                defs[m.group(1)] = (i, rx, m)
    writes = {m.group(2): (i, m) for i, rx, m in defs.values() if rx is _WRITE}
    if q_rot not in defs or defs[q_rot][1] is not _ROPE or ks not in writes or vs not in writes:
        return None
    qi, _, qm = defs[q_rot]
    wk, km = writes[ks]
    wv, vm = writes[vs]
    k_rot = km.group(4)
    if k_rot not in defs or defs[k_rot][1] is not _ROPE or km.group(3) != vm.group(3):
        return None
    ki, _, rm = defs[k_rot]
    if (qm.group(3), qm.group(4)) != (rm.group(3), rm.group(4)):
        return None  # rotated by other tables
    if _uses(q_rot, lines, results) != 1 or _uses(k_rot, lines, results) != 1:
        return None  # the rotated values are read elsewhere too: they must exist
    idx = [qi, ki, wk, wv]
    lo, hi = min(idx), max(idx)
    made = {q_rot, k_rot, km.group(1), vm.group(1)}
    between = [before[i] for i in range(lo, hi) if i not in idx]
    if any(_uses(n, between, []) for n in made):
        return None
    new = (f"{q_rot}, {km.group(1)}, {vm.group(1)} = _rope_append({qm.group(2)}, {rm.group(2)}, {vm.group(4)}, "
           f"{qm.group(3)}, {qm.group(4)}, {ks}, {vs}, {km.group(3)}, IDX)")
    return idx, new

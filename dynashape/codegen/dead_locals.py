"""``del`` of the generated ``run``'s tensor locals after their last use.

A kernel that allocates its result (a convolution on the CPU, whose output oneDNN or the C tile
makes) hands ``run`` a tensor that only its local holds. Python keeps every local of a function
alive until it returns, so each such result lived to the end of the call: PP-OCRv4 rec at
44x3x48x576 held ~2 GB of feature maps at once where the arena plans 110 MB, and its first call at
that size faulted in ~1 GB of fresh pages (1-3 s on the project's VM). torch.fx's generated code
deletes its dead values the same way.

A local named ``t_*`` is deleted right after the line that reads it last, at that line's
indentation (inside an ``if`` branch is fine: a name read after the branch is read later).
Left alone: names read in a ``for``/``while`` body (a later iteration reads them again), in a
``lambda`` or nested ``def`` (a closure's cell), last read by a compound statement's header (a
line ending in ``:``), by ``return``, or by a line whose brackets stay open (a statement that goes on).
"""

from __future__ import annotations

import re

_NAME = re.compile(r"\bt_\w+")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def drop_dead(lines: list[str]) -> tuple[list[str], list[int]]:
    """``lines`` (a function's body, its ``def`` excluded) with ``del`` statements inserted, and for
    each line of the result the index of the original line it is (-1 for an inserted one)."""
    last: dict[str, int] = {}
    banned: set[str] = set()
    loops: list[tuple[int, int]] = []  # (header line, its indentation) of the enclosing loops
    in_loop: list[bool] = []
    open_after: list[bool] = []  # a statement continues on the next line (brackets left open)
    depth = 0
    for i, line in enumerate(lines):
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        open_after.append(depth != 0)
        text = line.strip()
        ind = _indent(line)
        while loops and text and ind <= loops[-1][1]:
            loops.pop()
        names = _NAME.findall(line)
        in_loop.append(bool(loops))
        if "lambda" in text or text.startswith("def ") or loops:
            banned.update(names)
        if text.startswith(("for ", "while ")):
            loops.append((i, ind))
        for n in names:
            last[n] = i
    after: dict[int, list[str]] = {}
    for n, i in last.items():
        text = lines[i].strip()
        if n in banned or in_loop[i] or open_after[i] or text.endswith(":") or text.startswith("return"):
            continue
        after.setdefault(i, []).append(n)
    out, origin = [], []
    for i, line in enumerate(lines):
        out.append(line)
        origin.append(i)
        if i in after:
            out.append(" " * _indent(line) + "del " + ", ".join(sorted(after[i])))
            origin.append(-1)
    return out, origin

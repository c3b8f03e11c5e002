"""Arena offsets: where each intermediate buffer lives in one block, from sizes and lifetimes.

A pure function, as in tinygrad's memory planner: given each buffer's size in bytes and the
interval of steps during which it holds live data, give every buffer an offset so that two
buffers alive at the same step never overlap, and report the block's total size.

Greedy by size: the largest buffer goes first, at the lowest offset that does not collide with
an already placed buffer whose lifetime overlaps; smaller buffers fill the gaps the large ones
leave. Offsets are aligned (64 bytes: a cache line, and enough for any dtype's alignment).
"""

from __future__ import annotations

from collections.abc import Sequence

ALIGN = 64


def _up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def plan_offsets(sizes: Sequence[int], first: Sequence[int], last: Sequence[int],
                 align: int = ALIGN) -> tuple[list[int], int]:
    """Offsets (bytes) for buffers i with ``sizes[i]`` bytes, live from step ``first[i]`` to
    ``last[i]`` inclusive; and the total bytes of the block."""
    n = len(sizes)
    order = sorted(range(n), key=lambda i: (-sizes[i], first[i], i))
    offsets = [0] * n
    placed: list[tuple[int, int, int, int]] = []  # (first, last, start, end) of placed buffers
    total = 0
    for i in order:
        size = _up(max(sizes[i], 1), align)
        f, l = first[i], last[i]
        # the address ranges of placed buffers alive at the same time as this one, by start
        busy = sorted((s, e) for pf, pl, s, e in placed if pf <= l and f <= pl)
        at = 0
        for s, e in busy:
            if at + size <= s:
                break
            at = max(at, e)
        offsets[i] = at
        placed.append((f, l, at, at + size))
        total = max(total, at + size)
    return offsets, total


def lower_bound(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> int:
    """The most bytes alive at any one step: no placement can use a smaller block."""
    if not sizes:
        return 0
    steps = sorted(set(first) | set(last))
    return max(sum(_up(max(s, 1)) for s, f, l in zip(sizes, first, last) if f <= t <= l) for t in steps)

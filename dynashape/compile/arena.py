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


def overlapping(first: Sequence[int], last: Sequence[int]) -> list[list[int]]:
    """For each buffer, the others whose lifetimes share a step with its own. Lifetimes are fixed
    by the graph (sizes change with the shapes): a runner computes this once and plans each new
    signature from it (a first call at a new shape replans)."""
    n = len(first)
    return [[j for j in range(n) if j != i and first[j] <= last[i] and first[i] <= last[j]] for i in range(n)]


def plan_offsets(sizes: Sequence[int], first: Sequence[int], last: Sequence[int],
                 align: int = ALIGN, overlaps: Sequence[Sequence[int]] | None = None) -> tuple[list[int], int]:
    """Offsets (bytes) for buffers i with ``sizes[i]`` bytes, live from step ``first[i]`` to
    ``last[i]`` inclusive; and the total bytes of the block. ``overlaps``: ``overlapping(first,
    last)``, when the caller keeps it."""
    n = len(sizes)
    if overlaps is None:
        overlaps = overlapping(first, last)
    order = sorted(range(n), key=lambda i: (-sizes[i], first[i], i))
    offsets = [0] * n
    placed: list[tuple[int, int] | None] = [None] * n  # (start, end) of each placed buffer
    total = 0
    for i in order:
        size = _up(max(sizes[i], 1), align)
        # the address ranges of placed buffers alive at the same time as this one, by start
        busy = sorted([r for r in map(placed.__getitem__, overlaps[i]) if r is not None])
        at = 0
        for s, e in busy:
            if at + size <= s:
                break
            if e > at:
                at = e
        offsets[i] = at
        placed[i] = (at, at + size)
        total = max(total, at + size)
    return offsets, total


def lower_bound(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> int:
    """The most bytes alive at any one step: no placement can use a smaller block."""
    if not sizes:
        return 0
    steps = sorted(set(first) | set(last))
    return max(sum(_up(max(s, 1)) for s, f, l in zip(sizes, first, last) if f <= t <= l) for t in steps)

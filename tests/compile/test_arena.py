"""Arena offsets: buffers alive at a common step never overlap; offsets are aligned; the block is
at least the most bytes alive at once; the planner is a pure function of its inputs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.compile.arena import ALIGN, lower_bound, plan_offsets

PROPS = settings(max_examples=300, deadline=None)


@st.composite
def buffers(draw, max_n: int = 24, max_step: int = 30):
    n = draw(st.integers(0, max_n))
    sizes, first, last = [], [], []
    for _ in range(n):
        sizes.append(draw(st.one_of(st.integers(0, 10**6), st.sampled_from([0, 1, 63, 64, 65, 128]))))
        f = draw(st.integers(0, max_step))
        first.append(f)
        last.append(draw(st.integers(f, max_step)))
    return sizes, first, last


def _up(n: int) -> int:
    return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


@PROPS
@given(bufs=buffers())
def test_buffers_alive_together_never_overlap(bufs):
    sizes, first, last = bufs
    offsets, total = plan_offsets(sizes, first, last)
    assert len(offsets) == len(sizes)
    for i in range(len(sizes)):
        assert offsets[i] % ALIGN == 0
        assert 0 <= offsets[i] and offsets[i] + sizes[i] <= total
        for j in range(i + 1, len(sizes)):
            if first[i] <= last[j] and first[j] <= last[i]:  # a common step
                apart = offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i]
                assert apart, (i, j, offsets[i], sizes[i], offsets[j], sizes[j])


@PROPS
@given(bufs=buffers())
def test_the_block_is_at_least_the_lower_bound(bufs):
    sizes, first, last = bufs
    _, total = plan_offsets(sizes, first, last)
    lb = lower_bound(sizes, first, last)
    assert total >= lb
    # the lower bound is the most (aligned) bytes alive at any step
    steps = set(first) | set(last)
    assert lb == max((sum(_up(s) for s, f, la in zip(sizes, first, last) if f <= t <= la) for t in steps), default=0)
    assert total <= sum(_up(s) for s in sizes)  # never worse than one slot each


@PROPS
@given(bufs=buffers())
def test_the_plan_is_a_pure_function(bufs):
    sizes, first, last = bufs
    copies = (list(sizes), list(first), list(last))
    one = plan_offsets(sizes, first, last)
    two = plan_offsets(tuple(sizes), tuple(first), tuple(last))
    assert one == two
    assert (sizes, first, last) == copies  # the inputs are not touched


@PROPS
@given(size=st.integers(0, 10**6), f=st.integers(0, 50), span=st.integers(0, 50))
def test_a_buffer_alone_is_at_offset_zero(size, f, span):
    offsets, total = plan_offsets([size], [f], [f + span])
    assert offsets == [0]
    assert total == _up(size) == lower_bound([size], [f], [f + span])


@PROPS
@given(sizes=st.lists(st.integers(0, 10**6), min_size=1, max_size=20))
def test_buffers_that_never_meet_share_offset_zero(sizes):
    n = len(sizes)
    offsets, total = plan_offsets(sizes, list(range(n)), list(range(n)))  # one step each
    assert offsets == [0] * n
    assert total == max(_up(s) for s in sizes)


@PROPS
@given(sizes=st.lists(st.integers(0, 10**6), min_size=1, max_size=20))
def test_buffers_alive_all_the_time_are_packed_exactly(sizes):
    n = len(sizes)
    offsets, total = plan_offsets(sizes, [0] * n, [5] * n)
    assert total == sum(_up(s) for s in sizes) == lower_bound(sizes, [0] * n, [5] * n)


@pytest.mark.parametrize("align", [16, 128, 256])
def test_other_alignments(align):
    sizes, first, last = [100, 3, 700, 9], [0, 1, 1, 2], [2, 3, 2, 3]
    offsets, total = plan_offsets(sizes, first, last, align=align)
    assert all(o % align == 0 for o in offsets)
    assert total % align == 0


def test_nothing_to_place():
    assert plan_offsets([], [], []) == ([], 0)
    assert lower_bound([], [], []) == 0


def test_a_gap_left_by_a_dead_buffer_is_reused():
    # b dies before c is born: c fits where b was, below a
    offsets, total = plan_offsets([4096, 1024, 1024], [0, 0, 2], [3, 1, 3])
    assert offsets[0] == 0 and offsets[1] == offsets[2] == 4096
    assert total == 5120

"""codegen/strides.py ``_reshape_strides``: the strides the generated code gives a Reshape that is a
view, computed on SymInts once per specialization. Property: wherever the guards it recorded hold
(every assignment of the symbols in a small grid), the strides evaluated there address exactly the
elements torch's reshape gives; and a tensor with contiguous strides views without any guard (a
guard on ``batch == 1`` made one specialization for batch 1 and another for the rest)."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.codegen.strides import _contiguous, _reshape_strides
from dynashape.shape import expr as E
from dynashape.shape.symint import ShapeEnv, SymInt

NAMES = ("a", "b")
GRID = list(itertools.product(range(1, 5), repeat=2))


def _ev(x, env) -> int:
    return E.evaluate(x.expr, env) if isinstance(x, SymInt) else int(x)


@st.composite
def views(draw):
    """(hints, dims, perm, new dims): dims are constants or symbols, the tensor is a contiguous one
    permuted (a Transpose's output), the new shape regroups the permuted dims (merges of neighbours,
    axes of 1 put in) so that it has the same numel for every value of the symbols."""
    rank = draw(st.integers(1, 4))
    dims = [draw(st.one_of(st.integers(1, 3), st.sampled_from(NAMES))) for _ in range(rank)]
    perm = draw(st.permutations(range(rank)))
    hints = {n: draw(st.integers(1, 3)) for n in NAMES}
    groups, i = [], 0
    while i < rank:
        k = draw(st.integers(1, rank - i))
        groups.append(list(range(i, i + k)))
        i += k
    ones = draw(st.lists(st.integers(0, len(groups)), max_size=2))
    return hints, dims, list(perm), groups, ones


def _build(env, hints, dims, perm, groups, ones):
    syms = {n: env.symbol(n, h) for n, h in hints.items()}
    size = [syms[d] if isinstance(d, str) else d for d in dims]
    strides = _contiguous(size)
    old_shape, old_strides = [size[p] for p in perm], [strides[p] for p in perm]
    new = []
    for g in groups:
        n = 1
        for j in g:
            n = n * old_shape[j]
        new.append(n)
    for pos in sorted(ones, reverse=True):
        new.insert(pos, 1)
    return old_shape, old_strides, new


@settings(max_examples=300, deadline=None)
@given(views())
def test_strides_address_what_torch_reshape_gives_wherever_the_guards_hold(case):
    hints, dims, perm, groups, ones = case
    env = ShapeEnv()
    old_shape, old_strides, new = _build(env, hints, dims, perm, groups, ones)
    out = _reshape_strides(old_shape, old_strides, new)
    guards = list(env.guards.values())
    for a, b in GRID:
        at = {"a": a, "b": b}
        if not all(g.holds(at) for g in guards):
            continue
        shape_c = [_ev(d, at) for d in old_shape]
        strides_c = [_ev(s, at) for s in old_strides]
        new_c = [_ev(d, at) for d in new]
        numel = 1
        for d in shape_c:
            numel *= d
        base = torch.arange(numel)
        t = base.as_strided(shape_c, strides_c)
        if out is None:
            # a copy: right for any sizes. Without symbols it is torch's answer; with them a view
            # that holds only when a symbol is 1 is left to a copy (no guard on ``batch == 1``)
            if all(isinstance(d, int) and not isinstance(d, SymInt) for d in dims):
                try:
                    t.view(new_c)
                    raise AssertionError(f"torch views {shape_c}/{strides_c} as {new_c}; we said copy")
                except RuntimeError:
                    pass
            continue
        mine = base.as_strided(new_c, [_ev(s, at) for s in out])
        assert torch.equal(mine, t.reshape(new_c)), (shape_c, strides_c, new_c, at)


def test_a_contiguous_tensor_views_with_no_guard_at_batch_1():
    env = ShapeEnv()
    batch, seq = env.symbol("batch", 1), env.symbol("seq", 7)
    shape = [batch, seq, 64]
    out = _reshape_strides(shape, _contiguous(shape), [batch, seq, 4, 16])
    assert not env.guards
    assert [E.source(s.expr) if isinstance(s, SymInt) else s for s in out] == ["64*seq", 64, 16, 1]
    # a merge across the batch axis, at batch 1: the same
    out = _reshape_strides(shape, _contiguous(shape), [batch * seq, 64])
    assert not env.guards and out[1] == 1


def test_a_view_that_holds_only_when_a_size_is_1_is_a_copy_with_no_guard():
    """[seq, batch] seen transposed as [batch, seq] and flattened: a view only when one of the two
    is 1. Not asked: a copy, for every size (torch views it at batch 1, copies otherwise)."""
    for hint in (1, 3):
        env = ShapeEnv()
        batch, seq = env.symbol("batch", hint), env.symbol("seq", 5)
        strides = _contiguous([seq, batch])
        assert _reshape_strides([batch, seq], [strides[1], strides[0]], [batch * seq]) is None
        assert not env.guards


def test_no_guard_from_layouts_and_identities():
    env = ShapeEnv()
    n = env.symbol("n", 1)
    # a pool's output in channels-last order: strides of the 1s are not the contiguous ones
    assert _reshape_strides([n, 200, 1, 1], [200, 1, 200, 200], [n, 200]) == (200, 1)
    # the same shape (a no-op reshape of a channels-last tensor): the same strides
    cl = (12544, 1, 1792, 256)
    assert _reshape_strides([n, 256, 7, 7], list(cl), [n, 256, 7, 7]) == cl
    # heads merged after a transpose: [n, 8, 1, 32, 16] -> [8n, 32, 16] is a copy for n > 1
    assert _reshape_strides([n, 8, 1, 32, 16], [4096, 16, 4096, 128, 1], [n * 8, 32, 16]) is None
    assert not env.guards


def test_a_dim_a_guard_made_1_is_1_for_the_views():
    """A SymInt made before the guard that fixed ``batch == 1`` still holds ``batch``; products made
    after it hold 1. Compared as they were, ``seq * batch`` was ``seq`` while ``batch`` was not 1,
    so the heads' reshape of a q/k/v slice at batch 1 was taken for a copy (run per call) instead
    of a view made with its buffer."""
    env = ShapeEnv()
    batch, seq = env.symbol("batch", 1), env.symbol("seq", 16)
    assert bool(batch == 1)  # the guard (a node that asked), after ``batch`` was made
    assert env.replace
    shape, strides = [batch, seq, 64], [seq * 192, 192, 1]  # a slice of a (batch, seq, 192) buffer
    out = _reshape_strides(shape, strides, [batch, seq, 4, 16])
    assert out is not None and [E.source(s.expr) if isinstance(s, SymInt) else s for s in out][1:] == [192, 16, 1]
    base = torch.arange(16 * 192).as_strided([1, 16, 64], [16 * 192, 192, 1])
    assert torch.equal(base.as_strided([1, 16, 4, 16], [16 * 192, 192, 16, 1]), base.reshape(1, 16, 4, 16))

"""PartialShape and Dimension from text: OpenVINO's notation, and the inverse of their repr."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynashape import Dimension, PartialShape
from dynashape.errors import ShapeError


def test_openvino_notation():
    p = PartialShape("[1..8,3,224,224]")
    assert p == PartialShape([Dimension(1, 8), 3, 224, 224])
    assert PartialShape("[?,3]") == PartialShape([None, 3]) == PartialShape("[-1, 3]")
    assert PartialShape("[]").rank == 0
    assert PartialShape("[batch:1..8@1/4, 16..]") == PartialShape(
        [Dimension(1, 8, (1, 4), "batch"), Dimension(16, None)])
    assert Dimension.of("..8") == Dimension(0, 8)


@pytest.mark.parametrize("bad", ["1..8,3", "[1..x]", "[3..1]", "[1 name:3]", "[a b:3]"])
def test_bad_text_is_a_shape_error(bad):
    with pytest.raises(ShapeError):
        PartialShape(bad)


dims = st.one_of(
    st.integers(0, 64).map(lambda n: Dimension(n, n)),
    st.tuples(st.integers(0, 8), st.integers(8, 64)).map(lambda t: Dimension(*t)),
    st.integers(0, 8).map(lambda n: Dimension(n, None)),
    st.tuples(st.sampled_from(["batch", "seq", None]), st.integers(1, 4), st.integers(5, 16), st.integers(0, 1)).map(
        lambda t: Dimension(t[1], t[2], (t[1], t[2]) if t[3] else (), t[0])),
)


@given(st.lists(dims, max_size=5))
def test_repr_round_trips(ds):
    p = PartialShape(ds)
    q = PartialShape(repr(p))
    assert q == p and [d.symbol for d in q] == [d.symbol for d in p] and [d.optimals for d in q] == [
        d.optimals for d in p]

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynashape import Dimension, PartialShape
from dynashape.errors import ShapeError
from dynashape.shape import broadcast_dim


def test_dimension_basics():
    d = Dimension(1, 8, optimals=(4, 1))
    assert d.is_dynamic and not d.is_static
    assert d.optimals == (1, 4)
    assert d.contains(1) and d.contains(8) and not d.contains(9) and not d.contains(0)
    assert Dimension(3, 3).is_static and int(Dimension(3, 3)) == 3
    assert Dimension().max is None and Dimension().contains(10**9)
    assert Dimension.of(5) == Dimension(5, 5) and Dimension.of(None) == Dimension() and Dimension.of(-1) == Dimension()
    assert repr(Dimension(2, None, symbol="seq")) == "seq:2.."


def test_dimension_rejects_bad_ranges():
    with pytest.raises(ShapeError):
        Dimension(5, 2)
    with pytest.raises(ShapeError):
        Dimension(-1, 2)
    with pytest.raises(ShapeError, match="outside"):
        Dimension(1, 4, optimals=(8,))


def test_merge_and_union():
    assert Dimension(1, 10).merge(Dimension(5, None)) == Dimension(5, 10)
    assert Dimension(1, 10).merge(4) == Dimension(4, 4)
    with pytest.raises(ShapeError, match="do not overlap"):
        Dimension(1, 3).merge(Dimension(5, 9))
    assert Dimension(1, 3).union(Dimension(5, 9)) == Dimension(1, 9)


def test_interval_arithmetic():
    a, b = Dimension(1, 4), Dimension(2, 3)
    assert a + b == Dimension(3, 7)
    assert a * b == Dimension(2, 12)
    assert a * 1 is a
    assert a * 0 == 0
    assert (Dimension(4, 9) // 2) == Dimension(2, 4)
    assert Dimension(2, None) + 1 == Dimension(3, None)
    s = Dimension(1, 9, symbol="n")
    assert s - s == 0  # same symbol: provably equal


def test_symbols_prove_equality():
    a = Dimension(1, 64, symbol="batch")
    b = Dimension(1, 64, symbol="batch")
    assert a.known_equal(b)
    assert not a.known_equal(Dimension(1, 64))
    assert broadcast_dim(a, b) is a


def test_partial_shape():
    p = PartialShape([Dimension(1, 8), 3, None])
    assert p.rank == 3 and not p.is_static
    assert p.mismatch((2, 3, 100)) is None
    assert "axis 1 is 4" in p.mismatch((2, 4, 1))
    assert "rank 2 given" in p.mismatch((2, 3))
    assert p.compatible((8, 3, 1)) and not p.compatible((9, 3, 1))
    assert p.to_static("min") == (1, 3, 0)
    with pytest.raises(ShapeError):
        p.to_static()
    assert PartialShape([2, 3]).to_static() == (2, 3)
    assert p.merge([4, 3, Dimension(2, 5)]) == PartialShape([4, 3, Dimension(2, 5)])
    with pytest.raises(ShapeError):
        p.merge([1, 2])


def test_partial_shape_broadcast():
    a = PartialShape([Dimension(1, 8), 1, 5])
    b = PartialShape([4, 5])
    assert a.broadcast(b) == PartialShape([Dimension(1, 8), 4, 5])
    with pytest.raises(ShapeError):
        PartialShape([3]).broadcast([4])
    # a dynamic dim that cannot be 1 must equal the other side
    assert PartialShape([Dimension(2, 8)]).broadcast([Dimension(4, 16)]) == PartialShape([Dimension(4, 8)])


dims = st.integers(0, 6)


@given(st.lists(dims, min_size=0, max_size=4), st.lists(dims, min_size=0, max_size=4))
def test_broadcast_matches_numpy(a, b):
    """Concrete broadcasting agrees with numpy, and a range that holds each concrete shape holds
    the broadcast of the concrete shapes."""
    import numpy as np
    try:
        want = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        with pytest.raises(ShapeError):
            PartialShape(a).broadcast(b)
        return
    got = PartialShape(a).broadcast(b)
    assert got.to_static() == want
    loose = PartialShape([Dimension(0, x + 2) if x != 1 else 1 for x in a]).broadcast(
        [Dimension(0, x + 2) if x != 1 else 1 for x in b])
    assert loose.compatible(want)


@given(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(0, 20))
def test_interval_arithmetic_contains_results(lo1, w1, lo2, w2):
    a, b = Dimension(lo1, lo1 + w1), Dimension(lo2, lo2 + w2)
    for x in (a.min, a.max):
        for y in (b.min, b.max):
            assert Dimension.of(a + b).contains(x + y)
            assert Dimension.of(a * b).contains(x * y)

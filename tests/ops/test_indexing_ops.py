"""Indexing ops (indexing.py) and data-dependent ops (data_dependent.py) over sequences of
shapes in one session, against onnxruntime and the ONNX reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

from .test_tensor_ops import I64, ints, run_op


def idx(shape, lo, hi, dtype=I64):
    """Random indices in [lo, hi) (negative ones count from the end)."""
    return lambda rng: rng.integers(lo, hi, size=shape).astype(dtype)


def ivals(shape, lo=-9, hi=9, dtype=np.int32):
    return lambda rng: rng.integers(lo, hi, size=shape).astype(dtype)


# ---- Gather family ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [I64, np.int32])
def test_gather_axis0_negative_indices(dtype):
    run_op("Gather", [[(5, 3), idx((4,), -5, 5, dtype)], [(2, 4), idx((2, 3), -2, 2, dtype)],
                      [(7,), idx((), -7, 7, dtype)], [(5, 3), idx((4,), -5, 5, dtype)],
                      [(3, 2, 2), idx((1,), -3, 3, dtype)]])


def test_gather_axis1_and_const_indices():
    run_op("Gather", [[(2, 5), idx((3,), -5, 5)], [(3, 4, 2), idx((2, 2), -4, 4)], [(1, 2), idx((5,), -2, 2)],
                      [(2, 5), idx((3,), -5, 5)], [(4, 3), idx((), -3, 3)]], {"axis": 1})
    run_op("Gather", [[s, None] for s in [(3, 4), (5, 2), (2, 3, 2), (3, 4), (2, 6)]], {"axis": -1},
           const={1: ints(-1, 0, 1)})


def test_gather_elements():
    run_op("GatherElements", [[(3, 4), idx((2, 4), -3, 3)], [(5, 2), idx((5, 2), -5, 5)],
                              [(2, 3, 2), idx((1, 3, 2), -2, 2)], [(3, 4), idx((2, 4), -3, 3)],
                              [(1, 6), idx((3, 6), -1, 1)]])
    steps = [[(3, 4), idx((3, 2), -4, 4)], [(2, 5), idx((2, 7), -5, 5)], [(4, 1), idx((4, 3), -1, 1)],
             [(3, 4), idx((3, 2), -4, 4)], [(1, 3), idx((1, 1), -3, 3)]]
    run_op("GatherElements", steps, {"axis": 1})
    # the reference evaluator slices shapes with a negative axis as if it were positive and
    # rejects valid inputs: onnxruntime only
    run_op("GatherElements", steps, {"axis": -1}, refs=("ort",))


@pytest.fixture(params=["small", "general"])
def gather_nd_path(request, monkeypatch):
    """GatherND's two CPU paths: few indices checked and made linear in numpy, the general one."""
    from dynashape.ops import indexing
    if request.param == "general":
        monkeypatch.setattr(indexing, "SMALL_ND", 0)


def test_gather_nd(gather_nd_path):
    def nd(data, q, m):
        return lambda rng: np.stack([rng.integers(-d, d, size=q) for d in data[:m]], axis=-1).astype(I64)
    steps = [[(3, 4), nd((3, 4), (2,), 2)], [(5, 2, 3), nd((5, 2), (4,), 1)],
             [(2, 3, 2), nd((2, 3), (2, 2), 2)], [(7, 0), nd((7,), (7,), 1)],  # rows of no element (YOLO's)
             [(3, 4), nd((3, 4), (2,), 2)], [(6,), nd((6,), (3,), 1)]]
    run_op("GatherND", steps)


def test_gather_nd_batch_dims(gather_nd_path):
    def nd(data, q, m):
        return lambda rng: np.stack([rng.integers(0, d, size=q) for d in data[1:1 + m]], axis=-1).astype(I64)
    steps = [[(2, 3, 4), nd((2, 3, 4), (2, 5), 1)], [(3, 2, 2), nd((3, 2, 2), (3, 1), 2)],
             [(1, 4, 3), nd((1, 4, 3), (1, 2), 2)], [(2, 3, 4), nd((2, 3, 4), (2, 5), 1)],
             [(4, 5, 1), nd((4, 5, 1), (4, 3), 1)]]
    run_op("GatherND", steps, {"batch_dims": 1}, opset=13)


# ---- Scatter family --------------------------------------------------------------------------------
def unique_idx(data, upd, axis):
    """Indices along ``axis`` with no repeats in any line, so that reduction 'none' is defined."""
    def f(rng):
        full = list(upd)
        full[axis] = data[axis]
        perm = np.argsort(rng.random(full), axis=axis)
        return np.take(perm, np.arange(upd[axis]), axis=axis).astype(I64) - (rng.random() < 0.5) * data[axis]
    return f


SCATTER_SHAPES = [((4, 3), (2, 3)), ((5, 2), (5, 2)), ((3, 4), (1, 4)), ((4, 3), (2, 3)), ((6, 1), (3, 1))]


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    steps = []
    for d, u in SCATTER_SHAPES:
        ind = unique_idx(d, u, 0) if reduction == "none" else idx(u, -d[0], d[0])
        steps.append([d, ind, u])
    run_op("ScatterElements", steps, {"reduction": reduction, "axis": 0}, opset=18)


def test_scatter_elements_axis1_and_legacy_scatter():
    steps = [[d[::-1], unique_idx(d[::-1], u[::-1], 1), u[::-1]] for d, u in SCATTER_SHAPES]
    run_op("ScatterElements", steps, {"axis": -1}, opset=13)
    # the reference evaluator has no implementation of the legacy Scatter: onnxruntime only
    run_op("Scatter", steps, {"axis": 1}, opset=10, refs=("ort",))


def nd_indices(data, k, m, unique):
    def f(rng):
        n = int(np.prod(data[:m]))
        flat = rng.permutation(n)[:k] if unique else rng.integers(0, n, size=k)
        return np.stack(np.unravel_index(flat, data[:m]), axis=-1).astype(I64)
    return f


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    u = reduction == "none"
    steps = [[(4, 3), nd_indices((4, 3), 2, 1, u), (2, 3)],
             [(3, 2, 2), nd_indices((3, 2, 2), 3, 2, u), (3, 2)],
             [(5,), nd_indices((5,), 4, 1, u), (4,)], [(4, 3), nd_indices((4, 3), 2, 1, u), (2, 3)],
             [(2, 3), nd_indices((2, 3), 5, 2, u), (5,)]]
    run_op("ScatterND", steps, {"reduction": reduction}, opset=18)


# ---- OneHot -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis):
    vals = np.array([-1.0, 3.0], np.float32)
    steps = [[idx((3,), -4, 6), ints(4)[0], vals], [idx((2, 3), -3, 3), ints(3)[0], vals],
             [idx((1,), 0, 5), ints(5)[0], vals], [idx((3,), -4, 6), ints(4)[0], vals],
             [idx((4, 1), -2, 2), ints(2)[0], vals]]
    run_op("OneHot", steps, {"axis": axis}, opset=11)


def test_onehot_const_depth():
    vals = np.array([0, 7], I64)
    steps = [[idx(s, -3, 3), None, vals] for s in [(3,), (2, 2), (5,), (3,), (1, 4)]]
    run_op("OneHot", steps, opset=11, const={1: np.array(3, I64)})
    # depth may also be a 1-element vector; the reference evaluator only takes a scalar there
    run_op("OneHot", steps, opset=11, const={1: ints(3)}, refs=("ort",))


# ---- TopK -------------------------------------------------------------------------------------------
def ties(shape):
    """Small integer values as floats: many ties, which must come out lower index first."""
    return lambda rng: rng.integers(-3, 3, size=shape).astype(np.float32)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_runtime_k(largest):
    steps = [[ties((3, 5)), ints(2)], [ties((2, 7)), ints(7)], [ties((4, 1)), ints(1)],
             [ties((3, 5)), ints(2)],
             [ties((1, 6)), ints(0)], [ties((2, 8)), ints(3)]]
    run_op("TopK", steps, {"largest": largest}, opset=11, n_outputs=2)


def test_topk_const_k_axis0():
    run_op("TopK", [[ties(s), None] for s in [(4, 3), (6, 2), (3, 3), (4, 3), (5, 1)]], {"axis": 0}, opset=11,
           n_outputs=2, const={1: ints(3)})
    run_op("TopK", [[ties(s)] for s in [(3, 4), (2, 6), (3, 3), (3, 4), (5, 2)]], {"k": 2}, opset=9,
           n_outputs=2)


# ---- ArgMax / ArgMin --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("keepdims,last,axis", [(1, 0, 0), (0, 0, -1), (1, 1, 1), (0, 1, 0)])
def test_argmax_argmin(op, keepdims, last, axis):
    steps = [[ivals(s, -2, 2)] for s in [(3, 4), (5, 2), (1, 6), (3, 4), (4, 1)]]
    run_op(op, steps, {"keepdims": keepdims, "select_last_index": last, "axis": axis}, opset=13)


# ---- data-dependent ---------------------------------------------------------------------------------
def test_nonzero():
    run_op("NonZero", [[ivals(s, -1, 2)] for s in [(3, 4), (5,), (2, 2, 3), (3, 4), (1, 1)]])
    run_op("NonZero", [[lambda rng, s=s: rng.random(s) < 0.4]
                       for s in [(3, 4), (6, 2), (1, 3), (3, 4), (2, 5)]])


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_flat(sorted_):
    # unsorted and without axis, the reference evaluator takes Y from the unflattened input
    # (np.take(x, indices, axis=0)), wrong for rank > 1: onnxruntime only there
    refs = ("ort", "ref") if sorted_ else ("ort",)
    run_op("Unique", [[ivals(s, -3, 4, np.float32)] for s in [(3, 4), (7,), (2, 2, 2), (3, 4), (1,)]],
           {"sorted": sorted_}, opset=11, n_outputs=4, refs=refs)


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_axis(sorted_):
    def rows(n, m):
        # few distinct rows, so that some repeat
        return lambda rng: rng.integers(0, 2, size=(n, m)).astype(np.float32)
    steps = [[rows(5, 2)], [rows(3, 3)], [rows(8, 1)], [rows(5, 2)], [rows(2, 4)]]
    run_op("Unique", steps, {"sorted": sorted_, "axis": 0}, opset=11, n_outputs=4)


def test_compress():
    def cond(n):
        return lambda rng: rng.random(n) < 0.5
    run_op("Compress", [[(4, 3), cond(4)], [(2, 5), cond(1)], [(6, 2), cond(6)], [(4, 3), cond(4)],
                        [(3, 3), cond(2)]], {"axis": 0})
    run_op("Compress", [[(4, 3), cond(3)], [(2, 5), cond(5)], [(6, 2), cond(1)], [(4, 3), cond(3)],
                        [(1, 4), cond(4)]], {"axis": -1})
    run_op("Compress", [[(4, 3), cond(12)], [(2, 5), cond(7)], [(6,), cond(6)], [(4, 3), cond(12)],
                        [(3, 3), cond(9)]])

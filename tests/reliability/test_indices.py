"""Indices and sizes read from data (issue 12, item 1): an out-of-range index raises
IndexOutOfRangeError (a bad size ShapeError) naming the node, the value and the size, never a
wrong answer; valid negative indices keep onnxruntime's answer; the session stays usable.

Every case runs one session through: a bad feed as the very first call, then valid and bad feeds
in turn, each valid one compared with onnxruntime (and/or onnx's ReferenceEvaluator). Both
executors. ``DYNASHAPE_TEST_DEVICE=cuda`` runs them on a GPU; there the bad feeds of the ops
that torch's CUDA kernels check with a device-side assert (Gather, GatherElements,
ScatterElements, Scatter) are skipped: an assert ends the process's CUDA context.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.errors import IndexOutOfRangeError, ShapeError

DEVICE = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")
EXECUTORS = ["compiled", "interpreter"]
I64, I32, F32 = np.int64, np.int32, np.float32


def rand(rng: np.random.Generator, *shape) -> np.ndarray:
    """Random non-zero floats: magnitudes in [0.5, 2], random signs."""
    mag = rng.uniform(0.5, 2.0, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(F32)


def i64(*v) -> np.ndarray:
    return np.array(v, I64)


def model(op: str, inputs: list[tuple[str, int, int]], n_out: int = 1, opset: int = 18,
          **attrs) -> onnx.ModelProto:
    """One node named ``bad_<op>``; inputs ``(name, elem_type, rank)`` with dynamic dims, outputs
    typed from ONNX's shape inference (onnxruntime wants typed outputs)."""
    ins = [helper.make_tensor_value_info(n, t, [f"{n}_{k}" for k in range(r)]) for n, t, r in inputs]
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, [n for n, _, _ in inputs], outs, name=f"bad_{op.lower()}", **attrs)
    g = helper.make_graph([node], op.lower(), ins, [helper.make_tensor_value_info(o, TP.UNDEFINED, None)
                                                     for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for o in m.graph.output:
        o.type.tensor_type.elem_type = types.get(o.name) or TP.FLOAT
    return m


@dataclass
class Bad:
    feeds: dict
    error: type  # IndexOutOfRangeError or ShapeError
    needles: tuple[str, ...]  # substrings of the message besides the node name (bad value, size ...)


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    valid: list[dict]
    bad: list[Bad]
    refs: tuple[str, ...] = ("ort", "ref")
    cuda_asserts: bool = False  # the bad feeds would be a device-side assert on CUDA
    rtol: float = 1e-5
    extra: dict = field(default_factory=dict)


def _references(case: Case):
    engines = []
    if "ort" in case.refs:
        import onnxruntime as ort
        engines.append(("onnxruntime", ort.InferenceSession(case.model.SerializeToString(),
                                                            providers=["CPUExecutionProvider"])))
    if "ref" in case.refs:
        from onnx.reference import ReferenceEvaluator
        engines.append(("reference", ReferenceEvaluator(case.model)))
    return engines


def _check_valid(sess, engines, feeds: dict, what: str, rtol: float) -> None:
    got = sess.run(None, feeds)
    for label, engine in engines:
        want = engine.run(None, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g, w = np.asarray(g), np.asarray(w)
            assert g.shape == w.shape and g.dtype == w.dtype, \
                f"{what} vs {label}: {g.shape} {g.dtype} != {w.shape} {w.dtype}"
            np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, err_msg=f"{what} vs {label}")


def _check_bad(sess, case: Case, bad: Bad) -> None:
    with pytest.raises(bad.error) as info:
        sess.run(None, bad.feeds)
    msg = str(info.value)
    node = case.model.graph.node[0]
    assert f"'{node.name}'" in msg and node.op_type in msg, msg
    if bad.error is IndexOutOfRangeError:
        assert "out of range" in msg, msg
    for needle in bad.needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def run_case(case: Case, executor: str) -> None:
    bad = case.bad
    if DEVICE.startswith("cuda") and case.cuda_asserts:
        bad = []
    sess = dynashape.InferenceSession(case.model, executor=executor, device=DEVICE)
    engines = _references(case)
    if bad:
        _check_bad(sess, case, bad[0])  # a failure at the very first call (no trace made yet)
    for step, feeds in enumerate(case.valid):
        _check_valid(sess, engines, feeds, f"{case.name} valid feed {step}", case.rtol)
        for b in bad:  # every bad feed, then the session must still be right
            _check_bad(sess, case, b)
            _check_valid(sess, engines, feeds, f"{case.name} valid feed {step} after an error", case.rtol)


# ---- the cases ----------------------------------------------------------------------------------
def oob(value: int, size: int) -> tuple[str, ...]:
    """What an IndexOutOfRangeError message must hold: the value and the size."""
    return (f"index {value} ", f"size {size}")


def gather_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    cases = []
    for axis, size in ((0, 3), (1, 4)):
        for dt, et in ((I64, TP.INT64), (I32, TP.INT32)):
            m = model("Gather", [("x", TP.FLOAT, 2), ("i", et, 2)], opset=13, axis=axis)
            valid = [{"x": x, "i": np.array([[-size, size - 1], [-1, 0]], dt)},
                     {"x": rand(rng, 3, 4), "i": np.array([[1 - size, -2]], dt)}]
            bad = [Bad({"x": x, "i": np.array([[0, size]], dt)}, IndexOutOfRangeError,
                       (*oob(size, size), f"axis {axis}", "indices[0, 1]")),
                   Bad({"x": x, "i": np.array([[-1, 0], [0, -size - 1]], dt)}, IndexOutOfRangeError,
                       (*oob(-size - 1, size), "indices[1, 1]")),
                   Bad({"x": x, "i": np.array([[100, 0]], dt)}, IndexOutOfRangeError, oob(100, size))]
            cases.append(Case(f"Gather axis {axis} {dt.__name__}", m, valid, bad, cuda_asserts=True))
    # a scalar index
    m = model("Gather", [("x", TP.FLOAT, 2), ("i", TP.INT64, 0)], opset=13, axis=0)
    cases.append(Case("Gather scalar", m, [{"x": x, "i": np.array(-3, I64)}, {"x": x, "i": np.array(2, I64)}],
                      [Bad({"x": x, "i": np.array(3, I64)}, IndexOutOfRangeError, (*oob(3, 3), "(indices;"))],
                      cuda_asserts=True))
    return cases


def gather_elements_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    m = model("GatherElements", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2)], opset=13, axis=1)
    valid = [{"x": x, "i": i64([-4, 3], [0, -1], [-2, 1])}, {"x": rand(rng, 3, 4), "i": i64([-1], [-4], [2])}]
    bad = [Bad({"x": x, "i": i64([0, 4], [0, 0], [0, 0])}, IndexOutOfRangeError, (*oob(4, 4), "indices[0, 1]")),
           Bad({"x": x, "i": i64([0, 0], [0, 0], [-5, 0])}, IndexOutOfRangeError, (*oob(-5, 4), "indices[2, 0]"))]
    m0 = model("GatherElements", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2)], opset=13, axis=0)
    valid0 = [{"x": x, "i": i64([-3, 2, 0, -1], [1, -2, 2, 0])}]
    bad0 = [Bad({"x": x, "i": i64([0, 0, 3, 0])}, IndexOutOfRangeError, (*oob(3, 3), "axis 0", "indices[0, 2]"))]
    # the reference evaluator mishandles negative indices of GatherElements: onnxruntime only
    return [Case("GatherElements axis 1", m, valid, bad, refs=("ort",), cuda_asserts=True),
            Case("GatherElements axis 0", m0, valid0, bad0, refs=("ort",), cuda_asserts=True)]


def gather_nd_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    m = model("GatherND", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2)], opset=13)
    valid = [{"x": x, "i": i64([-1, -4])}, {"x": x, "i": i64([2, 3], [-3, 0], [0, -1])},
             {"x": rand(rng, 3, 4), "i": i64([1, -2], [-2, 1])}]
    bad = [Bad({"x": x, "i": i64([0, 5])}, IndexOutOfRangeError, (*oob(5, 4), "axis 1", "indices[0, 1]")),
           Bad({"x": x, "i": i64([-1, -5])}, IndexOutOfRangeError, (*oob(-5, 4), "axis 1", "indices[0, 1]")),
           Bad({"x": x, "i": i64([0, 0], [3, 0])}, IndexOutOfRangeError, (*oob(3, 3), "axis 0", "indices[1, 0]")),
           Bad({"x": x, "i": i64([0, 0], [1, 1], [-4, 2])}, IndexOutOfRangeError, (*oob(-4, 3), "indices[2, 0]"))]
    # whole rows (m = 1 < rank)
    m1 = model("GatherND", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2)], opset=13)
    valid1 = [{"x": x, "i": i64([-3], [2], [-1])}]
    bad1 = [Bad({"x": x, "i": i64([1], [3])}, IndexOutOfRangeError, (*oob(3, 3), "axis 0", "indices[1, 0]"))]
    # batch_dims = 1: the indices count from the axis after the batch axis
    xb = rand(rng, 2, 3, 4)
    mb = model("GatherND", [("x", TP.FLOAT, 3), ("i", TP.INT64, 3)], opset=13, batch_dims=1)
    validb = [{"x": xb, "i": np.array([[[-3], [2]], [[0], [-1]]], I64)}]
    badb = [Bad({"x": xb, "i": np.array([[[0], [2]], [[3], [0]]], I64)}, IndexOutOfRangeError,
                (*oob(3, 3), "axis 1", "indices[1, 0, 0]"))]
    return [Case("GatherND", m, valid, bad, cuda_asserts=True), Case("GatherND rows", m1, valid1, bad1,
                                                                     cuda_asserts=True),
            Case("GatherND batch_dims", mb, validb, badb, refs=("ort",), cuda_asserts=True)]


def scatter_nd_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    cases = []
    for reduction in ("none", "add", "max"):
        m = model("ScatterND", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2), ("u", TP.FLOAT, 1)], opset=18,
                  reduction=reduction)
        valid = [{"x": x, "i": i64([-1, -4], [0, 3]), "u": rand(rng, 2)},
                 {"x": rand(rng, 3, 4), "i": i64([-3, -1]), "u": rand(rng, 1)}]
        bad = [Bad({"x": x, "i": i64([0, 5]), "u": rand(rng, 1)}, IndexOutOfRangeError,
                   (*oob(5, 4), "axis 1", "indices[0, 1]")),
               Bad({"x": x, "i": i64([1, 1], [-4, 0]), "u": rand(rng, 2)}, IndexOutOfRangeError,
                   (*oob(-4, 3), "axis 0", "indices[1, 0]"))]
        cases.append(Case(f"ScatterND {reduction}", m, valid, bad, cuda_asserts=True))
    # whole rows
    m = model("ScatterND", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2), ("u", TP.FLOAT, 2)], opset=16)
    cases.append(Case("ScatterND rows", m, [{"x": x, "i": i64([-1], [0]), "u": rand(rng, 2, 4)}],
                      [Bad({"x": x, "i": i64([-1], [-7]), "u": rand(rng, 2, 4)}, IndexOutOfRangeError,
                           (*oob(-7, 3), "indices[1, 0]"))], cuda_asserts=True))
    return cases


def scatter_elements_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    cases = []
    for reduction in ("none", "add"):
        m = model("ScatterElements", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2), ("u", TP.FLOAT, 2)], opset=18,
                  axis=1, reduction=reduction)
        valid = [{"x": x, "i": i64([0, -1], [1, -2], [-4, 2]), "u": rand(rng, 3, 2)}]
        bad = [Bad({"x": x, "i": i64([0, 4], [0, 1], [0, 1]), "u": rand(rng, 3, 2)}, IndexOutOfRangeError,
                   (*oob(4, 4), "axis 1", "indices[0, 1]")),
               Bad({"x": x, "i": i64([0, 1], [-5, 1], [0, 1]), "u": rand(rng, 3, 2)}, IndexOutOfRangeError,
                   (*oob(-5, 4), "indices[1, 0]"))]
        cases.append(Case(f"ScatterElements {reduction}", m, valid, bad, cuda_asserts=True))
    m = model("Scatter", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2), ("u", TP.FLOAT, 2)], opset=9, axis=0)
    valid = [{"x": x, "i": i64([-3, 2, 1, -1]), "u": rand(rng, 1, 4)}]
    bad = [Bad({"x": x, "i": i64([0, 3, 0, 0]), "u": rand(rng, 1, 4)}, IndexOutOfRangeError,
               (*oob(3, 3), "Scatter: index", "indices[0, 1]"))]
    cases.append(Case("Scatter", m, valid, bad, refs=("ort",), cuda_asserts=True))
    return cases


def onehot_cases(rng) -> list[Case]:
    on_off = np.array([rand(rng, 1)[0], rand(rng, 1)[0] + 5], F32)
    m = model("OneHot", [("i", TP.INT64, 1), ("d", TP.INT64, 0), ("v", TP.FLOAT, 1)], opset=11)
    # ONNX: an index outside [-depth, depth - 1] is a row of off values, no error
    valid = [{"i": i64(0, -1, 3, -4, 4, -5, 100), "d": np.array(4, I64), "v": on_off},
             {"i": i64(1, -2), "d": np.array(2, I64), "v": on_off}]
    bad = [Bad({"i": i64(0, 1), "d": np.array(0, I64), "v": on_off}, ShapeError, ("depth", "got 0")),
           Bad({"i": i64(0, 1), "d": np.array(-3, I64), "v": on_off}, ShapeError, ("depth", "-3"))]
    mf = model("OneHot", [("i", TP.INT64, 1), ("d", TP.FLOAT, 0), ("v", TP.FLOAT, 1)], opset=11)
    validf = [{"i": i64(0, -1, 3, 7), "d": np.array(3.0, F32), "v": on_off}]
    badf = [Bad({"i": i64(0, 1), "d": np.array(2.5, F32), "v": on_off}, ShapeError, ("depth", "2.5")),
            Bad({"i": i64(0, 1), "d": np.array(np.nan, F32), "v": on_off}, ShapeError, ("depth", "nan")),
            Bad({"i": i64(0, 1), "d": np.array(-2.0, F32), "v": on_off}, ShapeError, ("depth", "-2"))]
    return [Case("OneHot", m, valid, bad), Case("OneHot float depth", mf, validf, badf, refs=("ort",))]


def topk_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    m = model("TopK", [("x", TP.FLOAT, 2), ("k", TP.INT64, 1)], n_out=2, opset=11)
    valid = [{"x": x, "k": i64(2)}, {"x": x, "k": i64(4)}, {"x": rand(rng, 3, 4), "k": i64(0)}]
    bad = [Bad({"x": x, "k": i64(5)}, ShapeError, ("k=5", "out of range", "[0, 4]")),
           Bad({"x": x, "k": i64(-1)}, ShapeError, ("k=-1", "[0, 4]"))]
    m0 = model("TopK", [("x", TP.FLOAT, 2), ("k", TP.INT64, 1)], n_out=2, opset=11, axis=0)
    bad0 = [Bad({"x": x, "k": i64(4)}, ShapeError, ("k=4", "[0, 3]"))]
    return [Case("TopK", m, valid, bad), Case("TopK axis 0", m0, [{"x": x, "k": i64(3)}], bad0)]


def compress_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    m = model("Compress", [("x", TP.FLOAT, 2), ("c", TP.BOOL, 1)], opset=11, axis=1)
    b = lambda *v: np.array(v, bool)  # noqa: E731
    # shorter conditions drop the rest; a longer one with only False past the end is fine
    valid = [{"x": x, "c": b(1, 0, 1, 1)}, {"x": x, "c": b(0, 1)}, {"x": x, "c": b(1, 1, 0, 1, 0, 0)}]
    bad = [Bad({"x": x, "c": b(1, 0, 1, 1, 1)}, IndexOutOfRangeError, (*oob(4, 4), "axis 1")),
           Bad({"x": x, "c": b(0, 0, 0, 0, 0, 0, 1)}, IndexOutOfRangeError, oob(6, 4))]
    mf = model("Compress", [("x", TP.FLOAT, 2), ("c", TP.BOOL, 1)], opset=11)
    validf = [{"x": x, "c": b(*[1, 0] * 6)}, {"x": x, "c": b(1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0)}]
    badf = [Bad({"x": x, "c": b(*[0] * 12, 1)}, IndexOutOfRangeError, (*oob(12, 12), "flattened"))]
    # onnxruntime ignores True entries past the axis's end; the reference evaluator raises as we do:
    # compare the valid feeds with both
    return [Case("Compress axis 1", m, valid, bad), Case("Compress flat", mf, validf, badf)]


def range_cases(rng) -> list[Case]:
    mi = model("Range", [("s", TP.INT64, 0), ("l", TP.INT64, 0), ("d", TP.INT64, 0)], opset=11)
    s = lambda v, dt=I64: np.array(v, dt)  # noqa: E731
    validi = [{"s": s(0), "l": s(7), "d": s(2)}, {"s": s(5), "l": s(-4), "d": s(-3)}, {"s": s(3), "l": s(3), "d": s(1)}]
    badi = [Bad({"s": s(0), "l": s(5), "d": s(0)}, ShapeError, ("delta must not be 0",)),
            Bad({"s": s(2), "l": s(2), "d": s(0)}, ShapeError, ("delta must not be 0",))]
    mf = model("Range", [("s", TP.FLOAT, 0), ("l", TP.FLOAT, 0), ("d", TP.FLOAT, 0)], opset=11)
    f = lambda v: np.array(v, F32)  # noqa: E731
    validf = [{"s": f(0.5), "l": f(3.25), "d": f(0.75)}, {"s": f(1.0), "l": f(-2.0), "d": f(-0.5)}]
    badf = [Bad({"s": f(0.0), "l": f(1.0), "d": f(0.0)}, ShapeError, ("delta must not be 0",)),
            Bad({"s": f(np.nan), "l": f(1.0), "d": f(1.0)}, ShapeError, ("start", "nan")),
            Bad({"s": f(0.0), "l": f(np.inf), "d": f(1.0)}, ShapeError, ("limit", "inf")),
            Bad({"s": f(0.0), "l": f(1.0), "d": f(-np.inf)}, ShapeError, ("delta", "-inf"))]
    return [Case("Range int", mi, validi, badi), Case("Range float", mf, validf, badf)]


def shape_cases(rng) -> list[Case]:
    x = rand(rng, 3, 4)
    fill = onnx.numpy_helper.from_array(rand(rng, 1), "value")
    mc = model("ConstantOfShape", [("s", TP.INT64, 1)], opset=20, value=fill)
    cos = Case("ConstantOfShape", mc, [{"s": i64(2, 3)}, {"s": i64(0, 3)}, {"s": i64(4)}],
               [Bad({"s": i64(2, -3)}, ShapeError, ("negative dim -3",)),
                Bad({"s": i64(-1)}, ShapeError, ("negative dim -1",))])
    me = model("Expand", [("x", TP.FLOAT, 2), ("s", TP.INT64, 1)], opset=13)
    x1 = rand(rng, 1, 4)
    expand = Case("Expand", me, [{"x": x1, "s": i64(3, 4)}, {"x": x1, "s": i64(2, 1, 4)}, {"x": x1, "s": i64(0, 4)}],
                  [Bad({"x": x1, "s": i64(-1, 4)}, ShapeError, ("negative dim -1",)),
                   Bad({"x": x1, "s": i64(-2, 4)}, ShapeError, ("negative dim -2",))])
    mt = model("Tile", [("x", TP.FLOAT, 2), ("r", TP.INT64, 1)], opset=13)
    tile = Case("Tile", mt, [{"x": x, "r": i64(2, 1)}, {"x": x, "r": i64(0, 3)}],
                [Bad({"x": x, "r": i64(-1, 1)}, ShapeError, ("negative repeats", "-1")),
                 Bad({"x": x, "r": i64(1, 1, 1)}, ShapeError, ("3 repeats", "rank 2"))])
    cases = [cos, expand, tile]
    for mode in ("constant", "reflect", "edge"):
        mp = model("Pad", [("x", TP.FLOAT, 2), ("p", TP.INT64, 1)], opset=18, mode=mode)
        valid = [{"x": x, "p": i64(0, 1, 1, 2)}, {"x": x, "p": i64(-1, 1, 0, -2)}]
        bad = [Bad({"x": x, "p": i64(0, -3, 0, -3)}, ShapeError, ("(-3, -3)", "axis 1", "size 4", "-2")),
               Bad({"x": x, "p": i64(-2, 0, -2, 0)}, ShapeError, ("(-2, -2)", "axis 0", "size 3", "-1"))]
        # the reference evaluator (numpy's pad) rejects negative pads: onnxruntime only
        cases.append(Case(f"Pad {mode}", mp, valid, bad, refs=("ort",)))
    return cases


def all_cases() -> list[Case]:
    rng = np.random.default_rng(12)
    return [*gather_cases(rng), *gather_elements_cases(rng), *gather_nd_cases(rng), *scatter_nd_cases(rng),
            *scatter_elements_cases(rng), *onehot_cases(rng), *topk_cases(rng), *compress_cases(rng),
            *range_cases(rng), *shape_cases(rng)]


CASES = {c.name: c for c in all_cases()}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_raises_and_the_session_stays_usable(name, executor):
    run_case(CASES[name], executor)


# ---- the bugs of the issue, spelled out ---------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
def test_gather_nd_does_not_wrap_into_the_next_row(executor):
    """GatherND of [[0, 5]] on a 3x4 tensor returned X[1, 1] and [[-1, -5]] X[1, 3]; onnxruntime
    raises for both."""
    import onnxruntime as ort
    if DEVICE.startswith("cuda"):
        pytest.skip("GatherND's indices are checked by torch's device assert on CUDA (no host sync)")
    x = rand(np.random.default_rng(1), 3, 4)
    m = model("GatherND", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2)], opset=13)
    sess = dynashape.InferenceSession(m, executor=executor, device=DEVICE)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for bad, value in ((i64([0, 5]), 5), (i64([-1, -5]), -5)):
        with pytest.raises(IndexOutOfRangeError, match=re.escape(f"index {value} along axis 1 is out of range "
                                                                 "for size 4 (indices[0, 1]")):
            sess.run(None, {"x": x, "i": bad})
        with pytest.raises(Exception):  # noqa: B017  onnxruntime refuses it too
            ref.run(None, {"x": x, "i": bad})
    (y,) = sess.run(None, {"x": x, "i": i64([-1, -4], [1, 1])})
    np.testing.assert_array_equal(y, np.array([x[2, 0], x[1, 1]]))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_scatter_nd_does_not_write_into_the_next_row(executor):
    import onnxruntime as ort
    if DEVICE.startswith("cuda"):
        pytest.skip("ScatterND's indices are checked by torch's device assert on CUDA (no host sync)")
    rng = np.random.default_rng(2)
    x, u = rand(rng, 3, 4), rand(rng, 1)
    m = model("ScatterND", [("x", TP.FLOAT, 2), ("i", TP.INT64, 2), ("u", TP.FLOAT, 1)], opset=18)
    sess = dynashape.InferenceSession(m, executor=executor, device=DEVICE)
    with pytest.raises(IndexOutOfRangeError, match=r"'bad_scatternd'.*index 5 along axis 1 is out of range for size 4"):
        sess.run(None, {"x": x, "i": i64([0, 5]), "u": u})
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception):  # noqa: B017
        ref.run(None, {"x": x, "i": i64([0, 5]), "u": u})
    (y,) = sess.run(None, {"x": x, "i": i64([-2, -3]), "u": u})
    want = x.copy()
    want[1, 1] = u[0]
    np.testing.assert_array_equal(y, want)


def test_the_error_is_an_index_error():
    """IndexOutOfRangeError is an IndexError, so code written for numpy's errors catches it."""
    x = rand(np.random.default_rng(3), 3, 4)
    m = model("Gather", [("x", TP.FLOAT, 2), ("i", TP.INT64, 1)], opset=13, axis=0)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    if DEVICE.startswith("cuda"):
        pytest.skip("Gather's indices are checked by torch's device assert on CUDA")
    with pytest.raises(IndexError):
        sess.run(None, {"x": x, "i": i64(3)})


def test_slice_clamps_out_of_range_starts_and_ends():
    """Slice never makes a negative size: starts and ends are clamped as ONNX says (no error)."""
    x = rand(np.random.default_rng(4), 3, 4)
    m = model("Slice", [("x", TP.FLOAT, 2), ("st", TP.INT64, 1), ("en", TP.INT64, 1), ("ax", TP.INT64, 1),
                        ("sp", TP.INT64, 1)], opset=13)
    case = Case("Slice", m, [
        {"x": x, "st": i64(-100, 10), "en": i64(100, -100), "ax": i64(0, 1), "sp": i64(1, -1)},
        {"x": x, "st": i64(3), "en": i64(1), "ax": i64(1), "sp": i64(1)},
        {"x": x, "st": i64(-1), "en": i64(-9), "ax": i64(0), "sp": i64(-2)},
        {"x": x, "st": i64(2**62), "en": i64(-2**62), "ax": i64(1), "sp": i64(1)}], [])
    for executor in EXECUTORS:
        run_case(case, executor)


@pytest.mark.parametrize("op", ["GatherND", "ScatterND"])
def test_the_check_made_on_the_device(op):
    """On CUDA GatherND and ScatterND read nothing back (no host sync): rows with an index out of
    range are sent one past the end, where torch's index kernels assert on the device. The mask
    and the linear index are computed here on the CPU with the same functions: the mask must
    refuse exactly the rows the host check refuses, and a refused row must fail the indexing
    instead of landing in another row."""
    import torch

    from dynashape.ops import indexing

    dims = (3, 4)
    data = torch.arange(12.0).reshape(12)
    for rows, ok in (([[0, 5]], [False]), ([[-1, -5]], [False]), ([[3, 0]], [False]), ([[-4, 0]], [False]),
                     ([[-3, -4], [2, 3], [0, 0]], [True, True, True]), ([[1, 1], [2, 4]], [True, False])):
        idx = torch.tensor(rows, dtype=torch.int64)
        bad = indexing.bad_rows(idx, dims)
        assert bad.tolist() == [not o for o in ok]
        lin = indexing._linear(idx, dims, bad)
        assert [v == 12 for v in lin.tolist()] == [not o for o in ok]
        if all(ok):
            assert data[lin].tolist() == [float((r[0] % 3) * 4 + r[1] % 4) for r in rows]
            indexing._check_nd(op, idx, dims, 0, idx.shape)  # the host check agrees
        else:
            with pytest.raises(IndexError):
                data[lin]
            with pytest.raises(IndexOutOfRangeError):
                indexing._check_nd(op, idx, dims, 0, idx.shape)

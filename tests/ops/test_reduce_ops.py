"""Reduce* over shape sequences through one session: axes as attribute (old opsets) and as input
(a shape dependency), keepdims, noop_with_empty_axes, empty reductions."""

import numpy as np
import pytest

from .harness import check_op, rand

OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
       "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
SEQ = [[(2, 3, 4)], [(1, 5, 2)], [(3, 1, 6)], [(2, 3, 4)], [(4, 2, 1)]]


def _input_axes_opset(op):
    return 13 if op == "ReduceSum" else 18


def _positive(op):
    # LogSum needs a positive sum; Prod stays well-conditioned near 1
    if op == "ReduceLogSum":
        return lambda i, shape, rng: rng.uniform(0.1, 2.0, size=shape).astype(np.float32) if i == 0 else None
    if op == "ReduceProd":
        return lambda i, shape, rng: rng.uniform(0.5, 1.5, size=shape).astype(np.float32) if i == 0 else None
    return None


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([0, 2], 0), ([-1], 0), (None, 1), (None, 0)])
def test_reduce_axes_attribute(op, axes, keepdims):
    attrs = {"keepdims": keepdims}
    if axes is not None:
        attrs["axes"] = axes
    check_op(op, SEQ, attrs, opset=11, make_input=_positive(op))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([2, 0], 0), ([-2, -1], 1)])
def test_reduce_axes_input(op, axes, keepdims):
    mk = _positive(op)

    def make(i, shape, rng):
        if i == 1:
            return np.array(axes, dtype=np.int64)
        return mk(i, shape, rng) if mk else None
    check_op(op, [s + [(len(axes),)] for s in SEQ], {"keepdims": keepdims}, opset=_input_axes_opset(op),
             dtypes=[np.float32, np.int64], make_input=make)


@pytest.mark.parametrize("op", OPS)
def test_reduce_axes_input_changes_between_runs(op):
    # the axes value is a shape dependency: each run's value decides the output shape
    mk = _positive(op)
    axes_seq = iter([[0], [1, 2], [2], [0], [0, 1, 2]])

    def make(i, shape, rng):
        if i == 1:
            return np.array(next(axes_seq), dtype=np.int64)
        return mk(i, shape, rng) if mk else None
    seq = [[(2, 3, 4), (1,)], [(1, 5, 2), (2,)], [(3, 1, 6), (1,)], [(2, 3, 4), (1,)], [(4, 2, 1), (3,)]]
    check_op(op, seq, {"keepdims": 0}, opset=_input_axes_opset(op), dtypes=[np.float32, np.int64],
             make_input=make)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_empty_axes(op, noop):
    # no axes input: reduce everything, or (noop_with_empty_axes) apply only the element-wise part
    # (|x| for L1 and L2, x*x for SumSquare, log x for LogSum), as both references do
    check_op(op, SEQ, {"noop_with_empty_axes": noop, "keepdims": 1}, opset=_input_axes_opset(op),
             make_input=_positive(op))


@pytest.mark.parametrize("op", OPS)
def test_reduce_over_empty_dim(op):
    # a zero-sized reduced dim gives the op's identity (0, 1, -inf, +inf, nan for Mean)
    seq = [[(2, 0, 3)], [(3, 0, 1)], [(1, 0, 2)], [(2, 0, 3)], [(4, 0, 2)]]
    # the spec leaves the mean of nothing undefined: onnxruntime gives 0, the reference (and
    # dynashape) 0/0 = nan
    check_op(op, seq, {"axes": [1], "keepdims": 0}, opset=11,
             references=("ref",) if op == "ReduceMean" else ("ort", "ref"))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reduce_integers(op):
    def mk(i, shape, rng):
        return rng.integers(-3, 4, size=shape).astype(np.int64) if i == 0 else None
    check_op(op, SEQ, {"axes": [1], "keepdims": 1}, opset=11, dtypes=[np.int64], make_input=mk)


def test_reduce_max_bool_opset20():
    seq = [s + [(1,)] for s in SEQ]

    def mk(i, shape, rng):
        return np.array([1], dtype=np.int64) if i == 1 else rand(shape, np.bool_, rng)
    for op in ("ReduceMax", "ReduceMin"):
        check_op(op, seq, {"keepdims": 0}, opset=20, dtypes=[np.bool_, np.int64], make_input=mk)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_leading_axes_add_rows_in_onnxruntimes_order(op):
    """Over axes that come before every kept one (size-1 axes aside), onnxruntime's CPU kernel adds
    the rows one after another: the same bits here, on values whose sum cancels (magika's LayerNorm
    variance). Changing shapes, fresh inputs each call; the kept-reduced-kept case stays torch's."""
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper

    import dynashape
    n = helper.make_node(op, ["x"], ["y"], axes=[0, 1], keepdims=0)
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["A", "B", "C"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]).SerializeToString()
    ours, ref = dynashape.InferenceSession(model), ort.InferenceSession(model)
    rng = np.random.default_rng(3)
    for shape in [(1, 512, 256), (3, 70, 9), (1, 1, 33), (2, 300, 7), (1, 5, 1)]:
        x = (rng.standard_normal(shape) * 1e3 + 1e4).astype(np.float32)
        x[:, ::2] *= -1  # large terms of both signs: the order of the additions shows in the last bits
        got, want = ours.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want, err_msg=str(shape))

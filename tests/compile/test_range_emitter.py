"""Range whose start, limit and delta the shape program knows (positions 0 .. seq, a decoder's
relative positions) is emitted as torch.arange over the output's own length: the same values as
the kernel, onnxruntime and the interpreter over changing lengths, counts of zero (a limit below the
start) and negative steps included."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from tests.ops.harness import DEVICE


def _model(start: int, delta: int, offset: int, dtype=TP.INT64):
    """y = Range(start, Shape(x)[1] + offset, delta), the limit cast to ``dtype``."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], start=1, end=2),
        helper.make_node("Squeeze", ["shp", "ax0"], ["n"]),
        helper.make_node("Add", ["n", "off"], ["limit"]),
        helper.make_node("Cast", ["limit"], ["limit_t"], to=dtype),
        helper.make_node("Range", ["start", "limit_t", "delta"], ["y"]),
    ]
    np_t = {TP.INT64: np.int64, TP.INT32: np.int32}[dtype]
    inits = [numpy_helper.from_array(v, name) for v, name in (
        (np.array([0], np.int64), "ax0"), (np.array(offset, np.int64), "off"), (np.array(start, np_t), "start"),
        (np.array(delta, np_t), "delta"))]
    g = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("x", TP.FLOAT, [1, "seq"])],
                          [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("start, delta, offset", [(0, 1, 0), (3, 2, 5), (10, -3, -4), (7, 1, -20), (0, 4, 1)])
@pytest.mark.parametrize("dtype", [TP.INT64, TP.INT32])
def test_range_of_known_ints(start, delta, offset, dtype):
    import onnxruntime as ort
    m = _model(start, delta, offset, dtype)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    ref = dynashape.InferenceSession(m, device=DEVICE, executor="interpreter")
    o = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 5, 12, 2, 30, 5):
        feeds = {"x": np.random.default_rng(n).standard_normal((1, n)).astype(np.float32)}
        got, want, inter = sess.run(None, feeds)[0], o.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(inter, want)
    assert any("torch.arange(" in sp.source for sp in sess.compiled.specs)  # emitted, not the kernel

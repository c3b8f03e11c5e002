"""Declared input and output shapes follow the session's dynamic-dim options (a model saved with
batch 1 and run with dynamic_dims at batch 1..8 says so in get_outputs, as it runs)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import Dimension, PartialShape


def test_outputs_follow_dynamic_dims():
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("ReduceMean", ["h"], ["y"], axes=[1])],
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [1, 1, 4])],
        value_info=[helper.make_tensor_value_info("h", TP.FLOAT, [1, 3, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed = dynashape.InferenceSession(m)
    assert fixed.get_outputs()[0].partial_shape == PartialShape([1, 1, 4])
    sess = dynashape.InferenceSession(m, dynamic_dims={"x": [Dimension(1, 8), 3, 4]})
    assert sess.get_inputs()[0].partial_shape == PartialShape("[1..8,3,4]")
    assert sess.get_outputs()[0].partial_shape == PartialShape("[1..8,1,4]")
    assert sess.get_outputs()[0].shape == [None, 1, 4]
    x = np.random.default_rng(0).uniform(-1, 1, (5, 3, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x, 0).mean(axis=1, keepdims=True), rtol=1e-6)

"""Intermediate values as outputs (extra_outputs) and first_divergence against onnxruntime."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.debug import first_divergence
from dynashape.errors import OptionsError
from dynashape.ops import registry

from .helpers import rand


def _model() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).uniform(-1, 1, (4, 5)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm_node"),
             helper.make_node("Relu", ["mm"], ["act"], name="act_node"),
             helper.make_node("ReduceSum", ["act"], ["s"], name="sum_node", keepdims=1),
             helper.make_node("Add", ["act", "s"], ["y"], name="add_node")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 5])], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_extra_outputs_follow_the_models_own(executor):
    import onnxruntime as ort
    m = _model()
    s = dynashape.InferenceSession(m, executor=executor, extra_outputs=["act", "mm"])
    assert [a.name for a in s.get_outputs()] == ["y", "act", "mm"]
    w = onnx.numpy_helper.to_array(m.graph.initializer[0])
    for n in (3, 1, 6):
        x = rand(n, 4)
        y, act, mm = s.run(None, {"x": x})
        np.testing.assert_allclose(mm, x @ w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(act, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    every = dynashape.InferenceSession(m, executor=executor, extra_outputs="all")
    assert [a.name for a in every.get_outputs()] == ["y", "mm", "act", "s"]


def test_extra_outputs_names_must_exist():
    with pytest.raises(OptionsError, match="nope"):
        dynashape.InferenceSession(_model(), extra_outputs=["nope"])


def test_first_divergence_agrees_on_a_right_model():
    rows = first_divergence(_model(), {"x": rand(3, 4)}, all_rows=True)
    assert [r.output for r in rows] == ["mm", "act", "s", "y"]
    assert all(r.max_abs < 1e-5 for r in rows)


def test_first_divergence_names_the_node_that_parts(monkeypatch):
    # a Relu that lets a little through below zero: what a wrong kernel looks like from outside
    key = ("", "Relu")
    versions = registry._REGISTRY[key]
    leaky = [dataclasses.replace(v, fn=lambda x, out=None: torch_leaky(x, out)) for v in versions]
    monkeypatch.setitem(registry._REGISTRY, key, leaky)
    x = rand(3, 4) * 3
    rows = first_divergence(_model(), {"x": x})
    assert rows and rows[0].node == "act_node" and rows[0].op_type == "Relu" and rows[0].max_abs > 1e-3
    assert rows[0].output == "act"


def torch_leaky(x, out):
    import torch
    y = torch.nn.functional.leaky_relu(x, 0.1)
    return out.copy_(y) if out is not None else y

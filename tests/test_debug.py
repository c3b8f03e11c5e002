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


def _scalar_model() -> onnx.ModelProto:
    """0-d intermediates: a norm of x (ReduceSumSquare to a scalar, Sqrt), x divided by it, and a
    scalar count from the shape (Size -> Cast) subtracted."""
    nodes = [helper.make_node("ReduceSumSquare", ["x"], ["ss"], name="ss_node", keepdims=0),
             helper.make_node("Sqrt", ["ss"], ["norm"], name="norm_node"),
             helper.make_node("Div", ["x", "norm"], ["unit"], name="unit_node"),
             helper.make_node("Size", ["x"], ["count"], name="count_node"),
             helper.make_node("Cast", ["count"], ["countf"], name="countf_node", to=TP.FLOAT),
             helper.make_node("Reciprocal", ["countf"], ["inv"], name="inv_node"),
             helper.make_node("Sub", ["unit", "inv"], ["y"], name="y_node")]
    g = helper.make_graph(nodes, "scalars", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", "m"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", "m"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_first_divergence_compares_0d_values():
    rng = np.random.default_rng(5)
    for shape in [(3, 4), (1, 7), (5, 2), (3, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        rows = first_divergence(_scalar_model(), {"x": x}, all_rows=True)
        assert [r.output for r in rows] == ["ss", "norm", "unit", "count", "countf", "inv", "y"], shape
        assert all(r.max_abs <= 1e-5 for r in rows), rows
        assert first_divergence(_scalar_model(), {"x": x}) == []


def test_first_divergence_names_a_0d_node_that_parts(monkeypatch):
    key = ("", "Sqrt")  # a square root off by 1%: the first value to part is a 0-d one
    versions = registry._REGISTRY[key]
    off = [dataclasses.replace(v, fn=lambda x, out=None: _scaled_sqrt(x, out)) for v in versions]
    monkeypatch.setitem(registry._REGISTRY, key, off)
    x = np.random.default_rng(6).standard_normal((4, 3)).astype(np.float32)
    # (the interpreter calls the registered kernel; the generated code calls torch.sqrt itself)
    rows = first_divergence(_scalar_model(), {"x": x}, executor="interpreter")
    assert rows and rows[0].node == "norm_node" and rows[0].output == "norm" and rows[0].max_abs > 1e-3, rows


def _scaled_sqrt(x, out):
    import torch
    y = torch.sqrt(x) * 1.01
    return out.copy_(y) if out is not None else y


def test_compare_values_of_0d_and_infinite_values():
    from dynashape.debug import compare_values
    assert compare_values(np.float32(2.0), np.float32(2.0), 1e-4, 1e-5) == (0.0, False, "")
    err, bad, _ = compare_values(np.float32(2.5), np.float32(2.0), 1e-4, 1e-5)
    assert bad and err == 0.5
    inf = np.array([-np.inf, 1.0, np.nan], np.float32)
    assert compare_values(inf, inf.copy(), 1e-4, 1e-5)[1] is False  # a mask's -inf equals -inf
    assert compare_values(np.array([np.inf], np.float32), np.array([-np.inf], np.float32), 1e-4, 1e-5)[1] is True


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_extra_outputs_return_an_initializer_and_an_input_as_onnxruntime_does(executor):
    """onnxruntime returns a graph output that is an initializer (the constant) or an input (the
    feed): extra_outputs naming one does the same."""
    import onnxruntime as ort
    m = _model()
    s = dynashape.InferenceSession(m, executor=executor, extra_outputs=["w", "act", "x"])
    assert [a.name for a in s.get_outputs()] == ["y", "w", "act", "x"]
    plain = onnx.ModelProto()
    plain.CopyFrom(m)
    for name in ("w", "act", "x"):
        plain.graph.output.append(helper.make_tensor_value_info(name, TP.FLOAT, None))
    ref = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for n in (3, 1, 6):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got, want = s.run(None, {"x": x}), ref.run(None, {"x": x})
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[1], onnx.numpy_helper.to_array(m.graph.initializer[0]))
        np.testing.assert_array_equal(got[3], x)


def test_extra_outputs_unknown_name_says_what_names_are_allowed():
    with pytest.raises(OptionsError, match=r"\['nope'\], which is no node output, initializer or input"):
        dynashape.InferenceSession(_model(), extra_outputs=["w", "nope"])

"""Ifs whose condition is known at compile time become the nodes of the branch taken
(dynashape/compile/inline_if.py), including conditions that test the rank of another If's output,
which only folds once the If's output shapes are inferred from its branches."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

import dynashape  # noqa: E402

F32 = TensorProto.FLOAT


def _branch(name: str, op: str, src: str, out: str):
    nodes = [helper.make_node(op, [src], [out], name=f"{name}_{op}")]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F32, None)])


def _model(cond_true: bool) -> bytes:
    """y = If(const)(Relu(x) | Neg(x)); z = If(rank(y) == 2)(Sigmoid(y) | Abs(y)); both fold."""
    cond = numpy_helper.from_array(np.array(cond_true), "cond")
    two = numpy_helper.from_array(np.array(2, dtype=np.int64), "two")
    nodes = [
        helper.make_node("If", ["cond"], ["y"], name="if_const",
                         then_branch=_branch("then1", "Relu", "x", "t1"),
                         else_branch=_branch("else1", "Neg", "x", "t1")),  # same name as in then1 on purpose
        helper.make_node("Shape", ["y"], ["ys"]),
        helper.make_node("Size", ["ys"], ["rank"]),
        helper.make_node("Equal", ["rank", "two"], ["is2"]),
        helper.make_node("If", ["is2"], ["z"], name="if_rank",
                         then_branch=_branch("then2", "Sigmoid", "y", "t1"),  # collides with t1 above
                         else_branch=_branch("else2", "Abs", "y", "t2")),
        helper.make_node("Add", ["z", "x"], ["out"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", "M"])],
                          [helper.make_tensor_value_info("out", F32, None)], [cond, two])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("cond_true", [True, False])
@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_constant_ifs_are_inlined_and_agree_with_onnxruntime(cond_true, executor):
    model = _model(cond_true)
    s = dynashape.InferenceSession(model, executor=executor)
    assert [n.op_type for n in s.program.graph.nodes if n.op_type == "If"] == []
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for shape in [(2, 3), (5, 7), (1, 1), (2, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_if_on_a_runtime_condition_stays_and_gets_its_output_rank():
    # rank differs between the branches: the If stays, and its output rank stays unknown
    n = helper.make_node("If", ["c"], ["y"], name="if_rt",
                         then_branch=_branch("a", "Relu", "x", "ta"),
                         else_branch=helper.make_graph(
                             [helper.make_node("Unsqueeze", ["x", "ax"], ["tb"])], "b", [],
                             [helper.make_tensor_value_info("tb", F32, None)],
                             [numpy_helper.from_array(np.array([0], dtype=np.int64), "ax")]))
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", F32, ["N"]),
                                     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    s = dynashape.InferenceSession(model)
    if_node = next(n for n in s.program.graph.nodes if n.op_type == "If")
    assert if_node.outputs[0].shape is None
    x = np.random.default_rng(2).standard_normal(4).astype(np.float32)
    assert s.run(None, {"x": x, "c": np.array(False)})[0].shape == (1, 4)
    np.testing.assert_array_equal(s.run(None, {"x": x, "c": np.array(True)})[0], np.maximum(x, 0))


def test_a_branch_that_returns_a_view_of_an_outer_value_keeps_that_value_alive():
    # then: a view of `a` (computed outside the If) comes out of the If; `b`, made after the If,
    # must not take a's arena memory while the If's output is still to be read.
    then = helper.make_graph([helper.make_node("Reshape", ["a", "shp"], ["ta"])], "then", [],
                             [helper.make_tensor_value_info("ta", F32, None)],
                             [numpy_helper.from_array(np.array([-1], dtype=np.int64), "shp")])
    other = helper.make_graph([helper.make_node("Abs", ["x_flat"], ["tb"])], "else", [],
                              [helper.make_tensor_value_info("tb", F32, None)])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Flatten", ["x"], ["x2d"], axis=0),
             helper.make_node("Squeeze", ["x2d", "zero"], ["x_flat"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["b2"]),
             helper.make_node("Flatten", ["b2"], ["b3"], axis=0),
             helper.make_node("Squeeze", ["b3", "zero"], ["b4"]),
             helper.make_node("Add", ["y", "b4"], ["out"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", 4]),
                                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("out", F32, None)],
                          [numpy_helper.from_array(np.array([0], dtype=np.int64), "zero")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    s = dynashape.InferenceSession(model)
    rng = np.random.default_rng(3)
    for n, c in [(3, True), (5, True), (2, False), (3, True)]:
        x = rng.standard_normal((n, 4)).astype(np.float32)
        y = np.maximum(x, 0) if c else np.abs(x)
        expect = y.reshape(-1) + 1 / (1 + np.exp(x.reshape(-1)))
        np.testing.assert_allclose(s.run(None, {"x": x, "c": np.array(c)})[0], expect, rtol=1e-5, atol=1e-6)

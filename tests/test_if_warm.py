"""An If's branch not taken is compiled at the node's first run (runtime/bodies.py
``BodyRunner.warm``): run once with that run's outer values, outputs dropped, so the first call
that takes it does not trace and generate code. A branch that cannot run on those values is left
to its first real use, with no error surfacing and right results. (decided_ifs=False: the If on a
scalar input runs as a node here; tests/test_decided_ifs.py covers the variants.)"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper

import dynashape


def _model(else_op: str = "Mul", else_needs_pair: bool = False):
    def branch(name, op):
        if else_needs_pair and name == "else":  # a reshape to pairs: fails on odd lengths
            shape = helper.make_tensor("shp", TP.INT64, [2], [-1, 2])
            axes = helper.make_tensor("ax", TP.INT64, [1], [1])
            nodes = [helper.make_node("Constant", [], ["s"], value=shape),
                     helper.make_node("Constant", [], ["a"], value=axes),
                     helper.make_node("Reshape", ["x", "s"], ["r"]),
                     helper.make_node("ReduceSum", ["r", "a"], [name + "_y"], keepdims=0)]
        else:
            nodes = [helper.make_node(op, ["x", "x"], [name + "_y"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(name + "_y", TP.FLOAT, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "Add"), else_branch=branch("else", else_op))
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TP.FLOAT, ["n"]),
                                        helper.make_tensor_value_info("c", TP.BOOL, [])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_other_branch_runs_once_at_the_first_call():
    sess = dynashape.InferenceSession(_model(), decided_ifs=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "c": np.array(True)})[0], x + x)
    assert sess.stats()["compiled_runs"] == 3  # the graph, the branch taken, the other one once
    x2 = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x2, "c": np.array(False)})[0], x2 * x2)
    np.testing.assert_allclose(sess.run(None, {"x": x, "c": np.array(True)})[0], x + x)
    assert sess.stats()["compiled_runs"] == 7  # and never again: two per call


def test_a_branch_that_cannot_run_on_these_values_waits_for_its_use():
    sess = dynashape.InferenceSession(_model(else_needs_pair=True), decided_ifs=False)
    rng = np.random.default_rng(1)
    odd = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": odd, "c": np.array(True)})[0], odd + odd)
    even = rng.standard_normal(6).astype(np.float32)
    got = sess.run(None, {"x": even, "c": np.array(False)})[0]
    np.testing.assert_allclose(got, even.reshape(-1, 2).sum(1), rtol=1e-6)
    np.testing.assert_allclose(sess.run(None, {"x": odd, "c": np.array(True)})[0], odd + odd)

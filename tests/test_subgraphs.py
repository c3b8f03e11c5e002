"""Subgraphs: parsed with outer-scope reads, run as nested networks that see this run's values."""

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

from .ops.harness import run_sequence


def if_model() -> onnx.ModelProto:
    # then: x * w (w an outer input), else: x + outer constant; both read outer values
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TP.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "M"]),
                                         helper.make_tensor_value_info("w", TP.FLOAT, ["M"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "M"])],
                          initializer=[onnx.numpy_helper.from_array(np.array(0, np.float32), "zero"),
                                       onnx.numpy_helper.from_array(np.array([3.5], np.float32), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_with_outer_values_over_changing_shapes():
    rng = np.random.default_rng(0)
    feeds = []
    for n, m, sign in ((2, 3, 1), (5, 4, -1), (2, 3, -1), (1, 7, 1), (5, 4, 1), (2, 3, 1)):
        x = np.abs(rng.uniform(0.1, 2, (n, m))).astype(np.float32) * sign  # the sum's sign picks the branch
        feeds.append({"x": x, "w": rng.uniform(-2, 2, (m,)).astype(np.float32)})
    sess = run_sequence(if_model(), feeds)
    assert any(n.op_type == "If" for n in sess.program.graph.nodes)

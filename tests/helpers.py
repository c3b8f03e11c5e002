"""Small model builders shared by the core tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper


def add_chain(n: int = 3, shape=("N", 4), opset: int = 17) -> onnx.ModelProto:
    """y = x + b + b + ... (n Adds)."""
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "b"], [f"t{i}" if i < n - 1 else "y"])
             for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, list(shape)),
                                           helper.make_tensor_value_info("b", TP.FLOAT, [1, shape[-1]])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, list(shape))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def two_inputs_shared_symbol() -> onnx.ModelProto:
    """z = x * y where x and y are both [batch, 3]."""
    g = helper.make_graph([helper.make_node("Mul", ["x", "y"], ["z"])], "mul",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 3]),
                           helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 3])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, ["batch", 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def shape_subgraph_model() -> onnx.ModelProto:
    """y = x * (Shape(x)[1] cast to float): a shape_of subgraph feeding data."""
    inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "idx")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "idx"], ["d"], axis=0),
             helper.make_node("Cast", ["d"], ["df"], to=TP.FLOAT),
             helper.make_node("Mul", ["x", "df"], ["y"])]
    g = helper.make_graph(nodes, "shapesub", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "M"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "M"])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rand(*shape, rng=None) -> np.ndarray:
    rng = rng or np.random.default_rng()
    return rng.uniform(-2, 2, size=shape).astype(np.float32)

"""compile/drop_repeated_fake_quant.py: a FakeQuant of values already on its grid (through ops that
only move them) goes; the outputs stay bit for bit those of the unfused Q/DQ nodes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dynashape


def _model() -> onnx.ModelProto:
    """Q/DQ -> MaxPool -> Q/DQ (same grid) -> Reshape -> Q/DQ (same) -> Relu -> Q/DQ (another scale) -> Neg."""
    inits = [numpy_helper.from_array(np.array(0.07, np.float32), "s"),
             numpy_helper.from_array(np.array(0.11, np.float32), "s2"),
             numpy_helper.from_array(np.array(120, np.uint8), "z"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "flat")]

    def qdq(x, y, s="s"):
        return [helper.make_node("QuantizeLinear", [x, s, "z"], [y + "_q"]),
                helper.make_node("DequantizeLinear", [y + "_q", s, "z"], [y])]
    nodes = (qdq("x", "a") + [helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
             + qdq("p", "b") + [helper.make_node("Reshape", ["b", "flat"], ["r"])] + qdq("r", "c")
             + [helper.make_node("Relu", ["c"], ["d"])] + qdq("d", "e", "s2") + [helper.make_node("Neg", ["e"], ["y"])])
    g = helper.make_graph(nodes, "fq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_repeated_fake_quants_go_and_the_values_stay_bit_for_bit():
    model = _model()
    sess = dynashape.InferenceSession(model)
    fused = [n.op_type for n in sess.program.fused.nodes]
    assert fused.count("FakeQuant") == 2, fused  # the first grid and the other scale's
    unfused = dynashape.InferenceSession(model, fusion=False)
    rng = np.random.default_rng(0)
    for n in (1, 3, 2):
        x = {"x": (rng.standard_normal((n, 4, 6, 6)) * 6).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, x)[0], unfused.run(None, x)[0])


def test_a_grid_of_another_scale_or_range_is_kept():
    import torch

    from dynashape.compile.drop_repeated_fake_quant import _same_grid
    s, s2, z = torch.tensor(0.07), torch.tensor(0.11), torch.tensor(120, dtype=torch.uint8)
    assert _same_grid((s, z, 0, 255), (s.clone(), z.clone(), 0, 255))
    assert not _same_grid((s, z, 0, 255), (s2, z, 0, 255)) and not _same_grid((s, z, 0, 255), (s, z, -128, 127))
    assert not _same_grid((None, z, 0, 255), (s, z, 0, 255))

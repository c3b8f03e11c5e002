"""A custom op registered through the public API runs in both executors over changing shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.errors import OptionsError, UnsupportedOpError


def scaled_tanh(x, *, alpha=1.0, out=None):
    return torch.mul(torch.tanh(x), alpha, out=out)


def keep_positive(x, *, out=None):  # output size from the data: no shape function
    return x[x > 0]


dynashape.register_op("ScaledTanh", scaled_tanh, infer=lambda shapes, values, alpha=1.0: [shapes[0]],
                      domain="com.example")
dynashape.register_op("KeepPositive", keep_positive, infer=None, domain="com.example", writes_out=False)


def model():
    nodes = [helper.make_node("ScaledTanh", ["x"], ["t"], domain="com.example", alpha=2.5, name="st"),
             helper.make_node("Add", ["t", "x"], ["y"]),
             helper.make_node("KeepPositive", ["y"], ["z"], domain="com.example", name="kp")]
    g = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 3]),
                           helper.make_tensor_value_info("z", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                             ir_version=8)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_custom_ops_over_changing_shapes(executor, device):
    sess = dynashape.InferenceSession(model(), device=device, executor=executor)
    rng = np.random.default_rng(0)
    for n in [2, 5, 1, 5, 3]:
        x = rng.uniform(-2, 2, (n, 3)).astype(np.float32)
        y, z = sess.run(None, {"x": x})
        want = np.tanh(x) * 2.5 + x
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(z, want[want > 0], rtol=1e-5, atol=1e-6)


def test_bad_registrations_and_unregistered_ops():
    with pytest.raises(OptionsError):
        dynashape.register_op("", scaled_tanh, infer=None)
    with pytest.raises(OptionsError):
        dynashape.register_op("X", "not callable", infer=None)
    m = model()
    m.graph.node[0].op_type = "NotRegistered"
    with pytest.raises(UnsupportedOpError, match="NotRegistered"):
        dynashape.InferenceSession(m)

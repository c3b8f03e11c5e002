"""fuse_qdq: the QDQ format's QuantizeLinear -> DequantizeLinear pairs as one FakeQuant, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from tests.ops.harness import DEVICE


def _model(zp_type=TP.UINT8, zp=128, scale=0.05, readers=2, other_scale=None) -> onnx.ModelProto:
    """x -> Relu -> Q -> DQ (readers of them, each into an Add with x) -> Sum"""
    s = onnx.numpy_helper.from_array(np.array(scale, np.float32), "s")
    s2 = onnx.numpy_helper.from_array(np.array(other_scale or scale, np.float32), "s2")
    z = onnx.helper.make_tensor("z", zp_type, [], [zp])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"])]
    outs = []
    for i in range(readers):
        nodes.append(helper.make_node("DequantizeLinear", ["q", "s2" if i else "s", "z"], [f"d{i}"]))
        nodes.append(helper.make_node("Add", [f"d{i}", "x"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TP.FLOAT, None))
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", "m"])], outs,
                          initializer=[s, s2, z])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=8)


def _feeds(rng, n, m, scale):
    x = rng.uniform(-3, 15, (n, m)).astype(np.float32)
    x[0, : m // 2] = (rng.integers(0, 300, m // 2) + 0.5).astype(np.float32) * np.float32(scale)  # ties, overflow
    x[-1, -1] = np.inf
    return {"x": x}


def _fake_quants(sess) -> int:
    return sum(n.op_type == "FakeQuant" for n in sess.program.fused.nodes)


@pytest.mark.parametrize("zp_type,zp", [(TP.UINT8, 128), (TP.UINT8, 0), (TP.INT8, -5), (TP.INT16, 100)])
def test_fused_pairs_equal_the_nodes_bit_for_bit(zp_type, zp):
    m = _model(zp_type, zp)
    fused = dynashape.InferenceSession(m, device=DEVICE)
    plain = dynashape.InferenceSession(m, device=DEVICE, executor="interpreter")  # the graph as written
    assert _fake_quants(fused) == 1
    import onnxruntime as ort
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for n, k in [(3, 8), (1, 33), (5, 2), (3, 8)]:
        f = _feeds(rng, n, k, 0.05)
        got, want, orig = fused.run(None, f), plain.run(None, f), ref.run(None, f)
        for g, w, o in zip(got, want, orig):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, o)


def test_pairs_with_other_params_stay():
    # one DQ with another scale: the pair is not one FakeQuant
    sess = dynashape.InferenceSession(_model(other_scale=0.1), device=DEVICE)
    assert _fake_quants(sess) == 0
    x = _feeds(np.random.default_rng(1), 2, 6, 0.05)
    plain = dynashape.InferenceSession(_model(other_scale=0.1), device=DEVICE, executor="interpreter")
    for g, w in zip(sess.run(None, x), plain.run(None, x)):
        np.testing.assert_array_equal(g, w)

"""Squeeze-and-excitation blocks fused into one op (compile/fuse_squeeze_excite.py,
ops/squeeze_excite.py): the forms exporters write (PaddlePaddle's hard sigmoid 0.2/0.5 as its own
node, MobileNetV3's 1/6 fused into the convolution, EfficientNet's sigmoid), with and without
biases, over changing batches and image sizes against onnxruntime; the C kernel and the torch
path it falls back to both counted; a block whose product is by another tensor left alone."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import native

from .harness import DEVICE


def _model(gate: str, bias: bool = True, other_x: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    c, cr = 24, 8
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32) / 5, "w0"),
             onnx.numpy_helper.from_array(rng.standard_normal((cr, c, 1, 1)).astype(np.float32) / 3, "w1"),
             onnx.numpy_helper.from_array(rng.standard_normal((c, cr, 1, 1)).astype(np.float32) / 2, "w2"),
             onnx.numpy_helper.from_array(rng.standard_normal(cr).astype(np.float32), "b1"),
             onnx.numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b2")]
    b1, b2 = (["b1"], ["b2"]) if bias else ([], [])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["f"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["f"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Conv", ["p", "w1", *b1], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Conv", ["hr", "w2", *b2], ["s"])]
    if gate == "paddle":
        nodes.append(helper.make_node("HardSigmoid", ["s"], ["g"], alpha=0.2, beta=0.5))
    elif gate == "mobilenetv3":
        nodes.append(helper.make_node("HardSigmoid", ["s"], ["g"], alpha=1.0 / 6, beta=0.5))
    else:
        nodes.append(helper.make_node("Sigmoid", ["s"], ["g"]))
    nodes.append(helper.make_node("Mul", ["f" if other_x else "r", "g"], ["y"]))
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _check(model, sess):
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for n, h, w in ((1, 8, 8), (3, 5, 17), (2, 1, 1), (5, 12, 7), (1, 8, 8)):
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def _fused(sess) -> int:
    return sum(n.op_type == "SqueezeExcite" for n in sess.compiled.graph.nodes)


@pytest.mark.parametrize("gate", ["paddle", "mobilenetv3", "sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_each_exporters_block_is_one_op_and_matches_onnxruntime(gate, bias):
    model = _model(gate, bias)
    sess = dynashape.InferenceSession(model.SerializeToString(), device=DEVICE)
    if DEVICE == "cpu":
        assert _fused(sess) == 1
    before = native.counters().get("squeeze_excite", 0)
    _check(model, sess)
    if DEVICE == "cpu" and not native.why("squeeze_excite"):
        assert native.counters().get("squeeze_excite", 0) - before == 5  # the C kernel, every call


def test_without_the_c_kernel_the_torch_path_serves_and_is_counted(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    model = _model("paddle")
    sess = dynashape.InferenceSession(model.SerializeToString())
    before = native.counters().get("squeeze_excite_torch_fallbacks", 0)
    _check(model, sess)
    assert native.counters().get("squeeze_excite_torch_fallbacks", 0) - before == 5


def test_a_product_by_another_tensor_is_not_a_block():
    model = _model("paddle", other_x=True)
    sess = dynashape.InferenceSession(model.SerializeToString())
    assert _fused(sess) == 0
    _check(model, sess)

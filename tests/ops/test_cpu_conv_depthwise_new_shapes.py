"""Depthwise convolutions at an input shape new to them run in C (ops/csrc/depthwise.c), with no
oneDNN primitive built; oneDNN serves the shape when it comes back. Kernel sizes, strides,
paddings and the activations the C pass applies, over changing batches and sizes, against
onnxruntime; the C calls counted."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import cpu_conv_dense, native
from dynashape.ops.cpu_conv import NEW_SHAPE_DEPTHWISE


def _model(c, k, stride, pad, act):
    rng = np.random.default_rng(k * 10 + stride)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((c, 3, 1, 1)).astype(np.float32), "w0"),
             onnx.numpy_helper.from_array(rng.standard_normal((c, 1, k, k)).astype(np.float32) / k, "w1"),
             onnx.numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w1", "b1"], ["d"], group=c, kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[pad] * 4)]
    out = "d"
    if act != "none":
        nodes.append(helper.make_node({"relu": "Relu", "hardswish": "HardSwish"}[act], ["d"], ["y"]))
        out = "y"
    g = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info(out, TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("c,k,stride,pad,act", [(16, 3, 1, 1, "relu"), (24, 5, 2, 2, "hardswish"),
                                                (19, 3, 2, 0, "none"), (32, 3, 1, 1, "hardswish")])
def test_new_shapes_in_c_and_repeats_in_onednn_match_onnxruntime(c, k, stride, pad, act, monkeypatch):
    # the path where the vector tile (cpu_conv_dense.DepthwiseConv, test_depthwise_tile_... below) is
    # not there to take these first
    monkeypatch.setattr(cpu_conv_dense, "ACTS", {})
    model = _model(c, k, stride, pad, act)
    sess = dynashape.InferenceSession(model.SerializeToString())
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    before = native.counters().get(NEW_SHAPE_DEPTHWISE, 0)
    shapes = [(1, 12, 12), (2, 9, 17), (1, 12, 12), (3, 5, 6), (2, 9, 17), (1, 40, 24)]
    for n, h, w in shapes:
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    if not native.why("depthwise"):
        assert native.counters().get(NEW_SHAPE_DEPTHWISE, 0) - before == 4  # the four new shapes, not the repeats


@pytest.mark.parametrize("c,k,stride,pad,act", [(16, 3, 1, 1, "relu"), (24, 5, 2, 2, "hardswish"),
                                                (19, 3, 2, 0, "none"), (40, 3, 1, 1, "hardswish")])
def test_depthwise_tile_at_new_and_repeated_shapes_matches_onnxruntime(c, k, stride, pad, act):
    """The vector tile (csrc/conv_nhwc.c ``dw_nhwc_run``: 16 channels a vector, channel counts that are
    not whole blocks widened in its copy) serves new shapes, and small repeated ones on AVX-512."""
    model = _model(c, k, stride, pad, act)
    sess = dynashape.InferenceSession(model.SerializeToString())
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    before = native.counters().get(cpu_conv_dense.DEPTHWISE_COUNTER, 0)
    shapes = [(1, 12, 12), (2, 9, 17), (1, 12, 12), (3, 5, 6), (2, 9, 17), (1, 40, 24)]
    for n, h, w in shapes:
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    if native.library("conv_nhwc") is not None:
        calls = native.counters().get(cpu_conv_dense.DEPTHWISE_COUNTER, 0) - before
        assert calls == (len(shapes) if cpu_conv_dense.everywhere() else 4)  # (all below DEPTHWISE_TILE_MACS)

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


def test_a_large_new_shape_goes_to_the_plain_loop_and_small_ones_to_the_tile(monkeypatch):
    """Above DEPTHWISE_NEW_SHAPE_MACS a new shape is the plain C loop's (csrc/depthwise.c: no copy of
    the image), below it the tile's, a repeat oneDNN's; all match onnxruntime. The bounds are lowered
    here so that small inputs cross them."""
    from dynashape.ops import cpu_conv
    model = _model(16, 3, 1, 1, "relu")
    sess = dynashape.InferenceSession(model.SerializeToString())
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    monkeypatch.setattr(cpu_conv, "DEPTHWISE_TILE_MACS", 0)  # not the tile for its small size alone
    monkeypatch.setattr(cpu_conv, "DEPTHWISE_NEW_SHAPE_MACS", 16 * 9 * 10 * 10 + 1)  # a 10x10 image, not more
    rng = np.random.default_rng(5)
    # (size, tile calls, plain-loop calls): new and small, new and large, the large again (oneDNN's)
    for (h, w), tile, plain in (((10, 10), 1, 0), ((12, 12), 0, 1), ((12, 12), 0, 0), ((9, 11), 1, 0)):
        before = dict(native.counters())
        x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
        if native.library("conv_nhwc") is not None and native.library("depthwise") is not None:
            now = native.counters()
            got = (now.get(cpu_conv_dense.DEPTHWISE_COUNTER, 0) - before.get(cpu_conv_dense.DEPTHWISE_COUNTER, 0),
                   now.get(NEW_SHAPE_DEPTHWISE, 0) - before.get(NEW_SHAPE_DEPTHWISE, 0))
            assert got == (tile, plain), (h, w)

"""Softmax on the CPU gives onnxruntime's bits where onnxruntime runs MLAS's AVX-512F kernels
(csrc/elementwise.c softmax_f32).

A dynamically quantized model with attention quantizes the probabilities next (text2tashkeel's
BiLSTM + attention: a softmax a few ulps off moved its outputs by 0.009 at batch 4, now 0). Checked
bit for bit against onnxruntime's Softmax over changing shapes with fresh random inputs, every axis
(onnxruntime moves a non-last axis to the end), the opset-11 2-D coercion, masked rows (-inf and a
large negative mask value), in both executors. Other CPUs run other MLAS kernels (another order of
the sum): there torch's softmax serves and this test has nothing to compare.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import native

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    "avx512f" not in native.cpuinfo("flags").split() or native.library("elementwise") is None,
    reason="onnxruntime's Softmax bits are followed on AVX-512F CPUs only (and need the native build)")


def _model(axis, opset):
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["a", "b", "c"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


def _ort(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


SHAPES = [(2, 3, 5), (4, 17, 64), (1, 8, 333), (3, 1, 1), (2, 50, 48), (2, 7, 1000), (1, 2, 47)]


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
@pytest.mark.parametrize("axis,opset", [(-1, 13), (1, 13), (0, 13), (1, 11), (2, 11)])
def test_softmax_equals_onnxruntime_bit_for_bit(axis, opset, executor):
    model = _model(axis, opset)
    sess, ref = dynashape.InferenceSession(model, executor=executor), _ort(model)
    rng = np.random.default_rng(abs(axis) * 10 + opset)
    before = native.counters().get("ort_softmax_native_calls", 0)
    for i, shp in enumerate(SHAPES):
        x = (rng.standard_normal(shp) * rng.uniform(0.1, 30)).astype(np.float32)
        if i % 3 == 1:  # attention masks: -inf and a large negative value on some positions
            x[..., : shp[-1] // 2] = -np.inf if i % 2 else np.float32(-3.4e38)
            x[..., -1] = 1.0  # no row entirely masked
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                      err_msg=f"x {shp}")
    assert native.counters()["ort_softmax_native_calls"] >= before + len(SHAPES)


def test_rows_with_nan_or_inf_are_nan_as_onnxruntimes():
    # a NaN or +inf makes that element's exp NaN in MLAS, so the sum and the whole row; a row of
    # only -inf too; the other rows keep their bits
    model = _model(-1, 13)
    sess, ref = dynashape.InferenceSession(model), _ort(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 40)).astype(np.float32)
    x[0, 0, 3], x[0, 1, 7], x[1, 2, :] = np.nan, np.inf, -np.inf
    x[1, 0, :20] = -np.inf
    got, want = sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
    assert np.isnan(want[0, 0]).all() and np.isnan(want[0, 1]).all() and np.isnan(want[1, 2]).all()
    np.testing.assert_array_equal(got, want)

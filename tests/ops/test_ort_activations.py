"""Sigmoid, Tanh and SiLU on the CPU give onnxruntime's bits (ops/ort_math.py, csrc/ort_math.h).

A quantized model rounds what they produce: a SiLU feeding DynamicQuantizeLinear sets a scale from
its largest value, and one ulp there moved a captcha OCR model's logits by 0.1-0.26 (issue 35). So
the comparisons here are bit for bit, against onnxruntime's own ops on fresh random inputs of
changing shapes, in both executors with fusion on and off (fuse_activations turns Sigmoid + Mul
into one Silu), through the C kernel and through the torch formula that serves without it, and
for the convolution epilogues oneDNN would otherwise compute with its own sigmoid.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import cpu_conv, native, ort_math

ort = pytest.importorskip("onnxruntime")

# MLAS's logistic / tanh use fused multiply-adds on x86 CPUs with FMA3 (and on ARM); an x86 CPU
# without FMA runs its SSE kernels, which round each product: ort_math follows the former
MLAS_FMA = platform.machine().lower() not in ("x86_64", "amd64") or "fma" in native.cpuinfo("flags").split()
pytestmark = pytest.mark.skipif(not MLAS_FMA, reason="onnxruntime runs its SSE logistic / tanh here (no FMA)")

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 18.0, -18.0, 18.5, -18.5, 9.0, -9.0, 9.5, -9.5, 1e-30, -1e-30,
                    1e30, -1e30, 0.5, -0.5], np.float32)


def _model(nodes, outputs):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "C", "T"])],
                          [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _ort(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


# Sigmoid, Tanh, SiLU written as Sigmoid * x (one Silu when fused), and Tanh of a SiLU
MODEL = _model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Tanh", ["x"], ["t"]),
                helper.make_node("Sigmoid", ["x"], ["s2"]), helper.make_node("Mul", ["x", "s2"], ["silu"]),
                helper.make_node("Tanh", ["silu"], ["ts"])], ["s", "t", "silu", "ts"])
SHAPES = [(1, 3, 5), (4, 16, 300), (2, 1, 7), (1, 64, 1024), (3, 5, 2), (4, 16, 300)]


def _feeds(rng):
    for i, shp in enumerate(SHAPES):
        x = (rng.standard_normal(shp) * rng.uniform(0.1, 12)).astype(np.float32)
        if i % 2:  # the clamps, NaN, infinities and signed zeros among ordinary values
            x.flat[:SPECIAL.size] = SPECIAL[: x.size]
        yield {"x": x}


@pytest.mark.parametrize("native_on", [True, False], ids=["C", "torch-formula"])
@pytest.mark.parametrize("executor,fusion", [("compiled", True), ("compiled", False), ("interpreter", True),
                                             ("interpreter", False)])
def test_activations_equal_onnxruntime_bit_for_bit(monkeypatch, executor, fusion, native_on):
    if not native_on:
        monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    elif native.library("elementwise") is None:
        pytest.skip(f"no native build: {native.why('elementwise')}")
    sess, ref = dynashape.InferenceSession(MODEL, executor=executor, fusion=fusion), _ort(MODEL)
    before = dict(native.counters())
    for f in _feeds(np.random.default_rng(0)):
        for got, want, name in zip(sess.run(None, f), ref.run(None, f), ("sigmoid", "tanh", "silu", "tanh(silu)")):
            np.testing.assert_array_equal(got, want, err_msg=f"{name} at {f['x'].shape}")
    after = native.counters()
    key = "ort_sigmoid_native_calls" if native_on else "ort_sigmoid_torch_fallbacks"
    if not (fusion and executor == "compiled" and native_on):  # (a fused Silu counts as silu)
        assert after.get(key, 0) > before.get(key, 0), (key, after)


def test_functions_on_layouts_and_outputs():
    # every layout and out= form gives the contiguous call's bits, and keeps channels-last
    x = torch.randn(2, 8, 5, 6) * 6
    for fn, ref in ((ort_math.sigmoid, ort_math.logistic_reference), (ort_math.tanh, ort_math.tanh_reference)):
        want = ref(x)
        assert torch.equal(fn(x), want)
        cl = x.contiguous(memory_format=torch.channels_last)
        y = fn(cl)
        assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y, want)
        assert torch.equal(fn(x.transpose(1, 3)), ref(x.transpose(1, 3)))
        out = torch.empty_like(x)
        assert fn(x, out=out) is out and torch.equal(out, want)
        strided = torch.empty(2, 8, 5, 12)[..., ::2]
        fn(x, out=strided)
        assert torch.equal(strided, want)
    xs = torch.from_numpy(SPECIAL)
    assert torch.equal(ort_math.silu(xs).nan_to_num(7.0), (xs * ort_math.logistic_reference(xs)).nan_to_num(7.0))


@pytest.mark.skipif(not cpu_conv.onednn_fuses(), reason="torch has no oneDNN convolution with a post-op")
@pytest.mark.parametrize("activation", sorted(cpu_conv.ORT_ACTIVATIONS))
def test_conv_epilogue_is_the_unfused_activation(activation):
    # oneDNN's own sigmoid / tanh are not onnxruntime's: the convolution runs without its post-op
    # and ort_math's function follows, the bits of the unfused pair
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(6, 4, 3, 3, generator=g), torch.randn(6, generator=g)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [1, 1], [1, 1], 1, activation, [], "")
    for shp in [(1, 4, 9, 7), (2, 4, 16, 16), (1, 4, 3, 30)]:
        x = (torch.randn(*shp, generator=g) * 3).contiguous(memory_format=torch.channels_last)
        plain = cpu_conv.conv2d_act(x, w, b, [1, 1], [1, 1], [1, 1], 1, "none", [], "")
        want = cpu_conv.ACTIVATIONS[activation](plain, [], "")
        assert torch.equal(cpu_conv.conv2d_act(x, w, b, [1, 1], [1, 1], [1, 1], 1, activation, [], ""), want)
        if kernel is not None:
            assert torch.equal(kernel(x, w, b), want)


@pytest.mark.parametrize("alpha", [1.702, 1.0, -0.7])
def test_quick_gelu_equals_onnxruntime(alpha):
    # com.microsoft QuickGelu: onnxruntime takes MLAS's logistic of alpha * x, then the product
    g = helper.make_graph([helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=alpha)], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "C", "T"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8).SerializeToString()
    sess, ref = dynashape.InferenceSession(model), _ort(model)
    for f in _feeds(np.random.default_rng(4)):
        np.testing.assert_array_equal(sess.run(None, f)[0], ref.run(None, f)[0], err_msg=f"at {f['x'].shape}")

"""quantize_dynamic'd LSTMs against onnxruntime bit for bit (issue 35, "DynamicQuantizeLSTM differs
from onnxruntime on this CPU").

Two models of the reported kinds, exported with torch.onnx and quantized with
onnxruntime.quantization.quantize_dynamic (int8 weights over their whole range): a BiLSTM tagger
(a diacritiser's shape) and a 3-layer LSTM with initial states as inputs (a speaker embedder's).
Each over changing sequence lengths and batches with fresh random inputs, in both executors, fusion
on and off, the C recurrence and the torch one.

What "onnxruntime's bits" takes: its integer products (exact with VNNI, pair sums saturated to
int16 on AVX2 without it: the product follows ``set_u8s8_saturation("auto")``, which asks this
CPU's onnxruntime), DynamicQuantizeLinear's formula for every step's h, and its gates' sigmoid and
tanh (MLAS's own: ops/ort_math.py; torch's, a few ulps off, moved a quantized h by a step and the
outputs by 1e-4 to 1e-3 after tens of steps). onnxruntime runs on one intra-op thread: with more, it
splits the batch of a recurrent step across threads and quantizes each slice with its own scale, so
that its results then depend on its thread count (contrib_rnn.py's docstring).
"""

from __future__ import annotations

import contextlib
import platform

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.ops import linalg, native

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

# MLAS's logistic / tanh use fused multiply-adds on x86 CPUs with FMA3 (and on ARM); an x86 CPU
# without FMA runs its SSE kernels, which round each product: ort_math follows the former
MLAS_FMA = platform.machine().lower() not in ("x86_64", "amd64") or "fma" in native.cpuinfo("flags").split()


def _ort(path_or_model, threads=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    data = path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto) else str(path_or_model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def _saturation(setting):
    prev = linalg.set_u8s8_saturation(setting)
    try:
        yield
    finally:
        linalg.set_u8s8_saturation(prev)


class BiTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(60, 32)
        self.lstm = torch.nn.LSTM(32, 48, batch_first=True, bidirectional=True)
        self.out = torch.nn.Linear(96, 15)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        return self.out(y)


class Deep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(40, 64, num_layers=3, batch_first=True)
        self.proj = torch.nn.Linear(64, 16)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        return self.proj(y[:, -1]), h, c  # (the embedder's L2 norm after it is float arithmetic alone)


def _export(module, args, names, outs, axes, path):
    torch.onnx.export(module.eval(), args, str(path), input_names=names, output_names=outs, dynamic_axes=axes,
                      opset_version=17, dynamo=False)


@pytest.fixture(scope="session")
def lstm_models(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("qlstm")
    _export(BiTagger(), (torch.randint(0, 60, (2, 7)),), ["ids"], ["logits"], {"ids": {0: "n", 1: "t"}},
            d / "bilstm.onnx")
    _export(Deep(), (torch.randn(2, 7, 40), torch.zeros(3, 2, 64), torch.zeros(3, 2, 64)), ["x", "h0", "c0"],
            ["emb", "h", "c"], {"x": {0: "n", 1: "t"}, "h0": {1: "n"}, "c0": {1: "n"}}, d / "deep.onnx")
    paths = {}
    for name in ("bilstm", "deep"):
        q = d / f"{name}.int8.onnx"
        quantization.quantize_dynamic(str(d / f"{name}.onnx"), str(q), weight_type=quantization.QuantType.QInt8)
        ops = [n.op_type for n in onnx.load(str(q)).graph.node]
        assert ops.count("DynamicQuantizeLSTM") == (1 if name == "bilstm" else 3), ops
        paths[name] = q
    return paths


def _feeds(name, rng):
    shapes = [(1, 24), (4, 24), (1, 80), (8, 40), (2, 1), (3, 57), (1, 24)]
    for n, t in shapes:
        if name == "bilstm":
            yield {"ids": rng.integers(0, 60, (n, t)).astype(np.int64)}
        else:
            yield {"x": rng.uniform(-4, 1, (n, t, 40)).astype(np.float32),
                   "h0": (0.1 * rng.standard_normal((3, n, 64))).astype(np.float32),
                   "c0": (0.1 * rng.standard_normal((3, n, 64))).astype(np.float32)}


@pytest.mark.skipif(not MLAS_FMA, reason="onnxruntime runs its SSE logistic / tanh here (no FMA)")
@pytest.mark.parametrize("native_on", [True, False], ids=["C", "torch"])
@pytest.mark.parametrize("executor,fusion", [("compiled", True), ("compiled", False), ("interpreter", True),
                                             ("interpreter", False)])
@pytest.mark.parametrize("name", ["bilstm", "deep"])
def test_quantize_dynamic_lstm_bit_exact(monkeypatch, lstm_models, name, executor, fusion, native_on):
    if not native_on:
        monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    ref = _ort(lstm_models[name])
    with _saturation("auto"):
        sess = dynashape.InferenceSession(str(lstm_models[name]), executor=executor, fusion=fusion)
        outs = [o.name for o in sess.get_outputs()]
        for f in _feeds(name, np.random.default_rng(1)):
            got, want = sess.run(None, f), ref.run(None, f)
            assert len(got) == len(want) == len(outs)
            for g, w, o in zip(got, want, outs):
                assert g.shape == w.shape, o
                np.testing.assert_array_equal(g, w, err_msg=f"{name} {o} at {[v.shape for v in f.values()]}")


def _mmi(k):
    b = numpy_helper.from_array(np.full((k, 1), 127, np.int8), "b")
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TP.UINT8, ["m", k])],
                          [helper.make_tensor_value_info("y", TP.INT32, None)], [b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_products_exact_and_auto_follows_this_cpus_onnxruntime():
    # 255 x 127 over 64 products: 2072640 in integer arithmetic; onnxruntime on AVX2 without VNNI
    # saturates each pair's 64770 to 32767 (1048544). dynashape's default is the exact sum on every
    # CPU; "auto" gives what this CPU's onnxruntime gives, whichever it is
    model = _mmi(64)
    a = np.full((3, 64), 255, np.uint8)
    ort_y = _ort(model).run(None, {"a": a})[0]
    saturates = linalg.onnxruntime_saturates()
    assert saturates is (int(ort_y[0, 0]) != 2072640)
    assert int(ort_y[0, 0]) == (32 * 32767 if saturates else 2072640)
    with _saturation(False):
        np.testing.assert_array_equal(dynashape.InferenceSession(model).run(None, {"a": a})[0], 2072640)
    with _saturation("auto"):
        assert linalg.u8s8_saturation() is saturates
        np.testing.assert_array_equal(dynashape.InferenceSession(model).run(None, {"a": a})[0], ort_y)
    # random full-range operands: the exact integer product, and onnxruntime's where it is exact
    rng = np.random.default_rng(2)
    w = rng.integers(-127, 128, (300, 24)).astype(np.int8)
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w", "za"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TP.UINT8, ["m", 300]),
                           helper.make_tensor_value_info("za", TP.UINT8, [])],
                          [helper.make_tensor_value_info("y", TP.INT32, None)], [numpy_helper.from_array(w, "w")])
    m2 = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess, ref = dynashape.InferenceSession(m2), _ort(m2)
    for m in (1, 5, 64, 2):
        a = rng.integers(0, 256, (m, 300)).astype(np.uint8)
        a[0, :] = 255
        za = np.array(rng.integers(0, 256), np.uint8)
        exact = (a.astype(np.int64) - int(za)) @ w.astype(np.int64)
        got = sess.run(None, {"a": a, "za": za})[0]
        np.testing.assert_array_equal(got, exact)
        if not saturates:
            np.testing.assert_array_equal(ref.run(None, {"a": a, "za": za})[0], exact)

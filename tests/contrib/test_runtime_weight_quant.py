"""Models that quantize at run time, against onnxruntime bit for bit (issue 35, "one ulp flips a
quantized model").

ddddocr's captcha model (an early quantize_dynamic output) multiplies DynamicQuantizeLinear's
scale into each weight scale, divides a float tensor by that product, floors it and casts it to an
integer that ConvInteger's result is added to; its activations are SiLUs (Sigmoid * x) that the
next DynamicQuantizeLinear reads. A Sigmoid one ulp away from onnxruntime's moved that scale by one
ulp, a quantized value to the next integer, and the logits by 0.1-0.26. Every value a rounding step
reads must therefore have onnxruntime's bits: the scales, their product, the division, the floor,
and the activations before them, whatever fusion, folding or kernel computes them.

Two models: one written with onnx.helper in that pattern (a bias and a weight quantized at run
time by the activation's scale times a constant weight scale: Div, Floor / Round, Clip, Cast,
ConvInteger, then the float finish), checked with its intermediate values as outputs too; and a
small CNN + BiLSTM exported with torch.onnx and quantized by onnxruntime.quantization.quantize_dynamic
(ConvInteger, MatMulInteger, DynamicQuantizeLSTM). Each over a sequence of changing shapes with fresh
random inputs, in both executors, fusion on and off. onnxruntime runs on one intra-op thread: with
more, its DynamicQuantizeLSTM quantizes batch slices on their own (ops/contrib_rnn.py).
"""

from __future__ import annotations

import platform

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.ops import linalg, native

ort = pytest.importorskip("onnxruntime")

# MLAS's logistic / tanh use fused multiply-adds on x86 CPUs with FMA3 (and on ARM); an x86 CPU
# without FMA runs its SSE kernels, which round each product: ort_math follows the former
MLAS_FMA = platform.machine().lower() not in ("x86_64", "amd64") or "fma" in native.cpuinfo("flags").split()
pytestmark = pytest.mark.skipif(not MLAS_FMA, reason="onnxruntime runs its SSE logistic / tanh here (no FMA)")

# onnxruntime's uint8 x int8 products saturate pair sums on x86 CPUs without VNNI, in ConvInteger
# too (which dynashape does not emulate): there the weights keep to 7 bits (|w| <= 64, what
# onnxruntime's reduce_range gives), with which its products are exact on every CPU; where they
# are exact anyway (VNNI, as this project's machines), the full int8 range
SATURATES = bool(linalg.onnxruntime_saturates())
WMAX = 64 if SATURATES else 127

MODES = [pytest.param(e, f, id=f"{e}-{'fused' if f else 'plain'}") for e in ("compiled", "interpreter")
         for f in (True, False)]


def _ort(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


# ---- the pattern, written out ---------------------------------------------------------------------
C0, C1, C2 = 2, 8, 12
INTERMEDIATE = [("x_scale", TP.FLOAT), ("s1", TP.FLOAT), ("bias_q", TP.INT32), ("acc1", TP.INT32), ("a1", TP.FLOAT),
                ("a1_scale", TP.FLOAT), ("a1_zp", TP.UINT8), ("s2", TP.FLOAT), ("w2_div", TP.FLOAT), ("w2_q", TP.INT8),
                ("acc2", TP.INT32)]


def _pattern_model(rng, rounding: str, expose: bool) -> onnx.ModelProto:
    w1 = rng.integers(-WMAX, WMAX + 1, (C1, C0, 3, 3)).astype(np.int8)
    ws1 = np.array(rng.uniform(0.002, 0.02), np.float32)
    bias1 = (rng.standard_normal(C1) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((C2, C1, 3, 3)) * 0.05).astype(np.float32)  # a float weight, quantized at run time
    ws2 = rng.uniform(0.5, 2.0, (C2, 1, 1, 1)).astype(np.float32)  # per output channel
    bias2 = rng.standard_normal((1, C2, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(v, k) for k, v in (
        ("w1", w1), ("w1_zp", np.array(0, np.int8)), ("ws1", ws1), ("bias1", bias1),
        ("shape1", np.array([1, C1, 1, 1], np.int64)), ("w2", w2), ("ws2", ws2), ("w2_zp", np.array(0, np.int8)),
        ("bias2", bias2), ("lo", np.array(-WMAX, np.float32)), ("hi", np.array(WMAX, np.float32)))]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
        helper.make_node("Mul", ["x_scale", "ws1"], ["s1"]),
        # the bias quantized by the product, as ddddocr's model does: Div, Floor, Cast, Add in int32
        helper.make_node("Div", ["bias1", "s1"], ["bias_div"]),
        helper.make_node("Floor", ["bias_div"], ["bias_floor"]),
        helper.make_node("Cast", ["bias_floor"], ["bias_q"], to=TP.INT32),
        helper.make_node("Reshape", ["bias_q", "shape1"], ["bias_q4"]),
        helper.make_node("ConvInteger", ["x_q", "w1", "x_zp", "w1_zp"], ["acc0"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["acc0", "bias_q4"], ["acc1"]),
        helper.make_node("Cast", ["acc1"], ["acc1_f"], to=TP.FLOAT),
        helper.make_node("Mul", ["acc1_f", "s1"], ["z1"]),
        helper.make_node("Sigmoid", ["z1"], ["sig1"]),
        helper.make_node("Mul", ["z1", "sig1"], ["a1"]),  # SiLU, read by the next quantization
        helper.make_node("DynamicQuantizeLinear", ["a1"], ["a1_q", "a1_scale", "a1_zp"]),
        helper.make_node("Mul", ["a1_scale", "ws2"], ["s2"]),
        # a weight quantized at run time: Div by the product, Floor or Round, Clip, Cast to int8
        helper.make_node("Div", ["w2", "s2"], ["w2_div"]),
        helper.make_node(rounding, ["w2_div"], ["w2_r"]),
        helper.make_node("Clip", ["w2_r", "lo", "hi"], ["w2_c"]),
        helper.make_node("Cast", ["w2_c"], ["w2_q"], to=TP.INT8),
        helper.make_node("ConvInteger", ["a1_q", "w2_q", "a1_zp", "w2_zp"], ["acc2"], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["acc2"], ["acc2_f"], to=TP.FLOAT),
        helper.make_node("Reshape", ["s2", "shape2"], ["s2_4"]),
        helper.make_node("Mul", ["acc2_f", "s2_4"], ["z2"]),
        helper.make_node("Add", ["z2", "bias2"], ["z2b"]),
        helper.make_node("Sigmoid", ["z2b"], ["sig2"]),
        helper.make_node("Mul", ["z2b", "sig2"], ["y"]),
    ]
    inits.append(numpy_helper.from_array(np.array([1, C2, 1, 1], np.int64), "shape2"))
    outs = [helper.make_tensor_value_info("y", TP.FLOAT, None)]
    if expose:
        outs += [helper.make_tensor_value_info(n, t, None) for n, t in INTERMEDIATE]
    g = helper.make_graph(nodes, "runtime_quant", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", C0, "h", "w"])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _pattern_feeds(rng):
    for n, h, w in [(1, 8, 8), (2, 16, 12), (1, 5, 31), (3, 9, 9), (1, 8, 8), (2, 32, 20)]:
        yield {"x": (rng.standard_normal((n, C0, h, w)) * rng.uniform(0.3, 3)).astype(np.float32)}


@pytest.mark.parametrize("rounding", ["Floor", "Round"])
@pytest.mark.parametrize("expose", [False, True], ids=["output-only", "intermediates"])
@pytest.mark.parametrize("executor,fusion", MODES)
def test_runtime_quantization_pattern_bit_exact(executor, fusion, expose, rounding):
    rng = np.random.default_rng(35)
    model = _pattern_model(rng, rounding, expose)
    sess, ref = dynashape.InferenceSession(model, executor=executor, fusion=fusion), _ort(model)
    names = [o.name for o in model.graph.output]
    moved = 0
    for f in _pattern_feeds(rng):
        got, want = sess.run(None, f), ref.run(None, f)
        assert len(got) == len(want) == len(names)
        for g, w, name in zip(got, want, names):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=f"{name} at x {f['x'].shape}")
        moved += int(np.any(want[0] != 0))
    assert moved  # the outputs carry values, not all zeros


# ---- quantize_dynamic of a CNN + BiLSTM exported by torch ---------------------------------------
@pytest.fixture(scope="session")
def cnn_lstm_int8(tmp_path_factory):
    torch = pytest.importorskip("torch")
    quantization = pytest.importorskip("onnxruntime.quantization")
    F = torch.nn.functional

    class Net(torch.nn.Module):  # ddddocr's shape: convolutions with SiLU, columns as a sequence, BiLSTM
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1, stride=(2, 1))
            self.lstm = torch.nn.LSTM(16 * 8, 32, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(64, 11)

        def forward(self, x):
            y = F.silu(self.c2(F.silu(self.c1(x))))
            n, c, h, w = y.shape
            y, _ = self.lstm(y.permute(0, 3, 1, 2).reshape(n, w, c * h))
            return self.fc(y)

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("cnn_lstm")
    fp, q = d / "cnn_lstm.onnx", d / "cnn_lstm.int8.onnx"
    torch.onnx.export(Net().eval(), (torch.randn(1, 1, 16, 20),), str(fp), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n", 3: "w"}}, opset_version=13, dynamo=False)
    quantization.quantize_dynamic(str(fp), str(q), weight_type=quantization.QuantType.QInt8,
                                  op_types_to_quantize=["Conv", "MatMul", "Gemm", "LSTM"], reduce_range=SATURATES)
    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert {"ConvInteger", "DynamicQuantizeLinear", "DynamicQuantizeLSTM", "MatMulInteger", "Sigmoid"} <= ops, ops
    return q


@pytest.mark.parametrize("executor,fusion", MODES)
def test_quantize_dynamic_cnn_lstm_bit_exact(cnn_lstm_int8, executor, fusion):
    sess, ref = dynashape.InferenceSession(str(cnn_lstm_int8), executor=executor, fusion=fusion), _ort(cnn_lstm_int8)
    rng = np.random.default_rng(7)
    for n, w in [(1, 20), (3, 33), (2, 7), (1, 64), (4, 20), (1, 1), (3, 33)]:
        x = rng.uniform(-1, 1, (n, 1, 16, w)).astype(np.float32)  # pixels normalised to [-1, 1], as ddddocr's
        (got,), (want,) = sess.run(None, {"x": x}), ref.run(None, {"x": x})
        assert got.shape == want.shape == (n, w, 11)
        np.testing.assert_array_equal(got, want, err_msg=f"x {x.shape}")

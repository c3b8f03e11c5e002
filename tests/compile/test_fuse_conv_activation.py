"""``fuse_conv_activation`` (compile/fuse_conv_activation.py, ops/conv_act.py ``ConvAct``): on the CPU a
2-D float Conv and the activation that alone reads it run as oneDNN's convolution with the
activation as a post-op. Every activation taken (ONNX's and fuse_activations' fused ones), strided,
grouped and unpadded convolutions, asymmetric pads (the op's own path rather than the bound
kernel), the Identity that Paddle2ONNX writes between them (skip_identities); near misses stay.
Each model runs over changing shapes with fresh random inputs in the fused compiled session, the
interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from dynashape.compile import pipeline
from dynashape.ops.cpu_conv import onednn_fuses
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn

pytestmark = pytest.mark.skipif(not onednn_fuses(), reason="torch without oneDNN's fused convolution")

C = 4
SHAPES = [(1, 7, 7), (3, 5, 9), (2, 8, 6), (1, 7, 7)]


def _feeds(seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, n, C, h, w) * 2} for n, h, w in SHAPES]


def _act(b: Builder, kind: str, y: str, opset: int) -> str:
    if kind in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        return b.op(kind, y)
    if kind == "LeakyRelu":
        return b.op("LeakyRelu", y, alpha=0.2)
    if kind == "HardSigmoid":  # MobileNetV3's 1/6, 1/2
        return b.op("HardSigmoid", y, alpha=float(np.float32(1 / 6)), beta=0.5)
    if kind == "Clip":  # ReLU6
        return b.op("Clip", y, b.const(0.0), b.const(6.0)) if opset >= 11 else b.op("Clip", y, min=0.0, max=6.0)
    if kind == "SiLU":
        return b.op("Mul", y, b.op("Sigmoid", y))
    if kind == "GELU":
        e = b.op("Erf", b.op("Div", y, b.const(np.sqrt(2.0))))
        return b.op("Mul", b.op("Mul", y, b.op("Add", e, b.const(1.0))), b.const(0.5))
    if kind == "GELU tanh":
        return b.op("Gelu", y, approximate="tanh")
    raise AssertionError(kind)


def _model(kind="Relu", stride=1, group=1, pads=(1, 1, 1, 1), bias=True, opset=17, identity=False, also_out=False,
           k=3, dilation=1):
    b = Builder()
    x = b.input("x", ["n", C, "h", "w"])
    rng = np.random.default_rng(7)
    ins = [x, b.const(rng.standard_normal((6 if group == 1 else C, C // group, k, k)) * 0.4)]
    if bias:
        ins.append(b.const(rng.standard_normal(6 if group == 1 else C)))
    y = b.op("Conv", *ins, kernel_shape=[k, k], pads=list(pads), strides=[stride, stride], group=group,
             dilations=[dilation, dilation])
    z = b.op("Identity", y) if identity else y
    out = _act(b, kind, z, opset)
    return b.model([out] + ([y] if also_out else []), opset=20 if kind == "GELU tanh" else opset)


KINDS = ["Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip", "SiLU", "GELU", "GELU tanh"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_activation_fuses_and_agrees(kind):
    sess = check_sequence(_model(kind), _feeds(1))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.ConvAct"] == 1 and ops["Conv"] == 0, dict(ops)
    assert sum(ops.values()) == 1, dict(ops)
    # its output dims follow from the input's in the shape program (no break point at the node)
    assert {n.kind for spec in sess.compiled.specs for n in spec.trace.nodes} == {"data"}


@pytest.mark.parametrize("stride,group,pads,bias,k", [(2, 1, (1, 1, 1, 1), True, 3), (1, C, (1, 1, 1, 1), False, 3),
                                                      (1, 1, (0, 0, 0, 0), True, 1), (2, C, (0, 1, 1, 0), True, 3)])
def test_convolution_forms(stride, group, pads, bias, k):
    sess = check_sequence(_model("HardSwish", stride, group, pads, bias, k=k), _feeds(2))
    assert fused_ops(sess)[f"{FUSED}.ConvAct"] == 1


def test_a_dilated_convolution():
    sess = check_sequence(_model("Relu", pads=(2, 2, 2, 2), dilation=2), _feeds(5))
    assert fused_ops(sess)[f"{FUSED}.ConvAct"] == 1


def test_clip_before_opset_11_and_the_identity_between():
    assert fused_ops(check_sequence(_model("Clip", opset=9), _feeds(3)))[f"{FUSED}.ConvAct"] == 1
    ops = fused_ops(check_sequence(_model("Relu", identity=True), _feeds(3)))
    assert ops[f"{FUSED}.ConvAct"] == 1 and ops["Identity"] == 0, dict(ops)


def test_near_misses_stay():
    ops = fused_ops(check_sequence(_model("Relu", also_out=True), _feeds(4)))
    assert ops["Conv"] == 1 and ops["Relu"] == 1, dict(ops)
    b = Builder()  # another HardSigmoid than MobileNetV3's
    x = b.input("x", ["n", C, "h", "w"])
    w = b.const(np.random.default_rng(8).standard_normal((6, C, 3, 3)) * 0.4)
    y = b.op("HardSigmoid", b.op("Conv", x, w, kernel_shape=[3, 3], pads=[1] * 4), alpha=0.2, beta=0.5)
    ops = fused_ops(check_sequence(b.model([y]), _feeds(4)))
    assert ops["Conv"] == 1 and ops["HardSigmoid"] == 1, dict(ops)


def test_switch(monkeypatch):
    assert "fuse_conv_activation" in [n for n, _ in pipeline.device_passes("cpu")]
    assert "fuse_conv_activation" not in [n for n, _ in pipeline.device_passes("cuda")]
    monkeypatch.setenv("DYNASHAPE_FUSE_CONV_ACT", "0")
    assert "fuse_conv_activation" not in [n for n, _ in pipeline.device_passes("cpu")]


def _conv_acts(sess) -> list:
    return [n for spec in sess.compiled.specs for n in spec.trace.nodes if n.node.op_type == "ConvAct"]


@pytest.mark.parametrize("quantized", [False, True], ids=["float model", "a quantizing op after"])
def test_a_float_model_takes_onednns_activation_and_a_quantizing_one_onnxruntimes(quantized):
    """Sigmoid, Tanh and SiLU after a convolution are oneDNN's post-op in a float model (one pass
    over the output fewer) and onnxruntime's own functions after it where the model rounds to integer
    steps anywhere (a DynamicQuantizeLinear here: its scale reads the activation's bits)."""
    b = Builder()
    x = b.input("x", ["N", C, "H", "W"])
    rng = np.random.default_rng(0)
    y = b.op("Conv", x, b.const(rng.standard_normal((6, C, 3, 3))), b.const(rng.standard_normal(6)),
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    out = _act(b, "SiLU", y, 17)
    outs = [out]
    if quantized:  # (the Builder names one output a node; DynamicQuantizeLinear has three)
        outs.append("q")
        b.nodes.append(onnx.helper.make_node("DynamicQuantizeLinear", [out], ["q", "q_scale", "q_zp"], name="dq"))
    model = b.model(outs)
    for o in model.graph.output:
        if o.name == "q":
            o.type.tensor_type.elem_type = onnx.TensorProto.UINT8
    sess = check_sequence(model, _feeds(3))
    (node,) = {id(n.node): n.node for n in _conv_acts(sess)}.values()
    assert node.attrs["act_exact"] == int(quantized)


def _affine_model(after: list[tuple[str, float]], group=1, k=3, also_out=False):
    """Conv -> HardSwish -> Mul/Add by one-element constants (PP-LCNetV3's learnable affine blocks) ->
    a padded 3x3 convolution (into which fold_conv_input_affine cannot fold the affine: its border
    reads the padding's zeros, not ``shift``)."""
    b = Builder()
    x = b.input("x", ["n", C, "h", "w"])
    rng = np.random.default_rng(9)
    y = b.op("HardSwish", b.op("Conv", x, b.const(rng.standard_normal((C if group > 1 else 8, C // group, k, k)) * 0.4),
                               b.const(rng.standard_normal(C if group > 1 else 8)), kernel_shape=[k, k],
                               pads=[k // 2] * 4, group=group))
    z = y
    for op, v in after:
        z = b.op(op, z, b.const(v)) if op == "Mul" else b.op(op, b.const(v), z)  # either operand order
    out = b.op("Conv", z, b.const(rng.standard_normal((6, C if group > 1 else 8, 3, 3)) * 0.3), kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    return b.model([out] + ([y] if also_out else []))


@pytest.mark.parametrize("after,group,k", [([("Mul", 1.7), ("Add", -0.3)], 1, 3), ([("Mul", 0.6), ("Add", 2.0)], 1, 1),
                                          ([("Add", 0.25)], 1, 3), ([("Mul", -1.2), ("Add", 0.5)], C, 3)])
def test_the_affine_after_the_activation_joins_the_convolution(after, group, k):
    """On every path of the bound kernel (the C tile at these new sizes, a depthwise one in C, oneDNN
    once a shape repeats: SHAPES ends with its first) the values are onnxruntime's. (A Mul alone
    folds into the next convolution's weight before: fold_conv_input_affine.)"""
    sess = check_sequence(_affine_model(after, group, k), _feeds(6))
    ran = [n.node.op_type for n in sess.compiled.specs[0].trace.nodes]
    assert ran == ["ConvAct", "ConvAct"], ran
    first = [n.node for n in _conv_acts(sess) if n.node.attrs.get("activation") == "hardswish"][0]
    scale = dict(after).get("Mul", 1.0)
    shift = dict(after).get("Add", 0.0)
    assert first.attrs["post_affine"] == pytest.approx([scale, shift])


def test_an_affine_whose_input_is_read_elsewhere_stays():
    sess = check_sequence(_affine_model([("Mul", 1.5), ("Add", 0.1)], also_out=True), _feeds(6))
    ran = [n.node.op_type for n in sess.compiled.specs[0].trace.nodes]
    assert ran.count("Mul") == 1 and ran.count("Add") == 1, ran

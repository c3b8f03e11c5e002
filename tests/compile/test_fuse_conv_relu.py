"""``fuse_conv_relu`` (compile/fuse_conv_relu.py, ops/conv_act.py): Conv -> Relu and Conv -> Add ->
Relu (a ResNet bottleneck's end, identity or projected shortcut) become one op. Each model runs
over changing batch and image sizes with fresh random inputs in the fused compiled session, the
interpreter (the unfused graph) and onnxruntime; near misses must not fuse. The pass runs on CUDA
sessions only (cuDNN's fused kernels); here it is switched on for CPU sessions too, where the op
is the convolution and its epilogue in place. On a GPU, the cuDNN path itself against the CPU."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import dynashape
from dynashape.compile import pipeline
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn, spec_of

C = 6
SHAPES = [(1, 7, 7), (3, 5, 9), (2, 8, 6), (1, 7, 7)]
CUDA_ONLY = pipeline.CONV_RELU_DEVICES  # as shipped, before the fixture switches CPU on


@pytest.fixture(autouse=True)
def _on_cpu_too(monkeypatch):
    monkeypatch.setattr(pipeline, "CONV_RELU_DEVICES", ("cuda", "cpu"))


def _w(b: Builder, cout: int, cin: int, k: int, seed: int) -> str:
    return b.const(np.random.default_rng(seed).standard_normal((cout, cin, k, k)) * 0.3)


def _conv(b: Builder, x: str, cout: int, cin: int, k: int, seed: int, stride: int = 1, bias: bool = True) -> str:
    ins = [x, _w(b, cout, cin, k, seed)]
    if bias:
        ins.append(b.const(np.random.default_rng(seed + 100).standard_normal(cout)))
    return b.op("Conv", *ins, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])


def bottleneck(shortcut: str = "identity", swap: bool = False):
    """conv 3x3 + BN -> Relu -> conv 1x1 -> Add(shortcut) -> Relu, as torchvision's blocks."""
    b = Builder()
    x = b.input("x", ["n", C, "h", "w"])
    rng = np.random.default_rng(7)
    h = _conv(b, x, C, C, 3, 1, bias=False)
    h = b.op("BatchNormalization", h, *(b.const(v) for v in (rng.uniform(0.5, 1.5, C), rng.standard_normal(C),
                                                                rng.standard_normal(C), rng.uniform(0.5, 2, C))))
    h = b.op("Relu", h)
    h = _conv(b, h, C, C, 1, 2)
    s = x if shortcut == "identity" else _conv(b, x, C, C, 1, 3)
    y = b.op("Relu", b.op("Add", *((s, h) if swap else (h, s))))
    return b.model([y])


def _feeds(seed: int, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, n, C, hh, ww)} for n, hh, ww in shapes]


def test_the_pass_is_cuda_only_by_default(monkeypatch):
    monkeypatch.setattr(pipeline, "CONV_RELU_DEVICES", CUDA_ONLY)

    def names(device):
        return [n for n, _ in pipeline.device_passes(device) if n == "fuse_conv_relu"]
    assert names("cpu") == [] and names("cuda:1") == ["fuse_conv_relu"]
    assert [n for n, _ in pipeline.device_passes("cuda")][-1] == "fuse_conv_relu"  # after channels_last


@pytest.mark.parametrize("shortcut,swap", [("identity", False), ("identity", True), ("projected", False)])
def test_bottleneck_fuses_and_agrees(shortcut, swap):
    sess = check_sequence(bottleneck(shortcut, swap), _feeds(1))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.ConvRelu"] == 1 and ops[f"{FUSED}.ConvAddRelu"] == 1, dict(ops)
    assert ops["Relu"] == 0 and ops["Add"] == 0 and ops["BatchNormalization"] == 0, dict(ops)
    assert ops["Conv"] == (1 if shortcut == "projected" else 0), dict(ops)  # the shortcut's conv is z


def _near_miss(case: str):
    b = Builder()
    x = b.input("x", ["n", C, "h", "w"])
    c = _conv(b, x, C, C, 3, 4)
    if case == "conv also an output":
        return b.model([b.op("Relu", c), c])
    if case == "constant add":  # a per-channel bias after the conv: fold_conv_add makes it the conv's bias
        return b.model([b.op("Relu", b.op("Add", c, b.const(np.random.default_rng(5).standard_normal((1, C, 1, 1)))))])
    if case == "sum also an output":
        s = b.op("Add", c, x)
        return b.model([b.op("Relu", s), s])
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["conv also an output", "constant add", "sum also an output"])
def test_near_misses_do_not_take_what_others_read(case):
    sess = check_sequence(_near_miss(case), _feeds(2))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.ConvAddRelu"] == 0, dict(ops)
    assert ops[f"{FUSED}.ConvRelu"] == (1 if case == "constant add" else 0), dict(ops)


def test_residual_that_broadcasts_at_run_time_unfuses():
    """z is an input whose dims may or may not be the convolution's: the pass fuses (it cannot tell
    at load), a call where z broadcasts runs the replaced nodes (counted in its trace), the others
    the fused op; all agree with onnxruntime."""
    b = Builder()
    x = b.input("x", ["n", C, "h", "w"])
    z = b.input("z", ["n", C, "a", "c"])
    y = b.op("Relu", b.op("Add", _conv(b, x, C, C, 3, 6), z))
    model = b.model([y])
    rng = np.random.default_rng(4)
    seq = [{"x": randn(rng, n, C, h, w), "z": randn(rng, n, C, *((1, 1) if small else (h, w)))}
           for n, h, w, small in [(1, 5, 5, False), (2, 4, 6, True), (1, 5, 5, False), (3, 6, 4, True)]]
    sess = check_sequence(model, seq)
    assert fused_ops(sess)[f"{FUSED}.ConvAddRelu"] == 1
    for f in seq:
        spec = spec_of(sess, f)
        ops = Counter(ni.node.op_type for ni in spec.trace.nodes)
        if f["z"].shape[2] == 1:
            assert spec.trace.unfused > 0 and ops["ConvAddRelu"] == 0 and ops["Add"] == 1, dict(ops)
        else:
            assert spec.trace.unfused == 0 and ops["ConvAddRelu"] == 1, dict(ops)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's fused kernels need a GPU")
@pytest.mark.parametrize("shortcut", ["identity", "projected"])
@pytest.mark.parametrize("static", ["sync", "off"])
def test_cudnn_fused_kernels_in_static_impls_only(monkeypatch, shortcut, static):
    """Static impl builds take cuDNN's fused kernels (and their graphs replay them); the dynamic
    path runs the convolution and its epilogue (a fused plan costs tens of ms at a new shape).
    Both agree with the CPU interpreter."""
    monkeypatch.setattr(pipeline, "CONV_RELU_DEVICES", CUDA_ONLY)
    calls = {"relu": 0, "add_relu": 0}
    real_relu, real_add = torch.cudnn_convolution_relu, torch.cudnn_convolution_add_relu

    def relu(*a):
        calls["relu"] += 1
        return real_relu(*a)

    def add_relu(*a):
        calls["add_relu"] += 1
        return real_add(*a)
    monkeypatch.setattr(torch, "cudnn_convolution_relu", relu)
    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", add_relu)
    model = bottleneck(shortcut)
    gpu = dynashape.InferenceSession(model, device="cuda", static_impls=static)
    cpu = dynashape.InferenceSession(model, executor="interpreter")
    for feeds in _feeds(3, SHAPES + SHAPES):  # each shape comes back: its static impl is built and replayed
        np.testing.assert_allclose(gpu.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    shapes = len(set(SHAPES))
    if static == "sync":
        assert gpu.stats()["static_builds"] == shapes and gpu.stats()["static_hits"] >= 1
        assert calls["relu"] >= shapes and calls["add_relu"] >= shapes, calls
    else:
        assert calls == {"relu": 0, "add_relu": 0}

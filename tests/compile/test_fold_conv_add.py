"""``fold_conv_add`` (compile/fold_conv_add.py): a constant per-channel Add after a Conv (how
PaddlePaddle exports a convolution's bias) becomes the Conv's bias; a BatchNormalization after it
then folds too. Near misses (a constant that varies over space, a tensor that is not constant, a
convolution read elsewhere) stay. Each model runs over changing shapes with fresh random inputs
in the fused compiled session, the interpreter and onnxruntime. Also: a Reshape to the same shape
after a channels-last convolution hands the next convolution the tensor itself (a view restrides
batch 1's size-1 dim and the convolution then copies its input to channels-last again)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.compile.test_fusion import Builder, check_sequence, fused_ops, randn

C = 5
SHAPES = [(1, 6, 6), (2, 4, 7), (3, 5, 3), (1, 6, 6)]


def _feeds(seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, n, 3, h, w)} for n, h, w in SHAPES]


def _model(c_shape=(1, C, 1, 1), swap=False, bias=False, bn=False, const=True, also_out=False):
    b = Builder()
    x = b.input("x", ["n", 3, "h", "w"])
    rng = np.random.default_rng(3)
    ins = [x, b.const(rng.standard_normal((C, 3, 3, 3)) * 0.3)] + ([b.const(rng.standard_normal(C))] if bias else [])
    y = b.op("Conv", *ins, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    c = b.const(rng.standard_normal(c_shape)) if const else b.input("c", list(c_shape))
    s = b.op("Add", *((c, y) if swap else (y, c)))
    if bn:
        s = b.op("BatchNormalization", s, *(b.const(v) for v in (rng.uniform(0.5, 1.5, C), rng.standard_normal(C),
                                                                    rng.standard_normal(C), rng.uniform(0.5, 2, C))))
    return b.model([s] + ([y] if also_out else []))


@pytest.mark.parametrize("c_shape", [(1, C, 1, 1), (C, 1, 1), (1,), ()])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_constant_add_becomes_the_bias(c_shape, swap, bias):
    sess = check_sequence(_model(c_shape, swap, bias), _feeds(1))
    ops = fused_ops(sess)
    assert ops["Conv"] == 1 and ops["Add"] == 0, dict(ops)


def test_batchnorm_after_the_add_folds_too():
    ops = fused_ops(check_sequence(_model(bn=True), _feeds(2)))
    assert ops["Conv"] == 1 and ops["Add"] == 0 and ops["BatchNormalization"] == 0, dict(ops)


@pytest.mark.parametrize("case", ["spatial constant", "not constant", "conv also an output"])
def test_near_misses_stay(case):
    if case == "spatial constant":
        model = _model(c_shape=(1, C, 1, 6))
        feeds = [f for f in _feeds(3) if f["x"].shape[3] == 6]
    elif case == "not constant":
        model = _model(const=False)
        rng = np.random.default_rng(4)
        feeds = [{**f, "c": randn(rng, 1, C, 1, 1)} for f in _feeds(3)]
    else:
        model, feeds = _model(also_out=True), _feeds(3)
    ops = fused_ops(check_sequence(model, feeds))
    assert ops["Conv"] == 1 and ops["Add"] == 1, dict(ops)


def test_same_shape_reshape_keeps_channels_last(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_FUSE_CONV_ACT", "0")  # torch's conv2d, which the test watches
    b = Builder()
    x = b.input("x", ["n", 3, "h", "w"])
    rng = np.random.default_rng(5)
    y = b.op("Conv", x, b.const(rng.standard_normal((C, 3, 3, 3)) * 0.3), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = b.op("Mul", y, b.input("s", [1, C, 1, 1]))  # written into an arena buffer laid out channels-last
    r = b.op("Reshape", y, b.op("Shape", y))
    z = b.op("Conv", r, b.const(rng.standard_normal((C, C, 1, 1)) * 0.3), kernel_shape=[1, 1])
    model = b.model([z])
    seen = []
    real = torch.conv2d

    def conv2d(inp, *a):  # the convolution's output follows the layout it found its input in
        out = real(inp, *a)
        seen.append(out.is_contiguous(memory_format=torch.channels_last))
        return out
    monkeypatch.setattr(torch, "conv2d", conv2d)
    rng = np.random.default_rng(7)
    check_sequence(model, [{**f, "s": randn(rng, 1, C, 1, 1)} for f in _feeds(6)])
    convs_per_call = 2
    assert seen and all(seen[1::convs_per_call]), seen  # the second conv's, batch 1 included

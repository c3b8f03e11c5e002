"""``fold_conv_scale`` (compile/fold_conv_scale.py): a constant per-channel Mul after a Conv (PP-LCNetV3's
"mobile one" blocks: Conv, Mul, Add) becomes part of the Conv's weights and bias, and the Add after
it then folds as the bias. Near misses (a constant that varies over space, a computed scale, a
convolution read elsewhere) stay. Each model runs over changing shapes with fresh random inputs in
the fused compiled session, the interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compile.test_fusion import Builder, check_sequence, fused_ops, randn

C = 5
SHAPES = [(1, 6, 6), (2, 4, 7), (3, 5, 3), (1, 6, 6)]


def _feeds(seed: int, extra=None):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, n, 3, h, w), **({k: randn(rng, *s) for k, s in extra.items()} if extra else {})}
            for n, h, w in SHAPES]


def _model(c_shape=(1, C, 1, 1), swap=False, bias=False, then_add=False, const=True, also_out=False, group=1):
    b = Builder()
    x = b.input("x", ["n", 3, "h", "w"])
    rng = np.random.default_rng(3)
    cin = 3 if group == 1 else 1
    cout = C if group == 1 else 3
    ins = [x, b.const(rng.standard_normal((cout, cin, 3, 3)) * 0.3)]
    ins += [b.const(rng.standard_normal(cout))] if bias else []
    y = b.op("Conv", *ins, kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group)
    c = b.const(rng.uniform(0.5, 2.0, c_shape)) if const else b.input("c", list(c_shape))
    s = b.op("Mul", *((c, y) if swap else (y, c)))
    if then_add:
        s = b.op("Add", s, b.const(rng.standard_normal((1, cout, 1, 1))))
    return b.model([s] + ([y] if also_out else []))


@pytest.mark.parametrize("c_shape", [(1, C, 1, 1), (C, 1, 1), (1,), ()])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_constant_scale_folds_into_the_weights(c_shape, swap, bias):
    ops = fused_ops(check_sequence(_model(c_shape, swap, bias), _feeds(1)))
    assert ops["Conv"] == 1 and ops["Mul"] == 0, dict(ops)


def test_scale_then_shift_both_fold():
    ops = fused_ops(check_sequence(_model(bias=True, then_add=True), _feeds(2)))
    assert ops["Conv"] == 1 and ops["Mul"] == 0 and ops["Add"] == 0, dict(ops)


def test_depthwise_scale_folds_per_output_channel():
    ops = fused_ops(check_sequence(_model(c_shape=(1, 3, 1, 1), bias=True, group=3), _feeds(3)))
    assert ops["Conv"] == 1 and ops["Mul"] == 0, dict(ops)


@pytest.mark.parametrize("case", ["spatial constant", "not constant", "conv also an output"])
def test_near_misses_stay(case):
    if case == "spatial constant":
        model, feeds = _model(c_shape=(1, C, 1, 6)), [f for f in _feeds(4) if f["x"].shape[3] == 6]
    elif case == "not constant":
        model, feeds = _model(const=False), _feeds(4, {"c": (1, C, 1, 1)})
    else:
        model, feeds = _model(also_out=True), _feeds(4)
    ops = fused_ops(check_sequence(model, feeds))
    assert ops["Conv"] == 1 and ops["Mul"] == 1, dict(ops)

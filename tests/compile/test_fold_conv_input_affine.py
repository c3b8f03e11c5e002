"""``fold_conv_input_affine`` (compile/fold_conv_input_affine.py): ``Conv(h * s + t)`` with constants
per input channel (PP-LCNetV3's "learnable affine blocks" after each activation) folds into the
convolution: the scale always (a padded zero stays zero), the shift only where the convolution pads
nothing. Grouped and depthwise convolutions map each input channel to its weights; near misses (a
padded convolution's shift, a scale that would broadcast the channels, an affine read elsewhere)
keep their nodes. Each model runs over changing shapes with fresh random inputs in the fused
compiled session, the interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn

CIN = 4
SHAPES = [(1, 6, 6), (2, 4, 7), (3, 5, 3), (1, 6, 6)]


def _feeds(seed: int, channels: int = CIN):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, n, channels, h, w)} for n, h, w in SHAPES]


def _model(pad=0, group=1, shape=(1, CIN, 1, 1), scale=True, shift=True, cout=6, k=3, also_out=False, channels=CIN,
           act=None):
    b = Builder()
    x = b.input("x", ["n", channels, "h", "w"])
    rng = np.random.default_rng(5)
    h = b.op(act, x) if act else x
    v = h
    if scale:
        v = b.op("Mul", v, b.const(rng.uniform(0.5, 2.0, shape)))
    if shift:
        v = b.op("Add", b.const(rng.standard_normal(shape)), v)
    w = b.const(rng.standard_normal((cout, CIN // group, k, k)) * 0.3)
    y = b.op("Conv", v, w, b.const(rng.standard_normal(cout)), kernel_shape=[k, k], pads=[pad] * 4, group=group)
    return b.model([y] + ([v] if also_out else []))


@pytest.mark.parametrize("shape", [(1, CIN, 1, 1), (CIN, 1, 1), (1,)])
@pytest.mark.parametrize("group,cout", [(1, 6), (2, 6), (CIN, CIN), (CIN, 2 * CIN)])
def test_unpadded_scale_and_shift_fold(shape, group, cout):
    ops = fused_ops(check_sequence(_model(pad=0, group=group, shape=shape, cout=cout), _feeds(1)))
    assert ops["Conv"] == 1 and ops["Mul"] == 0 and ops["Add"] == 0, dict(ops)


@pytest.mark.parametrize("group,cout", [(1, 6), (CIN, CIN)])
def test_padded_scale_folds_and_shift_stays(group, cout):
    ops = fused_ops(check_sequence(_model(pad=1, group=group, cout=cout), _feeds(2)))
    assert ops["Conv"] == 1 and ops["Add"] == 1 and ops["Mul"] == 1, dict(ops)  # the Add hides the Mul
    ops = fused_ops(check_sequence(_model(pad=1, group=group, cout=cout, shift=False), _feeds(2)))
    assert ops["Conv"] == 1 and ops["Mul"] == 0, dict(ops)


def test_shift_alone_folds_when_unpadded():
    ops = fused_ops(check_sequence(_model(scale=False), _feeds(3)))
    assert ops["Conv"] == 1 and ops["Add"] == 0, dict(ops)


def test_after_an_activation():
    """The PP-LCNetV3 shape: HardSwish, then the affine block, then a 1x1 convolution."""
    ops = fused_ops(check_sequence(_model(k=1, act="HardSwish"), _feeds(4)))
    assert ops["Conv"] == 1 and ops["Mul"] == 0 and ops["Add"] == 0, dict(ops)


@pytest.mark.parametrize("case", ["broadcasts the channels", "affine also an output", "spatial constant"])
def test_near_misses_stay(case):
    if case == "broadcasts the channels":  # h has one channel; s and t make it CIN
        model, feeds = _model(channels=1), _feeds(5, channels=1)
    elif case == "affine also an output":
        model, feeds = _model(also_out=True), _feeds(5)
    else:
        model, feeds = _model(shape=(1, CIN, 1, 6)), [f for f in _feeds(5) if f["x"].shape[3] == 6]
    ops = fused_ops(check_sequence(model, feeds))
    assert ops["Mul"] == 1 and ops["Add"] == 1, dict(ops)


def test_gelu_keeps_its_half():
    """GELU's 0.5 * x * (1 + erf(x / sqrt 2)) before a convolution fuses as GELU (the fold runs after)."""
    b = Builder()
    x = b.input("x", ["n", CIN, "h", "w"])
    e = b.op("Erf", b.op("Div", x, b.const(np.sqrt(2.0))))
    g = b.op("Mul", b.op("Mul", x, b.op("Add", e, b.const(1.0))), b.const(0.5))
    w = b.const(np.random.default_rng(6).standard_normal((6, CIN, 1, 1)) * 0.3)
    model = b.model([b.op("Conv", g, w, kernel_shape=[1, 1])])
    ops = fused_ops(check_sequence(model, _feeds(6)))
    assert ops[f"{FUSED}.Gelu"] == 1 and ops["Mul"] == 0, dict(ops)

"""A CPU convolution network fed a new image size (and batch) on every call: onnxruntime's values at
every call, and each convolution's weight reordered into oneDNN's layout once over the whole
sequence (``conv_weight_reorders`` in the session's stats(); ops/cpu_conv.py ``PackedWeight``)."""

from __future__ import annotations

import numpy as np
import pytest

from dynashape.ops import native
from dynashape.ops.cpu_conv import onednn_fuses
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn

pytestmark = pytest.mark.skipif(not onednn_fuses(), reason="torch without oneDNN's fused convolution")

# (n, h, w): every one new to the session
SIZES = [(1, 17, 23), (2, 40, 31), (1, 96, 64), (3, 9, 12), (1, 128, 70), (2, 33, 33), (1, 64, 160), (4, 20, 28)]


def _net():
    """A stem, a depthwise block and a head, as MobileNet-style OCR models have them: three 3x3
    convolutions that oneDNN runs with their activations as post-ops (a 1x1 at these sizes would be
    a product instead)."""
    b = Builder()
    rng = np.random.default_rng(11)
    x = b.input("x", ["n", 3, "h", "w"])
    y = b.op("Relu", b.op("Conv", x, b.const(rng.standard_normal((16, 3, 3, 3)) * 0.3),
                          b.const(rng.standard_normal(16)), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                          strides=[2, 2]))
    y = b.op("HardSwish", b.op("Conv", y, b.const(rng.standard_normal((16, 1, 3, 3)) * 0.3),
                               b.const(rng.standard_normal(16)), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                               group=16))
    y = b.op("Sigmoid", b.op("Conv", y, b.const(rng.standard_normal((8, 16, 3, 3)) * 0.2), kernel_shape=[3, 3],
                             pads=[1, 1, 1, 1]))
    return b.model([y])


def test_new_sizes_agree_with_onnxruntime_and_reorder_each_weight_once():
    rng = np.random.default_rng(3)
    feeds = [{"x": randn(rng, n, 3, h, w)} for n, h, w in SIZES]
    model = _net()
    before = native.counters().get("conv_weight_reorders", 0)
    sess = check_sequence(model, feeds[:1])
    assert fused_ops(sess)[f"{FUSED}.ConvAct"] == 3
    first = sess.stats()["conv_weight_reorders"]
    # the two dense convolutions run in C (csrc/conv_nhwc.c: their weights packed for it, nothing for
    # oneDNN), else the first call reordered their weights; the depthwise one runs in C at a new size
    # (csrc/depthwise.c) and needs no reorder until a size comes back
    dense_c = native.library("conv_nhwc") is not None
    assert first - before == (0 if dense_c else 2)
    dw = native.counters().get("conv_depthwise_c" if dense_c else "conv_depthwise_new_shape_c", 0)
    dense = native.counters().get("conv_dense_c", 0)
    check_sequence(model, feeds[1:], sess=sess)
    assert sess.stats()["conv_weight_reorders"] == first  # seven new sizes after it, none
    if dense_c:  # the depthwise tile of csrc/conv_nhwc.c at every new size
        assert native.counters().get("conv_depthwise_c", 0) - dw == len(SIZES) - 1
    elif not native.why("depthwise"):
        assert native.counters().get("conv_depthwise_new_shape_c", 0) - dw == len(SIZES) - 1
    if dense_c:  # every size is new: the C tile serves them on any CPU (check_sequence runs each once)
        assert native.counters().get("conv_dense_c", 0) - dense == 2 * (len(SIZES) - 1)

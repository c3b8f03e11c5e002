"""A CPU ConvTranspose whose kernel equals its stride (PP-OCRv4 det's 2x2 upsamplings) runs as the
product of the pixel rows by the weight at every input size (ops/cpu_conv.py ``patch_transpose``:
nothing built per shape); onnxruntime's values over a sequence of new sizes with fresh inputs, the
calls counted (``conv_transpose_products``), and the transposes it does not take left to torch."""

from __future__ import annotations

import numpy as np

from dynashape.ops import native
from tests.compile.test_fusion import Builder, check_sequence, randn

SIZES = [(1, 5, 7), (2, 12, 9), (1, 20, 31), (3, 4, 4), (1, 33, 18)]


def _net(bias: bool):
    """A 3x3 convolution, a 2x2 stride-2 transpose (served), a 3x3 stride-2 one with pads (not)."""
    b = Builder()
    rng = np.random.default_rng(2)
    x = b.input("x", ["n", 6, "h", "w"])
    y = b.op("Relu", b.op("Conv", x, b.const(rng.standard_normal((8, 6, 3, 3)) * 0.3), kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1]))
    args = [b.const(rng.standard_normal((8, 4, 2, 2)) * 0.3)] + ([b.const(rng.standard_normal(4))] if bias else [])
    y = b.op("ConvTranspose", y, *args, kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("ConvTranspose", y, b.const(rng.standard_normal((4, 3, 3, 3)) * 0.3), kernel_shape=[3, 3],
             strides=[2, 2], pads=[1, 1, 1, 1])
    return b.model([y])


def test_kernel_as_stride_transposes_agree_with_onnxruntime_over_new_sizes():
    rng = np.random.default_rng(4)
    for bias in (True, False):
        before = native.counters().get("conv_transpose_products", 0)
        sess = check_sequence(_net(bias), [{"x": randn(rng, n, 6, h, w)} for n, h, w in SIZES])
        assert sess.stats()["compiled_runs"] == len(SIZES)
        # the 2x2 one at every compiled call (the interpreter session beside it runs the op too)
        assert native.counters().get("conv_transpose_products", 0) - before == 2 * len(SIZES)

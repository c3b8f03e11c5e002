"""A 1x1 convolution of stride 1 at an input shape new to it runs as the product of the pixel rows
by the weight (no oneDNN primitive made for a shape that may never come back), and through oneDNN
once the shape repeats (ops/cpu_conv.py ``SEEN_SHAPES``): onnxruntime's values on both paths, the
new-shape calls counted (``conv_1x1_new_shape_products``) and the 1x1s' weights reordered for
oneDNN only when a shape came back."""

from __future__ import annotations

import numpy as np
import pytest

from dynashape.ops import cpu_conv, cpu_conv_dense, native
from dynashape.ops.cpu_conv import NEW_SHAPE_PRODUCTS, onednn_fuses
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn

pytestmark = pytest.mark.skipif(not onednn_fuses(), reason="torch without oneDNN's fused convolution")


@pytest.fixture(autouse=True)
def _without_the_c_tile(monkeypatch):
    """Where csrc/conv_nhwc.c serves dense convolutions (tests/ops/test_cpu_conv_dense.py) it takes
    these calls first; this file tests the paths that serve without it (no C compiler, or a CPU
    without AVX-512 at a shape that comes back)."""
    monkeypatch.setattr(cpu_conv_dense, "ACTS", {})

# (n, h, w): the 1x1s see (n, 16, h/2, w/2), above cpu_conv.SMALL_PRODUCT (a product at every shape)
SIZES = [(1, 96, 96), (1, 128, 80), (2, 96, 64), (1, 112, 120)]


def _net():
    """A 3x3 stem of stride 2, then two 1x1s of stride 1: one with HardSwish, one with Sigmoid (in
    this float model both oneDNN's post-ops, or torch's in place after a product; a quantizing model
    keeps onnxruntime's Sigmoid: tests/compile/test_fuse_conv_activation.py)."""
    b = Builder()
    rng = np.random.default_rng(5)
    x = b.input("x", ["n", 3, "h", "w"])
    y = b.op("Relu", b.op("Conv", x, b.const(rng.standard_normal((16, 3, 3, 3)) * 0.3),
                          b.const(rng.standard_normal(16)), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                          strides=[2, 2]))
    y = b.op("HardSwish", b.op("Conv", y, b.const(rng.standard_normal((64, 16, 1, 1)) * 0.3),
                               b.const(rng.standard_normal(64)), kernel_shape=[1, 1]))
    y = b.op("Sigmoid", b.op("Conv", y, b.const(rng.standard_normal((32, 64, 1, 1)) * 0.1),
                             b.const(rng.standard_normal(32)), kernel_shape=[1, 1]))
    return b.model([y])


def _counts() -> tuple[int, int]:
    c = native.counters()
    return c.get(NEW_SHAPE_PRODUCTS, 0), c.get("conv_weight_reorders", 0)


def test_new_shapes_run_as_products_and_repeats_through_onednn():
    assert min(n * (h // 2) * (w // 2) * 16 * 64 for n, h, w in SIZES) >= cpu_conv.SMALL_PRODUCT
    rng = np.random.default_rng(8)
    model = _net()
    products, reorders = _counts()
    sess = check_sequence(model, [{"x": randn(rng, SIZES[0][0], 3, *SIZES[0][1:])}])
    assert fused_ops(sess)[f"{FUSED}.ConvAct"] == 3
    # the two 1x1s took the product; the stem's first oneDNN call takes its weight as given (timed:
    # PackedWeight.timed), the copy is made at its next
    assert _counts() == (products + 2, reorders)
    for i, size in enumerate(SIZES):
        products, reorders = _counts()
        if i:  # a new shape: the products again, nothing reordered, no oneDNN primitive for the 1x1s
            check_sequence(model, [{"x": randn(rng, size[0], 3, *size[1:])}], sess=sess)
            assert _counts() == (products + 2, reorders)
        # the same shape again, twice, fresh inputs: oneDNN; each weight reordered once, at its second
        # oneDNN call (the stem's at the first repeat, the 1x1s' at the second), never again
        check_sequence(model, [{"x": randn(rng, size[0], 3, *size[1:])} for _ in range(2)], sess=sess)
        assert _counts()[0] == products + (2 if i else 0)
        assert _counts()[1] == reorders + (3 if i == 0 else 0)


def test_forgets_shapes_beyond_its_bound(monkeypatch):
    monkeypatch.setattr(cpu_conv, "SEEN_SHAPES", 2)
    seen: set = set()
    assert [cpu_conv._first_sight(seen, s) for s in [(1,), (2,), (1,), (3,), (1,)]] == [True, True, False, True, True]


def test_a_large_1x1_goes_to_onednn_at_once(monkeypatch):
    """Above NEW_SHAPE_PRODUCT_MAX multiply-adds the product's extra time passes oneDNN's primitive."""
    import torch
    torch.manual_seed(0)
    w, b = torch.randn(32, 16, 1, 1), torch.randn(32)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [0, 0], [1, 1], 1, "relu", [], "")
    x = torch.randn(1, 16, 64, 64).contiguous(memory_format=torch.channels_last)  # 2.1M: above SMALL_PRODUCT
    monkeypatch.setattr(cpu_conv, "NEW_SHAPE_PRODUCT_MAX", x.numel() * 32)
    products, reorders = _counts()
    torch.testing.assert_close(kernel(x, w, b), torch.relu(torch.conv2d(x, w, b)), rtol=1e-5, atol=1e-5)
    assert _counts() == (products, reorders)  # oneDNN at the first call, with the weight as given (timed)
    torch.testing.assert_close(kernel(x, w, b), torch.relu(torch.conv2d(x, w, b)), rtol=1e-5, atol=1e-5)
    assert _counts() == (products, reorders + 1)  # and its copy from the second

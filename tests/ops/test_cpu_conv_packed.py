"""ops/cpu_conv.py ``bound_conv2d_act`` / ``PackedWeight``: a convolution's constant weight reordered
by oneDNN once per input shape. The results equal torch's convolution and activation over changing
shapes (strided, grouped, 1x1, depthwise, NCHW and channels-last inputs); a copy is made once per
shape and at most ``MAX_SHAPES`` are kept; a write to the weight drops them; a squeeze-excitation
1x1 of a 1x1 image and inputs it does not take go to ``conv2d_act``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynashape.ops import cpu_conv

pytestmark = pytest.mark.skipif(not cpu_conv.onednn_fuses(), reason="torch without oneDNN's fused convolution")


def _ref(x, w, b, s, p, g, act):
    y = torch.conv2d(x, w, b, s, p, 1, g)
    return cpu_conv.ACTIVATIONS[act](y, [], "")


@pytest.mark.parametrize("cin,cout,k,s,g,act", [(8, 16, 3, 1, 1, "hardswish"), (8, 8, 3, 2, 8, "relu"),
                                                (8, 12, 1, 1, 1, "none"), (8, 16, 5, 1, 2, "swish")])
def test_equals_torch_over_shapes(cin, cout, k, s, g, act):
    torch.manual_seed(0)
    w, b = torch.randn(cout, cin // g, k, k), torch.randn(cout)
    p = [k // 2, k // 2]
    kernel = cpu_conv.bound_conv2d_act(w, b, [s, s], p, [1, 1], g, act, [], "")
    for n, h, wd, last in [(1, 9, 7, True), (2, 12, 5, False), (1, 9, 7, True), (3, 4, 4, True)]:
        x = torch.randn(n, cin, h, wd)
        x = x.contiguous(memory_format=torch.channels_last) if last else x
        torch.testing.assert_close(kernel(x, w, b), _ref(x, w, b, s, p, g, act), rtol=1e-5, atol=1e-5)


def test_one_copy_per_shape_from_its_second_call_the_last_ones_kept(monkeypatch):
    monkeypatch.setattr(cpu_conv, "MAX_SHAPES", 2)
    w = torch.randn(4, 3, 3, 3)
    packed = cpu_conv.PackedWeight(w, [1, 1], [1, 1], [1, 1], 1)
    a, b, c = torch.Size([1, 3, 8, 8]), torch.Size([1, 3, 9, 9]), torch.Size([2, 3, 8, 8])
    assert packed.for_input(a) is None  # a shape seen once: the call reorders the weight itself
    first = packed.for_input(a)
    assert first is not None and packed.for_input(a) is first  # made once
    for shape in (b, b, c, c):
        packed.for_input(shape)
    assert list(packed.copies) == [b, c]


def test_a_written_weight_is_reordered_again():
    torch.manual_seed(1)
    w, b = torch.randn(6, 4, 3, 3), torch.randn(6)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [1, 1], [1, 1], 1, "none", [], "")
    x = torch.randn(1, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    kernel(x, w, b)
    w.mul_(2)
    torch.testing.assert_close(kernel(x, w, b), F.conv2d(x, w, b, 1, 1), rtol=1e-5, atol=1e-5)


def test_what_it_does_not_take_goes_to_conv2d_act(monkeypatch):
    torch.manual_seed(2)
    w, b = torch.randn(5, 8, 1, 1), torch.randn(5)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [0, 0], [1, 1], 1, "relu", [], "")
    calls = []
    real = cpu_conv.conv2d_act
    monkeypatch.setattr(cpu_conv, "conv2d_act", lambda *a: calls.append(a[0].shape) or real(*a))
    pooled = torch.randn(2, 8, 1, 1)  # a squeeze-excitation block's 1x1 of a pooled image: addmm
    torch.testing.assert_close(kernel(pooled, w, b), F.relu(F.conv2d(pooled, w, b)))
    other = torch.randn(5, 8, 1, 1)  # another weight than the bound one
    x = torch.randn(1, 8, 3, 3)
    torch.testing.assert_close(kernel(x, other, b), F.relu(F.conv2d(x, other, b)))
    assert calls == [pooled.shape, x.shape]
    assert cpu_conv.bound_conv2d_act(w.double(), None, [1, 1], [0, 0], [1, 1], 1, "relu", [], "") is None


@pytest.mark.parametrize("bias", [True, False])
def test_a_small_pointwise_convolution_is_a_product_of_pixel_rows(monkeypatch, bias):
    """A 1x1 of stride 1 below SMALL_PRODUCT multiply-adds on a channels-last input: the rows of its
    pixels by the weight (oneDNN's fixed cost is most of such a call), the activation after."""
    torch.manual_seed(3)
    w, b = torch.randn(12, 8, 1, 1), (torch.randn(12) if bias else None)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [0, 0], [1, 1], 1, "hardswish", [], "")
    products = []
    real_mm, real_addmm = torch.mm, torch.addmm
    monkeypatch.setattr(torch, "mm", lambda *a: products.append("mm") or real_mm(*a))
    monkeypatch.setattr(torch, "addmm", lambda *a: products.append("addmm") or real_addmm(*a))
    for n, h, wd in [(1, 5, 7), (3, 4, 4), (1, 5, 7)]:
        x = torch.randn(n, 8, h, wd).contiguous(memory_format=torch.channels_last)
        y = kernel(x, w, b)
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, _ref(x, w, b, 1, [0, 0], 1, "hardswish"), rtol=1e-5, atol=1e-5)
    assert products == ["addmm" if bias else "mm"] * 3
    big = torch.randn(1, 8, 200, 200).contiguous(memory_format=torch.channels_last)  # above: oneDNN's
    torch.testing.assert_close(kernel(big, w, b), _ref(big, w, b, 1, [0, 0], 1, "hardswish"), rtol=1e-5, atol=1e-5)
    assert len(products) == 3


def test_a_written_weight_is_read_again_by_the_small_product():
    torch.manual_seed(4)
    w, b = torch.randn(6, 4, 1, 1).contiguous(memory_format=torch.channels_last), torch.randn(6)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [0, 0], [1, 1], 1, "none", [], "")
    x = torch.randn(1, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    kernel(x, w, b)
    w.mul_(3)
    torch.testing.assert_close(kernel(x, w, b), F.conv2d(x, w, b), rtol=1e-5, atol=1e-5)


def test_extra_copies_stay_within_the_budget_and_go_back_with_their_weight(monkeypatch):
    import gc
    w = torch.randn(8, 4, 3, 3)
    nbytes = w.numel() * w.element_size()
    start = cpu_conv.extra_copy_bytes()
    monkeypatch.setattr(cpu_conv, "COPY_BUDGET", start + 2 * nbytes)  # room for two extra copies
    packed = cpu_conv.PackedWeight(w, [1, 1], [1, 1], [1, 1], 1)
    shapes = [torch.Size([1, 4, s, s]) for s in (5, 6, 7, 8)]
    for shape in shapes:
        packed.for_input(shape)
        packed.for_input(shape)  # its second call: the copy is made
        assert cpu_conv.extra_copy_bytes() - start <= 2 * nbytes
    assert list(packed.copies) == shapes[1:]  # the first copy and two extra, the newest
    assert cpu_conv.extra_copy_bytes() - start == 2 * nbytes
    del packed
    gc.collect()
    assert cpu_conv.extra_copy_bytes() == start

"""ops/cpu_conv.py ``bound_conv2d_act`` / ``PackedWeight``: a convolution's constant weight reordered
by oneDNN once, for every input shape. The results equal torch's convolution and activation over
changing shapes (strided, grouped, 1x1, depthwise, dilated, NCHW and channels-last inputs); the
weight is reordered once over any number of new sizes (counted, and seen by torch's profiler); a
write to the weight reorders it again; a squeeze-excitation 1x1 of a 1x1 image and inputs it does
not take go to ``conv2d_act``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynashape.ops import cpu_conv, cpu_conv_dense, native

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


def _reorders() -> int:
    return native.counters().get("conv_weight_reorders", 0)


@pytest.mark.parametrize("cin,cout,k,s,g,d", [(8, 16, 3, 1, 1, 1), (16, 16, 5, 2, 16, 1), (8, 24, 3, 1, 1, 3),
                                              (48, 64, 1, 2, 1, 1)])
def test_one_reorder_per_weight_over_new_sizes(cin, cout, k, s, g, d):
    """Every call at a new size (and batch) takes the one reordered copy: one explicit reorder in
    all, the only one torch's profiler sees, and the values of torch's convolution (a depthwise one
    or dense one runs in C at a new size and reorders nothing)."""
    torch.manual_seed(5)
    w, b = torch.randn(cout, cin // g, k, k), torch.randn(cout)
    p = [d * (k // 2)] * 2
    kernel = cpu_conv.bound_conv2d_act(w, b, [s, s], p, [d, d], g, "relu", [], "")
    before = _reorders()
    sizes = [(1, 9, 13), (2, 40, 31), (1, 96, 64), (3, 7, 7), (1, 160, 96), (2, 23, 57), (5, 12, 200)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for n, h, wd in sizes:
            x = torch.randn(n, cin, h, wd).contiguous(memory_format=torch.channels_last)
            want = F.relu(torch.conv2d(x, w, b, s, p, d, g))
            torch.testing.assert_close(kernel(x, w, b), want, rtol=1e-4, atol=1e-4)
    # a depthwise convolution at a new size runs in C (csrc/depthwise.c), a dense one too
    # (csrc/conv_nhwc.c): no reorder at all
    in_c = not native.why("depthwise") if g > 1 else (not native.why("conv_nhwc") and native.library("conv_nhwc"))
    expect = 0 if in_c else 1
    assert _reorders() - before == expect
    seen = [e.key for e in prof.key_averages() if "reorder_convolution_weight" in e.key]
    assert [e.count for e in prof.key_averages() if e.key in seen] == ([1] if expect else []), seen


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
    pixels by the weight (oneDNN's fixed cost is most of such a call), the activation after. (Where
    the C tile of csrc/conv_nhwc.c serves dense convolutions it takes these first: it is turned
    off here to test the path that serves without it.)"""
    monkeypatch.setattr(cpu_conv_dense, "ACTS", {})
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
    for _ in range(2):  # ... once the shape comes back (new to the kernel, the product: SEEN_SHAPES)
        torch.testing.assert_close(kernel(big, w, b), _ref(big, w, b, 1, [0, 0], 1, "hardswish"), rtol=1e-5,
                                   atol=1e-5)
    assert len(products) == 4


def test_a_written_weight_is_read_again_by_the_small_product(monkeypatch):
    monkeypatch.setattr(cpu_conv_dense, "ACTS", {})  # the product's path, not the C tile's
    torch.manual_seed(4)
    w, b = torch.randn(6, 4, 1, 1).contiguous(memory_format=torch.channels_last), torch.randn(6)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [0, 0], [1, 1], 1, "none", [], "")
    x = torch.randn(1, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    kernel(x, w, b)
    w.mul_(3)
    torch.testing.assert_close(kernel(x, w, b), F.conv2d(x, w, b), rtol=1e-5, atol=1e-5)


def test_a_reordered_copy_found_slow_sends_nearby_row_counts_to_the_weight_as_given(monkeypatch):
    """oneDNN may want another layout than the copy's at some sizes, and then reorders it again in
    the call (10-50x slower): the first call times the weight as given, a call with the copy much
    slower than that marks the row counts within a factor of 2, which then take the weight as given."""
    torch.manual_seed(3)
    w = torch.randn(8, 4, 1, 1)
    pw = cpu_conv.PackedWeight(w, [0, 0], [1, 1], [1, 1], 1)
    first, packed = pw.weight_for(100)
    assert first is pw.w and not packed  # the first call: the weight as given, timed
    pw.timed(100, 1_000_000, 1e-3, False)  # 1 ns a multiply-add
    got, packed = pw.weight_for(150)
    assert packed and got is pw.get()
    before = native.counters().get("conv_packed_weight_misses", 0)
    pw.timed(150, 1_000_000, 5e-4, True)  # faster: kept
    pw.timed(300, 1_000_000, 5e-3, True)  # 5x the rate: its rows go to the weight as given
    assert native.counters().get("conv_packed_weight_misses", 0) == before + 1
    assert pw.weight_for(300)[1] is False and pw.weight_for(160)[1] is False and pw.weight_for(600)[1] is False
    assert pw.weight_for(149)[1] is True and pw.weight_for(601)[1] is True
    pw.timed(2000, 1000, 5e-5, True)  # below SLOW_FLOOR_S: oneDNN's overhead, not a layout
    assert pw.weight_for(2000)[1] is True


def test_the_bound_kernel_times_its_calls_and_stays_right_where_the_copy_is_avoided(monkeypatch):
    torch.manual_seed(4)
    w, b = torch.randn(24, 16, 3, 3), torch.randn(24)
    monkeypatch.setattr(cpu_conv_dense, "everywhere", lambda: False)  # oneDNN's path, not the C tile
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [1, 1], [1, 1], 1, "relu", [], "")
    seen = []
    orig = cpu_conv.PackedWeight.timed

    def spy(self, rows, macs, seconds, packed):
        seen.append((rows, packed))
        return orig(self, rows, macs, 1.0 if packed else 1e-9, packed)  # every copy call "slow"
    monkeypatch.setattr(cpu_conv.PackedWeight, "timed", spy)
    for n, h, wd in [(1, 9, 9), (1, 9, 9), (1, 9, 9), (2, 9, 9), (1, 40, 40), (1, 40, 40)]:
        x = torch.randn(n, 16, h, wd).contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(kernel(x, w, b), _ref(x, w, b, 1, [1, 1], 1, "relu"), rtol=1e-4, atol=1e-4)
    packed_rows = [r for r, p in seen if p]
    assert seen[0][1] is False and 81 in packed_rows  # the first call as given, then the copy once at 81 rows
    assert (162, True) not in seen  # 2 x 81: within the range found slow


def test_the_result_is_channels_last_with_the_weight_as_given_as_with_the_copy(monkeypatch):
    """oneDNN returns an NCHW input's result NCHW with the weight as given and channels-last with the
    reordered copy: the first call (as given) must hand on the layout the next ones do, or a
    depthwise convolution after it leaves its channels-last C path for that call."""
    torch.manual_seed(6)
    w, b = torch.randn(16, 3, 3, 3), torch.randn(16)
    monkeypatch.setattr(cpu_conv_dense, "everywhere", lambda: False)
    kernel = cpu_conv.bound_conv2d_act(w, b, [1, 1], [1, 1], [1, 1], 1, "relu", [], "")
    x = torch.randn(1, 3, 12, 12)  # NCHW, as a model's image input
    layouts = []
    for _ in range(3):  # the C tile at first sight, then oneDNN with the weight as given, then the copy
        y = kernel(x, w, b)
        torch.testing.assert_close(y, _ref(x, w, b, 1, [1, 1], 1, "relu"), rtol=1e-4, atol=1e-4)
        layouts.append(y.is_contiguous(memory_format=torch.channels_last))
    assert layouts[1:] == [True, True], layouts

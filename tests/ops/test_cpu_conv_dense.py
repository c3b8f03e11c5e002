"""Dense convolutions on the CPU in C (ops/csrc/conv_nhwc.c through ops/cpu_conv_dense.py): the
values of torch's convolution and activation over kernel sizes, strides, paddings, dilations,
channel counts that are not multiples of the 16-lane blocks, batches, NCHW (a few channels read as
they are) and channels-last inputs and images smaller than the kernel's reach; a YOLO-style network
against onnxruntime over a new size on every call; the calls counted; the weight packed again after
a write."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.ops import cpu_conv, cpu_conv_dense, native
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn

pytestmark = [pytest.mark.skipif(not cpu_conv.onednn_fuses(), reason="torch without oneDNN's fused convolution"),
              pytest.mark.skipif(native.library("conv_nhwc") is None, reason="no C compiler: oneDNN serves")]

REF = {"none": lambda y, a: y, "relu": lambda y, a: F.relu(y), "hardswish": lambda y, a: F.hardswish(y),
       "swish": lambda y, a: F.silu(y), "sigmoid": lambda y, a: torch.sigmoid(y),
       "leaky_relu": lambda y, a: F.leaky_relu(y, a)}


def _dense_calls() -> int:
    return native.counters().get(cpu_conv_dense.COUNTER, 0)


@settings(max_examples=60, deadline=None)
@given(cin=st.integers(1, 40), cout=st.integers(1, 70), k=st.sampled_from([(1, 1), (3, 3), (5, 5), (1, 3), (3, 1)]),
       s=st.integers(1, 3), p=st.integers(0, 2), d=st.integers(1, 2), n=st.integers(1, 3), h=st.integers(1, 30),
       w=st.integers(1, 30), act=st.sampled_from(sorted(REF)), last=st.booleans(), bias=st.booleans(),
       affine=st.one_of(st.none(), st.tuples(st.floats(-3, 3), st.floats(-3, 3))), seed=st.integers(0, 1000))
def test_equals_torch(cin, cout, k, s, p, d, n, h, w, act, last, bias, affine, seed):
    kh, kw = k
    if h + 2 * p < d * (kh - 1) + 1 or w + 2 * p < d * (kw - 1) + 1:
        return  # no output pixel: torch refuses the shape too
    g = torch.Generator().manual_seed(seed)
    wt = torch.randn(cout, cin, kh, kw, generator=g) / (cin * kh * kw) ** 0.5
    b = torch.randn(cout, generator=g) if bias else None
    x = torch.randn(n, cin, h, w, generator=g)
    if last:
        x = x.contiguous(memory_format=torch.channels_last)
    alpha = [0.1] if act == "leaky_relu" else []
    kernel = cpu_conv.bound_conv2d_act(wt, b, [s, s], [p, p], [d, d], 1, act, alpha, "", exact=False, affine=affine)
    before = _dense_calls()
    y = kernel(x, wt, b)
    want = REF[act](F.conv2d(x, wt, b, s, p, d), 0.1)
    if affine is not None:  # scale * y + shift after the activation (PP-LCNetV3's affine blocks)
        want = want * affine[0] + affine[1]
    torch.testing.assert_close(y, want, rtol=2e-5, atol=2e-5)
    pooled = kh == kw == 1 and h == w == 1 and p == 0  # a squeeze-excitation 1x1 of a 1x1 image: addmm's
    assert _dense_calls() - before == (0 if pooled else 1)
    assert pooled or y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("cin,last,planar", [(3, False, 1), (8, False, 1), (9, False, 0), (3, True, 0)])
def test_a_planar_image_of_few_channels_is_read_as_it_is(cin, last, planar):
    """A network's input ([n][c][h][w], few channels): the C side gathers its channels into pixels as it
    pads (no transposition to channels-last first); wider or channels-last images keep their path."""
    g = torch.Generator().manual_seed(cin)
    wt, b = torch.randn(16, cin, 3, 3, generator=g), torch.randn(16, generator=g)
    x = torch.randn(2, cin, 33, 20, generator=g)
    if last:
        x = x.contiguous(memory_format=torch.channels_last)
    tile = cpu_conv_dense.DenseConv(wt, b, (2, 2), (1, 1), (1, 1), cpu_conv_dense.ACTS["relu"])
    torch.testing.assert_close(tile(x), F.relu(F.conv2d(x, wt, b, 2, 1)), rtol=2e-5, atol=2e-5)
    assert [key[3] for key in tile.plans] == [planar]


def test_silu_of_large_values_and_the_exponent_edges():
    """The tile's own exp: SiLU and Sigmoid of outputs from -100 to 100 (exp's clamps, k = 128)."""
    wt = torch.ones(16, 1, 1, 1)
    x = torch.linspace(-100, 100, 4001).view(1, 1, 1, -1).contiguous(memory_format=torch.channels_last)
    for act, ref in [("swish", F.silu), ("sigmoid", torch.sigmoid)]:
        kernel = cpu_conv.bound_conv2d_act(wt, None, [1, 1], [0, 0], [1, 1], 1, act, [], "", exact=False)
        torch.testing.assert_close(kernel(x, wt, None), ref(F.conv2d(x, wt)), rtol=1e-6, atol=1e-6)


def test_a_written_weight_is_packed_again():
    torch.manual_seed(1)
    wt, b = torch.randn(20, 6, 3, 3), torch.randn(20)
    kernel = cpu_conv.bound_conv2d_act(wt, b, [1, 1], [1, 1], [1, 1], 1, "none", [], "")
    x = torch.randn(2, 6, 9, 11)
    kernel(x, wt, b)
    wt.mul_(-2)
    torch.testing.assert_close(kernel(x, wt, b), F.conv2d(x, wt, b, 1, 1), rtol=1e-5, atol=1e-5)


def test_an_onnx_runtime_quantizing_model_keeps_onnxruntime_sigmoid():
    """``exact``: the activations a quantizing model reads keep onnxruntime's bits, so the C tile
    (its own exp) does not take a Sigmoid/SiLU convolution there; ReLU it does."""
    wt = torch.randn(16, 4, 3, 3)
    x = torch.randn(1, 4, 8, 8)
    before = _dense_calls()
    cpu_conv.bound_conv2d_act(wt, None, [1, 1], [1, 1], [1, 1], 1, "sigmoid", [], "", exact=True)(x, wt, None)
    assert _dense_calls() == before
    cpu_conv.bound_conv2d_act(wt, None, [1, 1], [1, 1], [1, 1], 1, "relu", [], "", exact=True)(x, wt, None)
    assert _dense_calls() == before + 1


def _yolo_block():
    """A YOLOv8-style stem and C2f-like block: 3x3 stride-2 convolutions with SiLU (Sigmoid * x), a 1x1,
    two halves of its channels, two 3x3s with a residual add, a concatenation and a 1x1 head."""
    b = Builder()
    rng = np.random.default_rng(7)

    def conv(x, cin, cout, k, s):
        w = b.const(rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k))
        y = b.op("Conv", x, w, b.const(rng.standard_normal(cout) * 0.1), kernel_shape=[k, k], strides=[s, s],
                 pads=[k // 2] * 4)
        return b.op("Mul", y, b.op("Sigmoid", y))

    x = b.input("x", ["n", 3, "h", "w"])
    y = conv(conv(x, 3, 16, 3, 2), 16, 32, 3, 2)
    y = conv(y, 32, 32, 1, 1)
    i64 = np.int64
    a = b.op("Slice", y, b.const([0], i64), b.const([16], i64), b.const([1], i64))
    c = b.op("Slice", y, b.const([16], i64), b.const([32], i64), b.const([1], i64))
    c2 = b.op("Add", c, conv(conv(c, 16, 16, 3, 1), 16, 16, 3, 1))
    y = conv(b.op("Concat", a, c, c2, axis=1), 48, 24, 1, 1)
    return b.model([y])


def test_a_yolo_block_at_a_new_size_every_call_matches_onnxruntime():
    rng = np.random.default_rng(2)
    sizes = [(1, 64, 96), (2, 32, 32), (1, 96, 40), (3, 17, 23), (1, 128, 128), (1, 7, 9)]
    feeds = [{"x": randn(rng, n, 3, h, w)} for n, h, w in sizes]
    before = _dense_calls()
    sess = check_sequence(_yolo_block(), feeds)
    assert fused_ops(sess)[f"{FUSED}.ConvAct"] == 6
    assert _dense_calls() - before == 6 * len(sizes)


@pytest.mark.parametrize("k,p", [(1, 0), (3, 1), (3, 0)])
def test_a_channel_slice_of_a_channels_last_image_is_read_in_place(k, p):
    """YOLO's C2f blocks split a convolution's channels in two: the tile reads the slice through its
    pixel stride (no copy) and gives the values of the slice made contiguous."""
    torch.manual_seed(6)
    big = torch.randn(2, 40, 9, 13).contiguous(memory_format=torch.channels_last)
    x = big[:, 8:20]
    assert cpu_conv_dense.pixel_stride(x) == 40
    wt, b = torch.randn(24, 12, k, k) / 6, torch.randn(24)
    kernel = cpu_conv.bound_conv2d_act(wt, b, [1, 1], [p, p], [1, 1], 1, "relu", [], "")
    torch.testing.assert_close(kernel(x, wt, b), F.relu(F.conv2d(x.contiguous(), wt, b, 1, p)), rtol=1e-5, atol=1e-5)
    assert cpu_conv_dense.pixel_stride(torch.randn(2, 12, 9, 13)) is None  # NCHW: made channels-last first


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 70), k=st.sampled_from([(3, 3), (5, 5), (3, 1)]), s=st.integers(1, 2), p=st.integers(0, 2),
       d=st.integers(1, 2), n=st.integers(1, 2), h=st.integers(1, 20), w=st.integers(1, 20),
       act=st.sampled_from(sorted(REF)), bias=st.booleans(),
       affine=st.one_of(st.none(), st.tuples(st.floats(-3, 3), st.floats(-3, 3))), seed=st.integers(0, 1000))
def test_the_depthwise_tile_equals_torch(c, k, s, p, d, n, h, w, act, bias, affine, seed):
    """csrc/conv_nhwc.c ``dw_nhwc_run`` through cpu_conv_dense.DepthwiseConv: one group per channel,
    channel counts that are not whole 16-lane blocks, any stride, padding and dilation."""
    kh, kw = k
    if h + 2 * p < d * (kh - 1) + 1 or w + 2 * p < d * (kw - 1) + 1:
        return
    g = torch.Generator().manual_seed(seed)
    wt = torch.randn(c, 1, kh, kw, generator=g) / kh
    b = torch.randn(c, generator=g) if bias else None
    x = torch.randn(n, c, h, w, generator=g).contiguous(memory_format=torch.channels_last)
    tile = cpu_conv_dense.DepthwiseConv(wt, b, (s, s), (p, p), (d, d), cpu_conv_dense.ACTS[act], 0.1, affine)
    want = REF[act](F.conv2d(x, wt, b, s, p, d, c), 0.1)
    if affine is not None:
        want = want * affine[0] + affine[1]
    torch.testing.assert_close(tile(x), want, rtol=2e-5, atol=2e-5)

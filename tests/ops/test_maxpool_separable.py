"""MaxPool as a max over rows then columns (ops/pool.py ``_separable_max``), taken on the CPU for
stride-1 windows up to 3x3 over large planes, where torch's kernel is slow: equal to torch's
kernel and to onnxruntime for the paddings ONNX has (explicit, SAME_UPPER / SAME_LOWER, ceil
mode), channels-last and NCHW inputs, NaN included; and the path is the one claimed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.ops import pool


def _onnx_maxpool(x, **attrs):
    return pool._maxpool(x, _n_outputs=1, **attrs)[0]


def _forced(x, **attrs):
    """The separable path whatever the plane's size (the threshold is tested below)."""
    real = pool._separable_pays
    pool._separable_pays = lambda x, n, k, s, d: n == 2 and all(v == 1 for v in s) and all(v == 1 for v in d)
    try:
        return _onnx_maxpool(x, **attrs)
    finally:
        pool._separable_pays = real


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 3), kw=st.integers(1, 3), h=st.integers(3, 40), w=st.integers(3, 40),
       c=st.integers(1, 6), ceil=st.booleans(), pad=st.integers(0, 1), cl=st.booleans(), seed=st.integers(0, 99))
def test_separable_max_equals_torch(k, kw, h, w, c, ceil, pad, cl, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, c, h, w, generator=g)
    x[0, 0, 1, 1] = float("nan")
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    pads = [min(pad, k // 2), min(pad, kw // 2)] * 2
    got = _forced(x, kernel_shape=[k, kw], strides=[1, 1], pads=pads, ceil_mode=int(ceil))
    want = F.max_pool2d(x, (k, kw), 1, (pads[0], pads[1]), 1, bool(ceil))
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("k", [2, 3])
def test_same_padding_against_onnxruntime(auto_pad, k):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[1, 1], auto_pad=auto_pad)
    g = helper.make_graph([node], "mp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48, 50, 45])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.random.default_rng(k).standard_normal((1, 48, 50, 45)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = _forced(torch.from_numpy(x), kernel_shape=[k, k], strides=[1, 1], auto_pad=auto_pad)
    np.testing.assert_array_equal(got.numpy(), want)


def test_the_path_is_taken_where_claimed(monkeypatch):
    calls = []
    real = pool._separable_max
    monkeypatch.setattr(pool, "_separable_max", lambda *a: calls.append(1) or real(*a))
    big, small = torch.randn(1, 48, 64, 64), torch.randn(1, 4, 8, 8)
    _onnx_maxpool(big, kernel_shape=[2, 2], strides=[1, 1])
    assert calls == [1]
    _onnx_maxpool(big, kernel_shape=[3, 3], strides=[2, 2])  # stride 2: torch's kernel
    _onnx_maxpool(small, kernel_shape=[2, 2], strides=[1, 1])  # a small plane: torch's kernel
    _onnx_maxpool(big, kernel_shape=[5, 5], strides=[1, 1])  # a 5x5 window: torch's kernel
    assert calls == [1]

"""ops/conv.py ``conv1d``: small dense float32 1-D convolutions on CPU run in C (csrc/conv1d.c);
without it, tiny ones run as one matrix product over the unfolded windows (at batch 1 from 512
unfolded elements); everything else is torch's conv1d. Each against torch on random inputs,
across strides, pads, kernel sizes, batch sizes, with and without bias; the path taken is checked
too (a stand-in that would hide a fallback would pass the values alone)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.ops import conv as C
from dynashape.ops import native


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 8), c=st.integers(1, 40), length=st.integers(1, 40), o=st.integers(1, 24),
       k=st.integers(1, 5), s=st.integers(1, 3), p=st.integers(0, 2), bias=st.booleans(), seed=st.integers(0, 99))
def test_matches_torch_conv1d(n, c, length, o, k, s, p, bias, seed):
    if length + 2 * p < k:
        return  # no window fits: torch refuses, and so does the caller's shape function
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, c, length, generator=g), torch.randn(o, c, k, generator=g)
    b = torch.randn(o, generator=g) if bias else None
    got = C.conv1d(x, w, b, (s,), (p,), (1,), 1)
    want = F.conv1d(x, w, b, s, p, 1, 1)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 4), c=st.integers(2, 300), length=st.integers(1, 300), k=st.integers(1, 7),
       s=st.integers(1, 3), p=st.integers(0, 3), bias=st.booleans(), seed=st.integers(0, 99))
def test_a_depthwise_conv1d_matches_torch_in_both_forms(n, c, length, k, s, p, bias, seed):
    """One filter per channel (silero-vad v4's): the windows times the taps up to DW_UNFOLD
    unfolded elements, shifted multiply-adds beyond; both against torch's grouped conv1d."""
    if length + 2 * p < k:
        return
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, c, length, generator=g), torch.randn(c, 1, k, generator=g)
    b = torch.randn(c, generator=g) if bias else None
    got = C.conv1d(x, w, b, (s,), (p,), (1,), c)
    want = F.conv1d(x, w, b, s, p, 1, c)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_depthwise_conv1d_in_c_up_to_its_bound():
    if native.library("conv1d") is None:
        pytest.skip(f"no C kernel: {native.why('conv1d')}")
    g = torch.Generator().manual_seed(3)
    before = native.counters().get(C.NATIVE_DW_CONV1D, 0)
    for n, c, length, k, s, p in ((1, 258, 8, 5, 1, 2), (2, 16, 4, 5, 2, 2), (3, 7, 1, 3, 1, 1), (1, 32, 40, 1, 1, 0)):
        x, w, b = torch.randn(n, c, length, generator=g), torch.randn(c, 1, k, generator=g), torch.randn(c, generator=g)
        for bias in (b, None):
            torch.testing.assert_close(C.conv1d(x, w, bias, s, p, 1, c), F.conv1d(x, w, bias, s, p, 1, c), atol=1e-5,
                                       rtol=1e-5)
    assert native.counters().get(C.NATIVE_DW_CONV1D, 0) == before + 8
    C.conv1d(torch.randn(8, 258, 64), torch.randn(258, 1, 5), None, 1, 2, 1, 258)  # beyond DW_C: torch's forms
    assert native.counters().get(C.NATIVE_DW_CONV1D, 0) == before + 8


def test_a_depthwise_conv1d_takes_each_form_by_size(monkeypatch):
    monkeypatch.setattr(C, "DW_C", 0)  # the forms without the C kernel
    calls = []
    real = F.conv1d
    monkeypatch.setattr(F, "conv1d", lambda *a, **k: calls.append(1) or real(*a, **k))
    unfolds, real_unfold = [], torch.Tensor.unfold
    monkeypatch.setattr(torch.Tensor, "unfold", lambda self, *a: unfolds.append(1) or real_unfold(self, *a))
    C.conv1d(torch.randn(1, 258, 8), torch.randn(258, 1, 5), torch.randn(258), 1, 2, 1, 258)  # 10k: unfolded
    assert len(unfolds) == 1
    C.conv1d(torch.randn(1, 258, 2000), torch.randn(258, 1, 5), None, 1, 2, 1, 258)  # the taps
    assert len(unfolds) == 1 and not calls
    C.conv1d(torch.randn(1, 8, 40), torch.randn(16, 1, 3), None, 1, 1, 1, 8)  # two filters a channel: torch
    C.conv1d(torch.randn(1, 8, 40), torch.randn(8, 1, 3), None, 1, 2, 2, 8)  # dilation: torch
    C.conv1d(torch.randn(1, 8, 40).half(), torch.randn(8, 1, 3).half(), None, 1, 1, 1, 8)  # half: torch sums in fp32
    assert len(calls) == 3


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 6), c=st.integers(1, 140), length=st.integers(1, 80), o=st.integers(1, 260),
       k=st.integers(1, 9), s=st.integers(1, 4), p=st.integers(0, 3), d=st.integers(1, 3), bias=st.booleans(),
       seed=st.integers(0, 99))
def test_the_c_kernel_matches_torch_conv1d(n, c, length, o, k, s, p, d, bias, seed):
    out_len = (length + 2 * p - d * (k - 1) - 1) // s + 1
    if out_len < 1 or n * out_len * c * k * o > C.C_MACS:
        return  # no window fits (torch refuses), or beyond the C kernel's bound
    if native.library("conv1d") is None:
        pytest.skip(f"no C kernel: {native.why('conv1d')}")
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, c, length, generator=g), torch.randn(o, c, k, generator=g)
    b = torch.randn(o, generator=g) if bias else None
    before = native.counters().get(C.NATIVE_CONV1D, 0)
    got = C.conv1d(x, w, b, (s,), (p,), (d,), 1)
    assert native.counters().get(C.NATIVE_CONV1D, 0) == before + 1  # the C kernel served it
    want = F.conv1d(x, w, b, s, p, d, 1)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_c_kernel_repacks_a_weight_that_changed_and_leaves_other_dtypes_to_torch():
    if native.library("conv1d") is None:
        pytest.skip(f"no C kernel: {native.why('conv1d')}")
    x, w, b = torch.randn(2, 16, 9), torch.randn(8, 16, 3), torch.randn(8)
    torch.testing.assert_close(C.conv1d(x, w, b, 1, 1), F.conv1d(x, w, b, 1, 1), atol=1e-5, rtol=1e-5)
    w.mul_(-2.0)  # in place: the packed copy made from the old values must not serve
    torch.testing.assert_close(C.conv1d(x, w, b, 1, 1), F.conv1d(x, w, b, 1, 1), atol=1e-5, rtol=1e-5)
    before = native.counters().get(C.NATIVE_CONV1D, 0)
    x64, w64 = x.double(), w.double()
    torch.testing.assert_close(C.conv1d(x64, w64, None, 1, 1), F.conv1d(x64, w64, None, 1, 1))
    big = torch.randn(1, 64, 2000)  # 64 x 3 x 64 x 2000 multiply-adds: beyond C_MACS, torch's
    assert C.conv1d(big, torch.randn(64, 64, 3), None, 1, 1).shape == (1, 64, 2000)
    assert native.counters().get(C.NATIVE_CONV1D, 0) == before


def test_the_product_serves_tiny_batched_inputs_and_torch_the_rest(monkeypatch):
    monkeypatch.setattr(C, "C_MACS", 0)  # the forms without the C kernel
    calls = []
    real = torch.addmm
    mm_calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(torch, "mm", lambda *a, **k: mm_calls.append(1) or real_mm(*a, **k))
    x4, x1 = torch.randn(4, 64, 2), torch.randn(1, 64, 2)
    w, b = torch.randn(64, 64, 3), torch.randn(64)
    C.conv1d(x4, w, b, 2, 1)  # silero-vad's: batch 4, 1 output position each
    assert len(calls) == 1
    C.conv1d(x1, w, b, 2, 1)  # batch 1, 192 unfolded elements: torch's path is as fast there
    C.conv1d(torch.randn(4, 64, 200), w, b, 1, 1)  # 800 positions: oneDNN
    C.conv1d(torch.randn(4, 64, 2), torch.randn(64, 32, 3), b, 2, 1, 1, 2)  # groups
    C.conv1d(x4, w, b, 1, 2, 2)  # dilation
    assert len(calls) == 1
    C.conv1d(torch.randn(1, 129, 4), torch.randn(128, 129, 3), None, 1, 1)  # batch 1, 1548 elements:
    C.conv1d(torch.randn(1, 1, 640), torch.randn(258, 1, 256), None, 128)  # silero's encoder, STFT
    assert len(calls) == 1 and len(mm_calls) == 2  # (no bias: torch.mm)


def _conv1d_model(w, b, group=1, weight_input=False, stride=2, relu=False):
    import numpy as np  # noqa: F401
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(b, "b")] + ([] if weight_input else [numpy_helper.from_array(w, "w")])
    ins = [helper.make_tensor_value_info("x", TP.FLOAT, ["N", w.shape[1] * group, "L"])]
    if weight_input:
        ins.append(helper.make_tensor_value_info("w", TP.FLOAT, list(w.shape)))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], pads=[1, 1], strides=[stride],
                              group=group)] + ([helper.make_node("Relu", ["c"], ["y"])] if relu else [])
    g = helper.make_graph(nodes, "g", ins,
        [helper.make_tensor_value_info("y", TP.FLOAT, ["N", w.shape[0], "M"])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["dense", "depthwise", "weight as an input"])
def test_a_conv1d_model_through_the_generated_code(batch, kind):
    """A Conv node of a model equals torch's over changing lengths: with a constant weight through its
    bound kernel (ops/conv.py ``bound_conv1d``: the C kernels, a length too long for them torch's),
    with a computed one through the emitter's ``_conv1d``."""
    import numpy as np

    import dynashape
    rng = np.random.default_rng(batch)
    group = 8 if kind == "depthwise" else 1
    w = rng.standard_normal((8, 1, 3) if kind == "depthwise" else (16, 8, 3)).astype(np.float32)
    b = rng.standard_normal(w.shape[0]).astype(np.float32)
    sess = dynashape.InferenceSession(_conv1d_model(w, b, group, kind == "weight as an input").SerializeToString())
    counter = C.NATIVE_DW_CONV1D if kind == "depthwise" else C.NATIVE_CONV1D
    for length in (4, 9, 2, 9, 20000):
        x = rng.standard_normal((batch, 8, length)).astype(np.float32)
        feeds = {"x": x, **({"w": w} if kind == "weight as an input" else {})}
        before = native.counters().get(counter, 0)
        (y,) = sess.run(None, feeds)
        want = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), 2, 1, 1, group).numpy()
        np.testing.assert_allclose(y, want, atol=1e-4, rtol=1e-4)
        if kind != "weight as an input" and native.library("conv1d") is not None:
            assert native.counters().get(counter, 0) - before == (length < 20000)  # too long: torch's
    source = sess.compiled.specs[0].source
    assert ("_conv1d(" in source) == (kind == "weight as an input")


def test_a_bound_conv1d_repacks_a_weight_written_in_place():
    if native.library("conv1d") is None:
        pytest.skip(f"no C kernel: {native.why('conv1d')}")
    w, b = torch.randn(8, 4, 3), torch.randn(8)
    kernel = C.bound_conv1d(w, b, 1, 1, 1, 1)
    x = torch.randn(2, 4, 7)
    torch.testing.assert_close(kernel(x, w, b), F.conv1d(x, w, b, 1, 1), atol=1e-5, rtol=1e-5)
    w.mul_(-2.0)  # update_weights writing in place: the packed copy follows
    torch.testing.assert_close(kernel(x, w, b), F.conv1d(x, w, b, 1, 1), atol=1e-5, rtol=1e-5)
    other = torch.randn(8, 4, 3)  # another weight than the bound one: conv1d's own path
    torch.testing.assert_close(kernel(x, other, b), F.conv1d(x, other, b, 1, 1), atol=1e-5, rtol=1e-5)
    assert C.bound_conv1d(w.double(), None, 1, 1, 1, 1) is None  # float32 only


@pytest.mark.parametrize("kind", ["dense", "depthwise"])
def test_a_conv1d_and_its_relu_are_one_c_call(kind):
    """fuse_conv_activation makes a 1-D Conv and its Relu one ConvAct, whose bound kernel has the C
    kernel apply the Relu as it stores; over changing lengths against onnxruntime."""
    import numpy as np
    import onnxruntime as ort

    import dynashape
    from tests.compile.test_fusion import fused_ops
    if native.library("conv1d") is None:
        pytest.skip(f"no C kernel: {native.why('conv1d')}")
    rng = np.random.default_rng(5)
    group = 8 if kind == "depthwise" else 1
    w = rng.standard_normal((8, 1, 3) if kind == "depthwise" else (16, 8, 3)).astype(np.float32)
    b = rng.standard_normal(w.shape[0]).astype(np.float32)
    model = _conv1d_model(w, b, group, relu=True).SerializeToString()
    sess = dynashape.InferenceSession(model)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    counter = C.NATIVE_DW_CONV1D if kind == "depthwise" else C.NATIVE_CONV1D
    before = native.counters().get(counter, 0)
    for batch, length in ((1, 4), (3, 9), (2, 2), (1, 9)):
        x = rng.standard_normal((batch, 8, length)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], atol=1e-5, rtol=1e-5)
    assert native.counters().get(counter, 0) - before == 4
    ops = fused_ops(sess)
    assert ops["com.dynashape.ConvAct"] == 1 and ops["Relu"] == 0, dict(ops)

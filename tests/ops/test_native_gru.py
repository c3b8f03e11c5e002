"""A float32 GRU with the default gates in C on the CPU (ops/csrc/gru.c through ops/rnn.py): against
torch's path (the loop and torch.gru it replaces) and onnxruntime over changing (T, batch) with fresh
random inputs, both candidate forms, every direction, sequence lengths and initial states, threads
giving the same numbers, and its calls counted with the weights laid out once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.ops import native, rnn
from tests.native_report import needs_native

from .harness import recurrent_step_inputs

pytestmark = needs_native("gru")

SHAPES = [(5, 2), (9, 1), (1, 3), (14, 5), (3, 8), (1, 1), (5, 2)]


def _case(seed, direction, i, h, lens, init, lbr, layout=0):
    g = torch.Generator().manual_seed(seed)
    d = 2 if direction == "bidirectional" else 1
    W = torch.randn(d, 3 * h, i, generator=g) * 0.3
    R = torch.randn(d, 3 * h, h, generator=g) * 0.3
    B = torch.randn(d, 6 * h, generator=g) * 0.2

    def run(t, n):
        x, sl, h0, _ = recurrent_step_inputs(g, t, n, i, h, d, lens, init)
        if layout:
            x = x.transpose(0, 1).contiguous()
            h0 = None if h0 is None else h0.transpose(0, 1).contiguous()
        return rnn._gru(x, W, R, B, sl, h0, direction=direction, hidden_size=h, layout=layout,
                        linear_before_reset=lbr)
    return run


def _assert_close(got, want, atol):
    for (t, n), a, b in zip(SHAPES, got, want):
        for name, x, y in zip(("Y", "Y_h"), a, b):
            assert x.shape == y.shape, f"{name} at T={t} N={n}"
            d = (x - y).abs().max().item()
            assert d <= atol, f"{name} at T={t} N={n}: {d}"


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("h", [8, 40])
@pytest.mark.parametrize("lens,init,layout", [(False, False, 0), (True, True, 0), (False, True, 1)])
def test_native_equals_torchs_path(monkeypatch, direction, lbr, h, lens, init, layout):
    outs = []
    for env in ("1", "0"):
        monkeypatch.setenv("DYNASHAPE_NATIVE", env)
        run = _case(h + lbr, direction, 12, h, lens, init, lbr, layout)
        outs.append([run(t, n) for t, n in SHAPES])
    _assert_close(*outs, atol=2e-5)  # float32 sums in another order, sigmoid/tanh within ~2 ulp


def test_counted_and_the_weights_laid_out_once():
    run = _case(0, "bidirectional", 6, 20, True, False, 0)
    before = native.counters().get("gru_native_calls", 0)
    forms = len(rnn._GRU_FORMS)
    for t, n in SHAPES:
        run(t, n)
    assert native.counters()["gru_native_calls"] == before + len(SHAPES)
    assert len(rnn._GRU_FORMS) == forms + 3  # W, R and B, once


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_a_large_layer_goes_to_torchs_kernel_counted(monkeypatch, direction):
    monkeypatch.setattr(rnn, "_GRU_NATIVE_MAX_WORK", 0)
    monkeypatch.setattr(rnn, "_GRU_NATIVE_MAX_WORK_BIDIRECTIONAL", 0)
    run = _case(1, direction, 6, 20, False, True, 1)
    before = native.counters().get("gru_torch_large", 0)
    run(5, 2)
    assert native.counters()["gru_torch_large"] == before + 1


def test_threads_give_the_same_numbers(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    outs = []
    for min_work in (0, 1 << 62):  # every call's directions on two threads / on one
        monkeypatch.setattr(rnn, "_GRU_THREAD_MIN_WORK", min_work)
        run = _case(5, "bidirectional", 12, 40, True, True, 1)
        outs.append([run(t, n) for t, n in SHAPES])
    for a, b in zip(*outs):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


@pytest.mark.parametrize("lbr", [0, 1])
def test_matches_onnxruntime_over_changing_shapes(lbr):
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    import dynashape
    rng = np.random.default_rng(lbr)
    d, i, h = 2, 28, 64
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), nm)
             for nm, s in (("W", (d, 3 * h, i)), ("R", (d, 3 * h, h)), ("B", (d, 6 * h)))]
    node = helper.make_node("GRU", ["X", "W", "R", "B", "lens", "h0"], ["Y", "Y_h"], hidden_size=h,
                            direction="bidirectional", linear_before_reset=lbr)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TP.FLOAT, ["T", "N", i]),
                                            helper.make_tensor_value_info("lens", TP.INT32, ["N"]),
                                            helper.make_tensor_value_info("h0", TP.FLOAT, [d, "N", h])],
                              [helper.make_tensor_value_info(nm, TP.FLOAT, None) for nm in ("Y", "Y_h")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8).SerializeToString()
    sess, ref = dynashape.InferenceSession(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    before = native.counters().get("gru_native_calls", 0)
    points = [(24, 1), (40, 4), (7, 2), (1, 1), (24, 1)]
    for t, n in points:
        f = {"X": rng.standard_normal((t, n, i)).astype(np.float32),
             "lens": rng.integers(1, t + 1, n).astype(np.int32),
             "h0": (0.5 * rng.standard_normal((d, n, h))).astype(np.float32)}
        for g, w in zip(sess.run(None, f), ref.run(None, f)):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    assert native.counters()["gru_native_calls"] == before + len(points)

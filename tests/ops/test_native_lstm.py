"""A float32 LSTM with the default gates in C on the CPU (ops/csrc/lstm.c through ops/rnn.py):
against torch's kernels (the path it replaces) and onnxruntime over changing (T, batch), every
direction, sequence lengths and initial states, with its threads and its other-CPU builds giving
the same numbers, and its calls counted. (tests/ops/test_rnn.py runs the op's ONNX cases against
onnxruntime, through this path on the CPU.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.ops import native, rnn
from tests.native_report import needs_native

from .harness import other_build, recurrent_step_inputs

pytestmark = needs_native("lstm")

SHAPES = [(5, 2), (9, 1), (1, 3), (14, 5), (3, 8), (5, 2)]


def _case(seed, direction, i, h, lens, init, layout=0):
    g = torch.Generator().manual_seed(seed)
    d = 2 if direction == "bidirectional" else 1
    W = torch.randn(d, 4 * h, i, generator=g) * 0.3
    R = torch.randn(d, 4 * h, h, generator=g) * 0.3
    B = torch.randn(d, 8 * h, generator=g) * 0.2

    def run(t, n):
        x, sl, h0, c0 = recurrent_step_inputs(g, t, n, i, h, d, lens, init)
        if layout:
            x = x.transpose(0, 1).contiguous()
            h0 = None if h0 is None else h0.transpose(0, 1).contiguous()
            c0 = None if c0 is None else c0.transpose(0, 1).contiguous()
        return rnn._lstm(x, W, R, B, sl, h0, c0, direction=direction, hidden_size=h, layout=layout)
    return run


def _assert_close(got, want, atol):
    for (t, n), a, b in zip(SHAPES, got, want):
        for name, x, y in zip(("Y", "Y_h", "Y_c"), a, b):
            assert x.shape == y.shape, f"{name} at T={t} N={n}"
            d = (x - y).abs().max().item()
            assert d <= atol, f"{name} at T={t} N={n}: {d}"


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("h", [8, 40, 128])
@pytest.mark.parametrize("lens,init,layout", [(False, False, 0), (True, True, 0), (False, True, 1)])
def test_native_equals_torchs_kernels(monkeypatch, direction, h, lens, init, layout):
    outs = []
    for env in ("1", "0"):
        monkeypatch.setenv("DYNASHAPE_NATIVE", env)
        run = _case(h, direction, 12, h, lens, init, layout)
        outs.append([run(t, n) for t, n in SHAPES])
    _assert_close(*outs, atol=2e-5)  # float32 sums in another order, sigmoid/tanh within ~2 ulp


def test_counted_and_the_weights_laid_out_once():
    run = _case(0, "bidirectional", 6, 20, False, False)
    before = native.counters().get("lstm_native_calls", 0)
    forms = len(rnn._LSTM_FORMS)
    for t, n in SHAPES:
        run(t, n)
    assert native.counters()["lstm_native_calls"] == before + len(SHAPES)
    assert len(rnn._LSTM_FORMS) == forms + 3  # W, R and B, once


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_threads_give_the_same_numbers(monkeypatch, direction):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    outs = []
    for min_work in (0, 1 << 62):  # every call threaded / none
        monkeypatch.setattr(rnn, "_THREAD_MIN_WORK", min_work)
        run = _case(5, direction, 12, 40, True, True)
        outs.append([run(t, n) for t, n in SHAPES])
    for a, b in zip(*outs):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_plain_c_build_gives_the_same_numbers(monkeypatch, tmp_path):
    """The build of a CPU without AVX-512 (multiply and add where this one fuses them): within
    float32 rounding of this CPU's."""
    ref = native.function("lstm", "lstm_f32", "iiiiiiippppppppp")
    fn = other_build("lstm", "lstm_f32", ref, "x86-64", tmp_path)
    outs = []
    for kernel in (ref, fn):
        monkeypatch.setattr(native, "function", lambda *a, k=kernel, **kw: k)
        run = _case(3, "bidirectional", 10, 21, True, True)
        outs.append([run(t, n) for t, n in SHAPES])
    _assert_close(*outs, atol=1e-5)


def test_matches_onnxruntime_at_a_real_size():
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(0)
    d, i, h = 2, 28, 64
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), nm)
             for nm, s in (("W", (d, 4 * h, i)), ("R", (d, 4 * h, h)), ("B", (d, 8 * h)))]
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "lens"], ["Y", "Y_h", "Y_c"], hidden_size=h,
                            direction="bidirectional")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TP.FLOAT, ["T", "N", i]),
                                            helper.make_tensor_value_info("lens", TP.INT32, ["N"])],
                              [helper.make_tensor_value_info(nm, TP.FLOAT, None) for nm in ("Y", "Y_h", "Y_c")],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8).SerializeToString()
    import dynashape
    sess, ref = dynashape.InferenceSession(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    before = native.counters().get("lstm_native_calls", 0)
    for t, n in [(24, 1), (40, 4), (7, 2), (24, 1)]:
        f = {"X": rng.standard_normal((t, n, i)).astype(np.float32),
             "lens": rng.integers(1, t + 1, n).astype(np.int32)}
        for g, w in zip(sess.run(None, f), ref.run(None, f)):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    assert native.counters()["lstm_native_calls"] == before + 4

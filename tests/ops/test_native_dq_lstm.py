"""DynamicQuantizeLSTM's recurrence in C (ops/csrc/dq_lstm.c through ops/native.py) against the torch
loop it replaces and against onnxruntime, over changing (T, batch), with the builds for other CPUs
(AVX2 only, no SIMD) giving the same numbers, and every fallback counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.ops import contrib_rnn, native
from tests.native_report import needs_native

from .harness import other_build, recurrent_step_inputs

pytestmark = needs_native("dq_lstm")

SHAPES = [(5, 2), (9, 1), (1, 3), (14, 5), (3, 8), (5, 2)]


def _weights(g, d, k, h, signed):
    if signed:
        w = torch.randint(-128, 128, (d, k, 4 * h), dtype=torch.int8, generator=g)
        zp = torch.zeros(d, dtype=torch.int8)
    else:
        w = torch.randint(0, 256, (d, k, 4 * h), dtype=torch.uint8, generator=g)
        zp = torch.randint(100, 156, (d,), dtype=torch.uint8, generator=g)
    return w, torch.rand(d, generator=g) * 0.008 + 0.002, zp


def _case(g, direction, i, h, signed, lens, init):
    """A random layer and a runner over (T, N)."""
    d = 2 if direction == "bidirectional" else 1
    W, ws, wz = _weights(g, d, i, h, signed)
    R, rs, rz = _weights(g, d, h, h, signed)
    B = torch.randn(d, 8 * h, generator=g) * 0.2

    def run(t, n):
        x, sl, h0, c0 = recurrent_step_inputs(g, t, n, i, h, d, lens, init)
        return contrib_rnn._dynamic_quantize_lstm(x, W, R, B, sl, h0, c0, None, ws, wz, rs, rz,
                                                  direction=direction, hidden_size=h)
    return run


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("h", [8, 21, 64])
@pytest.mark.parametrize("signed,lens,init", [(True, False, False), (False, True, True), (True, True, False)])
def test_native_equals_torch_loop(monkeypatch, direction, h, signed, lens, init):
    got, want = [], []
    for env, out in (("1", got), ("0", want)):
        monkeypatch.setenv("DYNASHAPE_NATIVE", env)
        run = _case(torch.Generator().manual_seed(h), direction, 12, h, signed, lens, init)
        out += [run(t, n) for t, n in SHAPES]
    flips = 0
    for (t, n), a, b in zip(SHAPES, got, want):
        for name, x, y in zip(("Y", "Y_h", "Y_c"), a, b):
            assert x.shape == y.shape
            # The same integers and float order, and sigmoid / tanh within ~1e-7 of torch's. Such a
            # difference can move a value of h across a rounding boundary of the next step's
            # quantization (one unit of q), which moves that batch entry's later outputs by about
            # h_scale * R_scale * |R|: rare, and confined to one (direction, entry) row of a step.
            d = (x - y).abs()
            off = d > 2e-6
            if off.any():
                assert d.max() < 5e-3, f"{name} at T={t} N={n}: {d.max()}"
                rows = off.reshape(-1, off.shape[-1]).any(-1)
                assert rows.sum() <= max(1, t // 2), f"{name} at T={t} N={n}: {int(rows.sum())} rows differ"
                flips += 1
    assert flips <= 3


def test_counted_and_fallback_on_nonfinite(monkeypatch):
    run = _case(torch.Generator().manual_seed(0), "bidirectional", 6, 8, True, False, False)
    before = native.counters()
    run(4, 2)
    after = native.counters()
    assert after.get("dq_lstm_native_calls", 0) == before.get("dq_lstm_native_calls", 0) + 1
    # a NaN state: the kernel returns, the torch loop gives what the formula gives, counted
    W, ws, wz = _weights(torch.Generator().manual_seed(1), 1, 6, 8, True)
    R, rs, rz = _weights(torch.Generator().manual_seed(2), 1, 8, 8, True)
    h0 = torch.full((1, 2, 8), float("nan"))
    y = contrib_rnn._dynamic_quantize_lstm(torch.randn(3, 2, 6), W, R, None, None, h0, None, None, ws, wz, rs, rz,
                                           hidden_size=8)
    assert native.counters()["dq_lstm_torch_fallbacks"] == after.get("dq_lstm_torch_fallbacks", 0) + 1
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    want = contrib_rnn._dynamic_quantize_lstm(torch.randn(3, 2, 6), W, R, None, None, h0, None, None, ws, wz, rs, rz,
                                              hidden_size=8)
    assert torch.isnan(y[0]).sum() == torch.isnan(want[0]).sum()
    assert native.counters()["dq_lstm_torch_fallbacks"] == after.get("dq_lstm_torch_fallbacks", 0) + 2
    assert native.why("dq_lstm") == "DYNASHAPE_NATIVE=0"


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("int8_layout", [False, True])
def test_other_cpu_builds_give_the_same_numbers(monkeypatch, tmp_path, arch, signed, int8_layout):
    """The AVX2 (vpmaddwd) and plain-C products that other CPUs get, with either layout of int8
    weights (u8 x s8 in groups of 4, or int16 pairs): the same integers as this CPU's build, so
    identical outputs."""
    fn = other_build("dq_lstm", "dq_lstm", contrib_rnn._kernel(), arch, tmp_path)
    outs = {}
    for which, kernel in (("native", contrib_rnn._kernel()), (arch, fn)):
        monkeypatch.setattr(contrib_rnn, "_kernel", lambda k=kernel: k)
        layout = int8_layout if which == arch else bool(native.library("dq_lstm").dq_lstm_int8_weights())
        monkeypatch.setattr(contrib_rnn, "_int8_weights", lambda v=layout: v)
        run = _case(torch.Generator().manual_seed(3), "bidirectional", 10, 21, signed, True, True)
        outs[which] = [run(t, n) for t, n in SHAPES]
    for a, b in zip(outs["native"], outs[arch]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_session_stats_show_the_native_calls():
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    import dynashape
    g = torch.Generator().manual_seed(4)
    W, ws, wz = _weights(g, 1, 6, 8, True)
    R, rs, rz = _weights(g, 1, 8, 8, True)
    inits = [numpy_helper.from_array(t.numpy(), nm) for t, nm in
             ((W, "W"), (R, "R"), (ws, "ws"), (wz, "wz"), (rs, "rs"), (rz, "rz"))]
    node = helper.make_node("DynamicQuantizeLSTM", ["X", "W", "R", "", "", "", "", "", "ws", "wz", "rs", "rz"],
                            ["Y"], domain="com.microsoft", hidden_size=8)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TP.FLOAT, ["T", "N", 6])],
                              [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    sess = dynashape.InferenceSession(model.SerializeToString())
    before = native.counters().get("dq_lstm_native_calls", 0)
    for t, n in SHAPES:
        (y,) = sess.run(None, {"X": np.random.default_rng(t).standard_normal((t, n, 6)).astype(np.float32)})
        assert y.shape == (t, 1, n, 8)
    assert sess.stats()["dq_lstm_native_calls"] == before + len(SHAPES)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_threads_give_the_same_numbers(monkeypatch, direction):
    """Units shared by the threads (one direction) or a direction a thread (two): each thread
    quantizes h itself, so the numbers are those of one thread, bit for bit."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    outs = []
    for min_work in (0, 1 << 62):  # every call threaded / none
        monkeypatch.setattr(contrib_rnn, "_THREAD_MIN_WORK", min_work)
        run = _case(torch.Generator().manual_seed(5), direction, 12, 40, True, True, True)
        outs.append([run(t, n) for t, n in SHAPES])
    for a, b in zip(*outs):
        for x, y in zip(a, b):
            assert torch.equal(x, y)

"""Stateful models whose batch changes between calls: the caller resets the state to the new batch.

Real models (VADs, wake-word and G2P decoders) put LSTM/GRU/Conv inside If branches and feed
their state back. A buffer kept inside a branch body from the earlier batch must never meet the
new one ("output with shape [1, 576] doesn't match the broadcast shape [2, 576]" was the symptom).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tests.ops.harness import DEVICE, run_sequence

F, H = 6, 8


def _init(name, *shape, rng):
    return onnx.numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype(np.float32), name)


def _model() -> onnx.ModelProto:
    """if flag: LSTM over x from (h, c), plus a per-batch bias from a 1x1 Conv of h
    else: GRU over x from h, c passed through a Mul; both return (y_last, h', c')."""
    rng = np.random.default_rng(7)
    inits = [_init("W", 1, 4 * H, F, rng=rng), _init("R", 1, 4 * H, H, rng=rng), _init("B", 1, 8 * H, rng=rng),
             _init("Wg", 1, 3 * H, F, rng=rng), _init("Rg", 1, 3 * H, H, rng=rng),
             _init("K", H, H, 1, rng=rng), _init("half", 1, rng=rng)]
    out = lambda n: helper.make_tensor_value_info(n, TP.FLOAT, None)  # noqa: E731
    then = helper.make_graph([
        helper.make_node("LSTM", ["xt", "W", "R", "B", "", "h", "c"], ["", "h1", "c1"], hidden_size=H),
        # (1, N, H) -> (N, H, 1) -> Conv1d(k=1) -> (N, H, 1) -> (1, N, H): a Conv whose batch is the state's
        helper.make_node("Transpose", ["h1"], ["hT"], perm=[1, 2, 0]),
        helper.make_node("Conv", ["hT", "K"], ["hc"]),
        helper.make_node("Transpose", ["hc"], ["hc1"], perm=[2, 0, 1]),
        helper.make_node("Add", ["h1", "hc1"], ["y_then"]),
        helper.make_node("Identity", ["h1"], ["h_then"]),
        helper.make_node("Identity", ["c1"], ["c_then"]),
    ], "then", [], [out("y_then"), out("h_then"), out("c_then")])
    other = helper.make_graph([
        helper.make_node("GRU", ["xt", "Wg", "Rg", "", "", "h"], ["", "h2"], hidden_size=H, linear_before_reset=1),
        helper.make_node("Tanh", ["h2"], ["y_else"]),
        helper.make_node("Identity", ["h2"], ["h_else"]),
        helper.make_node("Mul", ["c", "half"], ["c_else"]),
    ], "else", [], [out("y_else"), out("h_else"), out("c_else")])
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),  # (N, T, F) -> (T, N, F)
             helper.make_node("If", ["flag"], ["y", "hn", "cn"], then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "stateful", [
        helper.make_tensor_value_info("x", TP.FLOAT, ["N", "T", F]),
        helper.make_tensor_value_info("h", TP.FLOAT, [1, "N", H]),
        helper.make_tensor_value_info("c", TP.FLOAT, [1, "N", H]),
        helper.make_tensor_value_info("flag", TP.BOOL, [])],
        [out("y"), out("hn"), out("cn")], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds():
    """Per batch: a fresh zero... no: a fresh random state, then 3 steps feeding the state back
    (the state fed back is computed here with numpy-free logic: run_sequence compares each step,
    so the steps carry random states of the right batch), alternating branches."""
    rng = np.random.default_rng(0)
    seq = []
    for n, t in [(1, 4), (2, 3), (1, 1), (3, 5), (2, 2), (1, 4)]:
        for k in range(3):
            seq.append({"x": rng.uniform(-1, 1, (n, t, F)).astype(np.float32),
                        "h": rng.uniform(-1, 1, (1, n, H)).astype(np.float32),
                        "c": rng.uniform(-1, 1, (1, n, H)).astype(np.float32),
                        "flag": np.array((n + k) % 2 == 0)})
    return seq


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_if_around_lstm_gru_conv_with_changing_batch(executor):
    run_sequence(_model(), _feeds(), references=("ort",), rtol=1e-4, atol=1e-5, executor=executor)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_state_fed_back_across_batch_resets(executor):
    import onnxruntime as ort

    import dynashape
    m = _model()
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for n in (1, 2, 1, 4, 3):
        h = rng.uniform(-1, 1, (1, n, H)).astype(np.float32)  # the caller resets the state to the new batch
        c = rng.uniform(-1, 1, (1, n, H)).astype(np.float32)
        for k in range(4):
            f = {"x": rng.uniform(-1, 1, (n, 2 + k, F)).astype(np.float32), "h": h, "c": c,
                 "flag": np.array(k % 3 != 2)}
            got, want = sess.run(None, f), ref.run(None, f)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            h, c = got[1], got[2]  # our own state goes back in, as a caller's loop does

"""RNN, GRU, LSTM over sequences of (seq_length, batch) through one session, against onnxruntime.

Only onnxruntime: onnx's ReferenceEvaluator ignores sequence_lens and most activations, so it
cannot check these cases. onnxruntime refuses layout=1 (batch-major): a layout-1 model is checked
against onnxruntime running the same weights at layout 0 on transposed inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dynashape

from .harness import compare, rand, run_sequence

HIDDEN, INPUT = 3, 4
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
N_STATES = {"RNN": 1, "GRU": 1, "LSTM": 2}
DIRS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def rnn_model(op_type, direction="forward", layout=0, opset=14, use=("B",), outputs=("Y", "Y_h", "Y_c"),
              attrs=None):
    """A one-node model; ``use`` names the optional inputs it has (B, sequence_lens, initial_h,
    initial_c, P), absent ones left as "" in between. W, R, B, P are initializers."""
    rng = np.random.default_rng(7)
    d, g = DIRS[direction], GATES[op_type]
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h"] + (["initial_c", "P"] if op_type == "LSTM" else [])
    consts = {"W": rand((d, g * HIDDEN, INPUT), rng=rng), "R": rand((d, g * HIDDEN, HIDDEN), rng=rng),
              "B": rand((d, 2 * g * HIDDEN), rng=rng), "P": rand((d, 3 * HIDDEN), rng=rng)}
    state_dims = ["b", d, HIDDEN] if layout else [d, "b", HIDDEN]
    dyn = {"X": (TensorProto.FLOAT, ["b", "t", INPUT] if layout else ["t", "b", INPUT]),
           "sequence_lens": (TensorProto.INT32, ["b"]),
           "initial_h": (TensorProto.FLOAT, state_dims), "initial_c": (TensorProto.FLOAT, state_dims)}
    node_inputs, graph_inputs, inits = [], [], []
    for n in names:
        if n not in ("X", "W", "R") and n not in use:
            node_inputs.append("")
            continue
        node_inputs.append(n)
        if n in consts:
            inits.append(onnx.numpy_helper.from_array(consts[n], n))
        else:
            graph_inputs.append(helper.make_tensor_value_info(n, *dyn[n]))
    while node_inputs[-1] == "":
        node_inputs.pop()
    outs = list(outputs[:1 + N_STATES[op_type]])
    kw = dict(attrs or {}, hidden_size=HIDDEN, direction=direction)
    if opset >= 14:
        kw["layout"] = layout
    node = helper.make_node(op_type, node_inputs, outs, **kw)
    g_outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o]
    graph = helper.make_graph([node], "rnn", graph_inputs, g_outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def feeds_for(model, steps, layout=0, seed=0):
    """Fresh inputs per (seq_length, batch) step; sequence lengths random in [1, T], one full."""
    rng = np.random.default_rng(seed)
    names = {i.name for i in model.graph.input}
    d = DIRS[helper.get_attribute_value(next(a for a in model.graph.node[0].attribute if a.name == "direction"))
             .decode()]
    seq = []
    for t, b in steps:
        f = {"X": rand((b, t, INPUT) if layout else (t, b, INPUT), rng=rng)}
        if "sequence_lens" in names:
            lens = rng.integers(1, t + 1, size=b).astype(np.int32)
            lens[rng.integers(b)] = t
            f["sequence_lens"] = lens
        for s in ("initial_h", "initial_c"):
            if s in names:
                f[s] = rand((b, d, HIDDEN) if layout else (d, b, HIDDEN), rng=rng)
        seq.append(f)
    return seq


STEPS = [(4, 2), (7, 3), (2, 1), (4, 2), (5, 4)]  # grow, shrink, repeat


def check(op_type, direction, layout=0, steps=STEPS, tol=None, **kw):
    m = rnn_model(op_type, direction, layout, **kw)
    feeds = feeds_for(m, steps, layout)
    tol = tol or {}
    if not layout:
        run_sequence(m, feeds, references=("ort",), **tol)
        return
    m0 = rnn_model(op_type, direction, 0, **kw)  # the same weights (fixed seed), time-major
    ref = ort.InferenceSession(m0.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = dynashape.InferenceSession(m)
    for f in feeds:
        f0 = {k: (v.swapaxes(0, 1) if v.ndim == 3 else v) for k, v in f.items()}
        for got, want in zip(sess.run(None, f), ref.run(None, f0)):
            # Y (T, D, B, H) -> (B, T, D, H); states (D, B, H) -> (B, D, H)
            want = want.transpose(2, 0, 1, 3) if want.ndim == 4 else want.swapaxes(0, 1)
            compare(got, want, f"layout 1, shapes {[v.shape for v in f.values()]}", **tol)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_layouts_sequence_lens(op_type, direction, layout):
    check(op_type, direction, layout, use=("B", "sequence_lens", "initial_h", "initial_c", "P"))


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_minimal_inputs_opset7(op_type):
    check(op_type, "bidirectional", opset=7, use=())


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_optional_outputs(op_type):
    # Y only; then the final state(s) without Y
    check(op_type, "reverse", use=("B", "sequence_lens"), outputs=("Y",))
    check(op_type, "forward", use=("initial_h",), outputs=("", "Y_h", "Y_c"))


@pytest.mark.parametrize("op_type, acts", [
    ("RNN", [("Relu", [], []), ("LeakyRelu", [0.2], [])]),
    ("RNN", [("Elu", [0.7], []), ("Softsign", [], [])]),
    ("RNN", [("Softplus", [], []), ("ThresholdedRelu", [0.3], [])]),
    ("GRU", [("HardSigmoid", [0.3], [0.4]), ("ScaledTanh", [1.5], [0.8]),
             ("Sigmoid", [], []), ("Affine", [0.5], [0.1])]),
    ("LSTM", [("HardSigmoid", [0.25], [0.45]), ("Affine", [0.9], [0.2]), ("Softsign", [], []),
              ("Sigmoid", [], []), ("LeakyRelu", [0.05], []), ("Tanh", [], [])]),
])
def test_activations_with_alpha_beta(op_type, acts):
    attrs = {"activations": [a[0] for a in acts],
             "activation_alpha": [x for a in acts for x in a[1]],
             "activation_beta": [x for a in acts for x in a[2]]}
    attrs = {k: v for k, v in attrs.items() if v}  # an empty list attribute has no type
    check(op_type, "bidirectional", use=("B", "sequence_lens", "initial_h"), attrs=attrs)


@pytest.mark.parametrize("op_type, attrs", [
    ("RNN", {"clip": 0.5}),
    ("GRU", {"clip": 0.7, "linear_before_reset": 1}),
    ("GRU", {"linear_before_reset": 1}),
    ("LSTM", {"clip": 0.6}),
    ("LSTM", {"input_forget": 1}),
])
def test_clip_and_flags(op_type, attrs):
    check(op_type, "bidirectional", use=("B", "sequence_lens", "initial_h", "P"), attrs=attrs)


def test_one_activation_set_for_both_directions():
    # a bidirectional layer given one direction's activations uses them for both
    attrs = {"activations": ["Sigmoid", "Relu"]}
    m = rnn_model("GRU", "bidirectional", use=("B",), attrs=attrs)
    m2 = rnn_model("GRU", "bidirectional", use=("B",), attrs={"activations": ["Sigmoid", "Relu"] * 2})
    feeds = feeds_for(m, STEPS[:2])
    for f in feeds:
        a = dynashape.InferenceSession(m).run(None, f)
        b = dynashape.InferenceSession(m2).run(None, f)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_zero_length_entries(op_type):
    # an entry of length 0: Y all zeros, final states zeros (onnxruntime's convention)
    m = rnn_model(op_type, "bidirectional", use=("B", "sequence_lens", "initial_h", "initial_c"))
    feeds = feeds_for(m, [(5, 4), (3, 2)], seed=3)
    feeds[0]["sequence_lens"] = np.array([0, 3, 5, 1], np.int32)
    feeds[1]["sequence_lens"] = np.array([3, 0], np.int32)
    run_sequence(m, feeds, references=("ort",))


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_torch_kernels_serve_the_common_configuration(op_type, direction, layout, monkeypatch):
    """Default activations, no clip, peepholes or sequence_lens (GRU: linear_before_reset) go to
    torch.lstm / gru / rnn_tanh: short sequences through aten's loop, long ones through oneDNN's."""
    from dynashape.ops import rnn
    # on the CPU a float32 LSTM with these gates goes to csrc/lstm.c (tests/ops/test_native_lstm.py);
    # without it (no compiler, another device) these kernels serve
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    calls = []
    real = rnn._fused
    monkeypatch.setattr(rnn, "_fused", lambda kind, X, *a: calls.append((kind, X.shape)) or real(kind, X, *a))
    attrs = {"linear_before_reset": 1} if op_type == "GRU" else None
    # 40 steps of recurrence in cuDNN's order of operations: a few float32 ulps more than 1e-5
    check(op_type, direction, layout, steps=[(3, 2), (40, 1), (1, 3), (40, 2)], attrs=attrs,
          use=("B", "initial_h", "initial_c"), tol={"atol": 5e-5})
    assert [k for k, _ in calls] == [op_type] * len(calls) and len(calls) >= 4

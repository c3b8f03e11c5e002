"""Padded calls (compile/pad_proof.py, runtime/padded_calls.py): a call's dynamic axes rounded up
to a bucket and its outputs cut back, only where the proof shows that the padding never reaches
the real part of an output. Checked against an unpadded session and onnxruntime on sequences of
changing shapes (fresh random ids, masks with zeros in them); the refusals name the node that
mixes padded positions in. On the device (DYNASHAPE_TEST_DEVICE=cuda) the padded calls replay CUDA
graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.compile.pad_proof import PadProof, prove
from dynashape.compile.shape_program import trace
from dynashape.errors import DynashapeError, OptionsError
from dynashape.runtime import spec_state
from dynashape.runtime.padded_calls import bucket, pad_mode

from ..models.transformers_models import model_path


def _feeds(b, s, rng, vocab=1000, mask=True):
    f = {"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64)}
    if mask:
        m = np.ones((b, s), np.int64)
        m[:, s - s // 3:] = rng.integers(0, 2, (b, s // 3))  # some padding of the user's own
        f["attention_mask"] = m
    return f


def _proof(path, shapes):
    sess = dynashape.InferenceSession(str(path))
    return prove(trace(sess.compiled.graph, shapes, sess.compiled.inputs))


def _sessions(path, device, **kw):
    return (dynashape.InferenceSession(str(path), device=device, pad_inputs="on", **kw),
            dynashape.InferenceSession(str(path), device=device, pad_inputs="off"))


def _to(f, device):
    return {k: torch.from_numpy(v).to(device) for k, v in f.items()}


def test_buckets():
    assert [bucket(v, "pow2") for v in (1, 2, 3, 5, 8, 9, 100, 129)] == [1, 2, 4, 8, 8, 16, 128, 256]
    assert [bucket(v, "half") for v in (1, 2, 3, 5, 7, 9, 13, 100)] == [1, 2, 3, 6, 8, 12, 16, 128]
    assert all(v <= bucket(v, r) < 2 * v or v == 1 for v in range(1, 600) for r in ("pow2", "half"))
    assert all(bucket(v, "half") <= 1.5 * v for v in range(3, 600))


def test_mode():
    assert pad_mode("auto", torch.device("cpu"), "async", "/tmp/c") is False
    assert pad_mode("auto", torch.device("cuda"), "async", "/tmp/c") is True
    assert pad_mode("auto", torch.device("cuda"), "async") is False  # no next process to build them at load
    assert pad_mode("auto", torch.device("cuda"), None, "/tmp/c") is False  # no graphs to buy
    assert pad_mode("on", torch.device("cpu"), None) is True
    with pytest.raises(OptionsError, match="pad_inputs"):
        pad_mode("sometimes", torch.device("cpu"), None)


def test_bert_is_proven_batch_and_seq():
    p = _proof(model_path("bert"), [(3, 9), (3, 9)])
    assert isinstance(p, PadProof), p
    assert p.symbols == ("batch", "seq")
    assert sorted(p.inputs) == [(0, 0, "batch"), (0, 1, "seq"), (1, 0, "batch"), (1, 1, "seq")]
    # last_hidden_state [batch, seq, H] cut on both; the pooler's [batch, H] (the first token) on the batch
    assert p.outputs == [[(0, "batch"), (1, "seq")], [(0, "batch")]]
    assert p.limits == {"seq": 128}  # the guard of its 128 positions: no call is padded past it


def test_bert_padded_calls_match_unpadded_and_onnxruntime(device):
    path = model_path("bert")
    padded, plain = _sessions(path, device)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, s in [(3, 9), (1, 1), (5, 17), (2, 64), (7, 33), (3, 9), (1, 100), (6, 5), (4, 127)]:
        f = _feeds(b, s, rng)
        got = padded.run(None, f)
        want = ref.run(None, f)
        same = plain.run(None, f)
        for g, w, x in zip(got, want, same):
            assert g.shape == w.shape  # the padded rows never reach an output
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-4)
    st = padded.stats()
    assert st["padding"] == "proven"
    assert st["padded_calls"] >= 6  # (3, 9) is padded to (4, 16); (1, 1) is a bucket already
    assert st["real_elements"] < st["padded_elements"]


def test_torch_outputs_are_the_real_rows(device):
    padded, _ = _sessions(model_path("bert"), device)
    rng = np.random.default_rng(1)
    h, pooled = padded.run(None, _to(_feeds(3, 11, rng), device))
    assert tuple(h.shape) == (3, 11, 64) and tuple(pooled.shape) == (3, 64)
    assert h.is_contiguous() and pooled.is_contiguous()
    assert h.device.type == torch.device(device).type


def test_static_impls_serve_padded_buckets(device, monkeypatch):
    """Buckets come back by design: a padded call's region keys are built at their first sight,
    and the next call in the same bucket replays the static impl."""
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")  # builds in ms on the CPU
    path = model_path("bert")
    padded, _ = _sessions(path, device, static_impls="sync")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for b, s in [(3, 9), (4, 13), (3, 16), (2, 10)]:  # all in the bucket (4, 16)
        f = _feeds(b, s, rng)
        for g, w in zip(padded.run(None, f), ref.run(None, f)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    st = padded.stats()
    assert st["padded_calls"] == 4
    assert st["static_builds"] >= 1 and st["static_hits"] >= 3


def test_gpt2_is_refused_by_its_attention():
    """A causal decoder fed no mask: its padded keys are not proven away (the causal mask would do
    it for the real queries, which this proof does not follow), so its calls run unpadded."""
    path = model_path("gpt2")
    p = _proof(path, [(2, 7)])
    assert isinstance(p, str) and ("Attention" in p or "Softmax" in p or "padded axis" in p), p
    padded, plain = _sessions(path, "cpu")
    f = {"input_ids": np.random.default_rng(3).integers(0, 1000, (3, 9)).astype(np.int64)}
    np.testing.assert_allclose(padded.run(None, f)[0], plain.run(None, f)[0], rtol=1e-5, atol=1e-5)
    st = padded.stats()
    assert st["padded_calls"] == 0 and st["padding"] == p


# ---- hand-built graphs: what the proof accepts and refuses ---------------------------------------------------------
def _model(nodes, inits, outputs, inputs=None):
    inputs = inputs or [helper.make_tensor_value_info("ids", TP.INT64, ["B", "S"]),
                        helper.make_tensor_value_info("mask", TP.INT64, ["B", "S"])]
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _t(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _encoder(tail=(), out="y", positions=40):
    """Embeddings (token + position from Range(0, S)), single-head attention written out (MatMul, an
    additive mask (1 - mask) * -10000, Softmax, MatMul), then ``tail`` nodes."""
    rng = np.random.default_rng(0)
    h = 8
    inits = [_t("emb", rng.standard_normal((50, h)).astype(np.float32)),
             _t("pos", rng.standard_normal((positions, h)).astype(np.float32)),
             _t("wq", rng.standard_normal((h, h)).astype(np.float32)),
             _t("wk", rng.standard_normal((h, h)).astype(np.float32)),
             _t("zero", np.array(0, np.int64)), _t("one", np.array(1, np.int64)), _t("onef", np.array(1.0, np.float32)),
             _t("big", np.array(-10000.0, np.float32)), _t("ax1", np.array([1], np.int64)),
             _t("i1", np.array([1], np.int64)), _t("i2", np.array([2], np.int64))]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("Shape", ["ids"], ["shp"]),
        helper.make_node("Gather", ["shp", "one"], ["slen"]),
        helper.make_node("Range", ["zero", "slen", "one"], ["p"]),
        helper.make_node("Gather", ["pos", "p"], ["pe"]),
        helper.make_node("Add", ["e", "pe"], ["x"]),
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Cast", ["mask"], ["mf"], to=TP.FLOAT),
        helper.make_node("Sub", ["onef", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias2"]),
        helper.make_node("Unsqueeze", ["bias2", "ax1"], ["bias"]),
        helper.make_node("Add", ["sc", "bias"], ["scm"]),
        helper.make_node("Softmax", ["scm"], ["pr"], axis=-1),
        helper.make_node("MatMul", ["pr", "x"], ["att"]),
        *tail,
    ]
    outs = [helper.make_tensor_value_info(out, TP.FLOAT, None)]
    return _model(nodes, inits, outs)


def _save(tmp_path, m, name):
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, str(p))
    return p


def test_written_out_attention_under_its_mask_is_proven(tmp_path):
    m = _encoder([helper.make_node("Relu", ["att"], ["y"])])
    path = _save(tmp_path, m, "enc")
    for fusion in (True, False):  # as one Attention node, and as written (MatMul, Add, Softmax, MatMul)
        sess = dynashape.InferenceSession(str(path), fusion=fusion)
        p = prove(trace(sess.compiled.graph, [(2, 7), (2, 7)], sess.compiled.inputs))
        assert isinstance(p, PadProof) and p.symbols == ("B", "S"), p
        assert p.limits == {"S": 40}  # positions looked up in a table of 40
    padded, plain = _sessions(path, "cpu")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for b, s in [(2, 7), (3, 33), (1, 40), (5, 21), (3, 2)]:
        f = {"ids": rng.integers(0, 50, (b, s)).astype(np.int64), "mask": np.ones((b, s), np.int64)}
        f["mask"][:, -1] = 0
        got = padded.run(None, f)[0]
        np.testing.assert_allclose(got, ref.run(None, f)[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got, plain.run(None, f)[0], rtol=1e-4, atol=1e-4)
    st = padded.stats()
    # floors: the batch's 4 (no bound), the sequence's 2 (a 16th of its 40 positions); 33 -> 40, not 64
    assert st["padded_calls"] == 5
    assert st["padded_elements"] == 4 * 8 + 4 * 40 + 4 * 40 + 8 * 32 + 4 * 2


@pytest.mark.parametrize("tail, why, batch_ok", [
    ([helper.make_node("ReduceMean", ["att"], ["y"], axes=[1], keepdims=0)], "ReduceMean", True),  # mean over tokens
    ([helper.make_node("Shape", ["att"], ["sh"]), helper.make_node("Gather", ["sh", "one"], ["n"]),
      helper.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT), helper.make_node("Div", ["att", "nf"], ["y"])],
     "padded size", True),  # data divided by the sequence's length
    ([helper.make_node("CumSum", ["att", "one"], ["y"])], "CumSum", False),  # an op the proof does not follow
])
def test_what_mixes_padded_positions_is_refused(tmp_path, tail, why, batch_ok):
    """The sequence is refused, naming the node; the batch alone is still proven (the tokens of one
    sequence mix, the sequences of a batch do not) and the calls pad only the batch."""
    path = _save(tmp_path, _encoder(tail), "bad")
    sess = dynashape.InferenceSession(str(path))
    t = trace(sess.compiled.graph, [(2, 7), (2, 7)], sess.compiled.inputs)
    p = prove(t, ("S",))
    assert isinstance(p, str) and why in p, p
    p = prove(t)
    if not batch_ok:
        assert isinstance(p, str) and why in p, p
        return
    assert isinstance(p, PadProof) and p.symbols == ("B",), p
    padded, plain = _sessions(path, "cpu")
    rng = np.random.default_rng(5)
    for b, s in [(3, 9), (5, 4)]:
        f = {"ids": rng.integers(0, 50, (b, s)).astype(np.int64), "mask": np.ones((b, s), np.int64)}
        got = padded.run(None, f)[0]
        assert got.shape == plain.run(None, f)[0].shape
        np.testing.assert_allclose(got, plain.run(None, f)[0], rtol=1e-4, atol=1e-4)
    st = padded.stats()
    assert st["padded_calls"] == 2 and st["padded_elements"] == 4 + 8


def test_attention_without_its_mask_is_refused(tmp_path):
    m = _encoder([helper.make_node("Relu", ["att"], ["y"])])
    for n in m.graph.node:  # the scores go to the Softmax unmasked
        if n.op_type == "Softmax":
            n.input[0] = "sc"
    sess = dynashape.InferenceSession(str(_save(tmp_path, m, "nomask")))
    p = prove(trace(sess.compiled.graph, [(2, 7), (2, 7)], sess.compiled.inputs), ("S",))
    assert isinstance(p, str) and ("Softmax" in p or "no mask" in p), p


def test_a_bad_feed_after_padded_calls_leaves_the_session_working(device):
    padded, plain = _sessions(model_path("bert"), device)
    rng = np.random.default_rng(6)
    f = _feeds(3, 9, rng)
    first = padded.run(None, f)[0]
    with pytest.raises(DynashapeError, match="input_ids"):
        padded.run(None, {"input_ids": f["input_ids"].astype(np.float32), "attention_mask": f["attention_mask"]})
    np.testing.assert_allclose(padded.run(None, f)[0], first, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(first, plain.run(None, f)[0], rtol=1e-4, atol=1e-4)


def test_a_bucket_waiting_for_its_graph_runs_its_calls_unpadded(monkeypatch):
    """A bucket is padded at its first sight (that queues its graphs); until they landed its later
    calls run over their real rows, counted."""
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")  # builds in ms on the CPU
    padded, plain = _sessions(model_path("bert"), "cpu", static_impls="sync")
    rng = np.random.default_rng(7)
    landed = []
    real_ready = spec_state.SpecState.ready
    monkeypatch.setattr(spec_state.SpecState, "ready", lambda self, values: landed and real_ready(self, values))
    for b, s in [(3, 9), (2, 10), (4, 13)]:  # one bucket, (4, 16)
        f = _feeds(b, s, rng)
        np.testing.assert_allclose(padded.run(None, f)[0], plain.run(None, f)[0], rtol=1e-4, atol=1e-4)
    st = padded.stats()
    assert st["padded_calls"] == 1 and st["pad_deferred_calls"] == 2
    landed.append(True)  # the sync build at the first sight did land: the next call replays it
    hits = st["static_hits"]
    padded.run(None, _feeds(3, 12, rng))
    st = padded.stats()
    assert st["padded_calls"] == 2 and st["static_hits"] > hits


ZOO = Path(__file__).parents[1] / "zoo" / "exported"


@pytest.mark.parametrize("name, seq", [("bart-encoder", "encoder_sequence_length"),
                                       ("sentence-transformer", "sequence_length")])
def test_exporters_encoders_are_proven_and_padded_calls_match_onnxruntime(name, seq):
    """optimum's exports, not tuned for: BART's encoder (learned positions offset by 2: the sequence
    padded within its table) and a sentence-transformer (mean pooling: a sum of the tokens times
    the mask, over the mask's sum), proven on both axes; padded calls against onnxruntime."""
    path = ZOO / f"{name}.onnx"
    sess = dynashape.InferenceSession(str(path))
    p = prove(trace(sess.compiled.graph, [(3, 5), (3, 5)], sess.compiled.inputs))
    assert isinstance(p, PadProof) and p.symbols == ("batch_size", seq), p
    assert p.limits == {seq: 128}
    padded, plain = _sessions(path, "cpu")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(8)
    for b, s in [(3, 5), (1, 17), (6, 33), (2, 100), (5, 9)]:
        f = _feeds(b, s, rng, vocab=200)  # (within both vocabularies)
        got = padded.run(None, f)
        for g, w, x in zip(got, ref.run(None, f), plain.run(None, f)):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-4)
    assert padded.stats()["padded_calls"] == 5


def test_calls_past_the_cap_run_unpadded_counted(monkeypatch):
    """A call whose padded axes' product would pass DYNASHAPE_PAD_MAX_ELEMENTS runs at its own shape
    (large calls are bound by their kernels, which padding adds to)."""
    monkeypatch.setenv("DYNASHAPE_PAD_MAX_ELEMENTS", "64")
    padded, plain = _sessions(model_path("bert"), "cpu")
    rng = np.random.default_rng(9)
    for b, s in [(3, 9), (5, 17)]:  # (4, 16) = 64 is padded; (8, 32) = 256 is not
        f = _feeds(b, s, rng)
        np.testing.assert_allclose(padded.run(None, f)[0], plain.run(None, f)[0], rtol=1e-4, atol=1e-4)
    st = padded.stats()
    assert st["padded_calls"] == 1 and st["pad_refused_calls"] == 1
    monkeypatch.setenv("DYNASHAPE_PAD_MAX_ELEMENTS", "lots")
    with pytest.raises(OptionsError, match="DYNASHAPE_PAD_MAX_ELEMENTS"):  # at the session's creation
        dynashape.InferenceSession(str(model_path("bert")), pad_inputs="on")


def test_zero_times_an_infinite_fill_is_not_a_zero():
    """A padded mask's 0 times a fill of -inf is NaN, not 0: a sum over the padded axis of it is not
    proven (the absorbing zero holds for finite factors only)."""
    inits = [_t("big", np.array(-np.inf, np.float32)), _t("zf", np.array(0.0, np.float32)),
             _t("emb", np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32))]
    nodes = [helper.make_node("Cast", ["mask"], ["mf"], to=TP.FLOAT),
             helper.make_node("Cast", ["mask"], ["mb"], to=TP.BOOL),
             helper.make_node("Where", ["mb", "zf", "big"], ["bias"]),  # 0 where real, -inf where padded
             helper.make_node("Mul", ["mf", "bias"], ["prod"]),  # padded: 0 * -inf
             helper.make_node("ReduceSum", ["prod", "one"], ["y"], keepdims=0)]
    inits.append(_t("one", np.array([1], np.int64)))
    m = _model(nodes, inits, [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    sess = dynashape.InferenceSession(m.SerializeToString())
    t = trace(sess.compiled.graph, [(2, 7), (2, 7)], sess.compiled.inputs)
    p = prove(t, ("S",))
    assert isinstance(p, str) and "ReduceSum" in p, p

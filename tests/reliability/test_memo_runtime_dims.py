"""Memo data (shape_program ``_memo_data``) makes data computed from shapes alone once per group
of input symbols. A value whose dims a break point binds during the run (a Slice whose ends are
data) has no such group: memo data must step aside there, counted in stats(), and never take
the call down (issue 35: ``AssertionError: memo inputs are group members`` reached the user, on
a five-node model fed (0, 0) first and on a character-embedding Loop)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dynashape
from dynashape.compile import shape_program

VOCAB, EMB = 30, 4


def five_node_model() -> onnx.ModelProto:
    """s = x[:e0, :e1] (ends fed); r = Reshape(s, [-1]); y = s + ConstantOfShape(Shape(s))."""
    inits = [numpy_helper.from_array(np.array([0, 0], np.int64), "starts"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends"], ["s"]),
             helper.make_node("Reshape", ["s", "flat"], ["r"]),
             helper.make_node("Shape", ["s"], ["shp"]),
             helper.make_node("ConstantOfShape", ["shp"], ["c"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Add", ["s", "c"], ["y"])]
    g = helper.make_graph(nodes, "five", [helper.make_tensor_value_info("x", TP.FLOAT, ["a", "b"]),
                                          helper.make_tensor_value_info("ends", TP.INT64, [2])],
                          [helper.make_tensor_value_info("r", TP.FLOAT, ["n"]),
                           helper.make_tensor_value_info("y", TP.FLOAT, ["p", "q"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def char_embedding_model(scan: bool = False) -> onnx.ModelProto:
    """Per word, the max over its characters of the characters' embeddings: a Loop over the
    character positions whose body slices column i of the (words, chars) ids (a Slice whose
    starts and ends are the iteration number: data), gathers the embeddings, scales them by a
    ConstantOfShape of their Shape and folds them into the carried max. ``scan``: the scaled
    embeddings of every position are a scan output too."""
    scan_out = [helper.make_tensor_value_info("char_vec", TP.FLOAT, ["w", EMB])] if scan else []
    table = np.random.default_rng(0).standard_normal((VOCAB, EMB)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["i", "ax0"], ["iu"]),
         helper.make_node("Add", ["iu", "one1"], ["i1"]),
         helper.make_node("Slice", ["chars", "iu", "i1", "ax1"], ["ch"]),  # (words, 1)
         helper.make_node("Gather", ["table", "ch"], ["emb3"], axis=0),  # (words, 1, EMB)
         helper.make_node("ReduceSum", ["emb3", "ax1"], ["emb"], keepdims=0),
         helper.make_node("Shape", ["emb"], ["es"]),
         helper.make_node("ConstantOfShape", ["es"], ["half"],
                          value=numpy_helper.from_array(np.array([0.5], np.float32))),
         helper.make_node("Mul", ["emb", "half"], ["scaled"]),
         helper.make_node("Max", ["acc", "scaled"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"]),
         *([helper.make_node("Identity", ["scaled"], ["char_vec"])] if scan else [])],
        "chars_body",
        [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("cond", TP.BOOL, []),
         helper.make_tensor_value_info("acc", TP.FLOAT, ["w", EMB])],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
         helper.make_tensor_value_info("acc_out", TP.FLOAT, ["w", EMB]), *scan_out])
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.array([1], np.int64), "one1"),
             numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.array([EMB], np.int64), "e")]
    nodes = [helper.make_node("Shape", ["chars"], ["cs"]),
             helper.make_node("Gather", ["cs", "one"], ["n"], axis=0),
             helper.make_node("Slice", ["cs", "ax0", "one1"], ["w"]),
             helper.make_node("Concat", ["w", "e"], ["acc_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["acc_shape"], ["acc0"],
                              value=numpy_helper.from_array(np.array([-1e9], np.float32))),
             helper.make_node("Loop", ["n", "true", "acc0"], ["word_vec", *(["char_vecs"] if scan else [])],
                              body=body)]
    outs = [helper.make_tensor_value_info("word_vec", TP.FLOAT, ["w", EMB])]
    if scan:
        outs.append(helper.make_tensor_value_info("char_vecs", TP.FLOAT, ["c", "w", EMB]))
    g = helper.make_graph(nodes, "char_embedding", [helper.make_tensor_value_info("chars", TP.INT64, ["w", "c"])],
                          outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def _five_feeds(rng, shapes_and_ends):
    return [{"x": rng.standard_normal(shape).astype(np.float32), "ends": np.array(ends, np.int64)}
            for shape, ends in shapes_and_ends]


def _check(model: onnx.ModelProto, feeds_seq: list[dict], sess) -> None:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    evaluator = ReferenceEvaluator(model)
    for step, feeds in enumerate(feeds_seq):
        got = sess.run(None, feeds)
        want = ref.run(None, feeds)
        spec = evaluator.run(None, feeds)
        assert len(got) == len(want) == len(spec)
        for g, w, r in zip(got, want, spec):
            assert g.shape == w.shape == r.shape, (step, g.shape, w.shape, r.shape)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"step {step}")
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6, err_msg=f"step {step}")


def test_five_node_model_fed_empty_first():
    rng = np.random.default_rng(1)
    feeds = _five_feeds(rng, [((0, 0), (3, 3)), ((4, 5), (3, 2)), ((4, 5), (9, 9)), ((0, 3), (2, 2)),
                              ((6, 2), (5, 1)), ((4, 5), (3, 2))])
    sess = dynashape.InferenceSession(five_node_model())
    _check(five_node_model(), feeds, sess)
    assert sess.stats()["memo_data_refused"] >= 1


def test_char_embedding_loop():
    rng = np.random.default_rng(2)
    shapes = [(3, 5), (2, 7), (0, 3), (5, 1), (3, 5), (1, 9)]
    feeds = [{"chars": rng.integers(0, VOCAB, s).astype(np.int64)} for s in shapes]
    sess = dynashape.InferenceSession(char_embedding_model())
    _check(char_embedding_model(), feeds, sess)
    assert sess.stats()["memo_data_refused"] >= 1  # the body's ConstantOfShape of run-time dims


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_char_embedding_loop_over_words_of_no_character(executor):
    """Words of no character: the Loop runs no iteration, and its scan output is (0, words, EMB)
    as onnxruntime gives it (the body's dims, 0 where the graph does not fix one), not (0,), which
    the code after the Loop, traced for rank 3, failed on. (onnx's ReferenceEvaluator cannot
    stack zero iterations: onnxruntime alone is the reference here.)"""
    model = char_embedding_model(scan=True)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = dynashape.InferenceSession(model, executor=executor)
    rng = np.random.default_rng(5)
    for shape in [(3, 5), (4, 0), (2, 7), (1, 0), (3, 5)]:
        feeds = {"chars": rng.integers(0, VOCAB, shape).astype(np.int64)}
        got, want = sess.run(None, feeds), ref.run(None, feeds)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (shape, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=str(shape))


def test_memo_data_still_serves_input_dims():
    """The same ConstantOfShape of an input's own shape is still memo: made once per group."""
    from tests.compile.test_memo_data import bias_model
    sess = dynashape.InferenceSession(bias_model())
    rng = np.random.default_rng(3)
    for n in (3, 5, 3):
        sess.run(None, {"x": rng.standard_normal((3, n, n)).astype(np.float32)})
    assert sess.stats().get("memo_data_refused", 0) == 0
    assert sess.stats()["group_hits"] >= 1


def test_builder_refusal_retraces_without_memo_data(monkeypatch):
    """Where the trace's check misses a case, the code generator's refusal (MemoRefused) makes
    the specialization again without memo data, counted: the call still gets its values."""
    monkeypatch.setattr(shape_program, "_reads_runtime", lambda t, ins: False)
    rng = np.random.default_rng(4)
    feeds = _five_feeds(rng, [((0, 0), (3, 3)), ((4, 5), (3, 2)), ((7, 3), (6, 3))])
    sess = dynashape.InferenceSession(five_node_model())
    _check(five_node_model(), feeds, sess)
    assert sess.stats()["memo_data_refused"] >= 1

"""An If computed from a scalar input (silero-vad's sample rate) decided per value seen
(dynashape/deciding_inputs.py): the model with the input made a constant, the If folded into the
caller's code. Against onnxruntime over changing shapes with fresh random inputs, the other branch
taken when the value changes, one compiled run a call (no body run, nothing rebuilt per call), and
the general model for a later value's first call and where a variant does not apply (counted)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape import deciding_inputs


def _model(big_weight: int = 0):
    """y = If(sr == 16000) then tanh(x @ W1) else sigmoid(x @ W2) * 2; the sample rate as silero's."""
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "W2")
    inits = [w1, w2, numpy_helper.from_array(np.array(16000, np.int64), "k16")]
    if big_weight:
        inits.append(numpy_helper.from_array(np.zeros(big_weight, np.float32), "unused"))

    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TP.FLOAT, None)])
    then_g = branch("then", [helper.make_node("MatMul", ["x", "W1"], ["m1"]),
                             helper.make_node("Tanh", ["m1"], ["t_y"])], "t_y")
    two = helper.make_tensor("two", TP.FLOAT, [], [2.0])
    else_g = branch("else", [helper.make_node("MatMul", ["x", "W2"], ["m2"]),
                             helper.make_node("Sigmoid", ["m2"], ["s2"]),
                             helper.make_node("Constant", [], ["c2"], value=two),
                             helper.make_node("Mul", ["s2", "c2"], ["e_y"])], "e_y")
    nodes = [helper.make_node("Equal", ["sr", "k16"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 6]),
                                       helper.make_tensor_value_info("sr", TP.INT64, [])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_decided_per_value_matches_onnxruntime_and_runs_no_body():
    model = _model()
    sess, ref = dynashape.InferenceSession(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    points = [(1, 16000), (3, 16000), (1, 8000), (5, 8000), (2, 16000), (1, 8000), (4, 16000)]
    runs = 0
    for i, (n, sr) in enumerate(points):
        f = {"x": rng.standard_normal((n, 6)).astype(np.float32), "sr": np.array(sr, np.int64)}
        np.testing.assert_allclose(sess.run(None, f)[0], ref.run(None, f)[0], rtol=1e-6, atol=1e-6)
        st = sess.stats()
        if i == 2:  # 8000's first call: the general model, its If a node running the else branch
            assert st["decided_if_first_sight"] == 1 and st["compiled_runs"] > runs + 1
        else:  # one run a call: the If folded, no branch body runs, nothing rebuilt
            assert st["compiled_runs"] == runs + 1
        runs = st["compiled_runs"]
    assert st["decided_if_runs"] == len(points) - 1
    assert st["decided_if_variants"] == 2  # made once per value, not per call
    assert "interpreter_runs" not in st or st["interpreter_runs"] == 0


def test_more_values_than_variants_run_the_if_as_a_node():
    sess = dynashape.InferenceSession(_model())
    ref = ort.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    values = [16000, 8000, 8000, 1, 1, 2, 2, 3, 3, 16000, 5, 5]
    for sr in values:
        f = {"x": rng.standard_normal((2, 6)).astype(np.float32), "sr": np.array(sr, np.int64)}
        np.testing.assert_allclose(sess.run(None, f)[0], ref.run(None, f)[0], rtol=1e-6, atol=1e-6)
    st = sess.stats()
    assert st["decided_if_variants"] == deciding_inputs.MAX_VALUES  # 16000, 8000, 1, 2
    assert st["decided_if_first_sight"] == 3  # 8000, 1 and 2 ran the general model once each
    assert st["decided_if_refused"] == 4  # 3 and 5, twice each: beyond the four kept


def test_a_feed_of_another_type_gets_the_general_runs_error():
    sess = dynashape.InferenceSession(_model())
    x = np.random.default_rng(2).standard_normal((2, 6)).astype(np.float32)
    try:
        sess.run(None, {"x": x, "sr": np.array(16000.0, np.float32)})
    except dynashape.errors.InputError:
        pass
    else:
        raise AssertionError("a float sample rate was accepted")
    assert sess.stats()["decided_if_general"] == 1


def test_what_does_not_apply():
    assert dynashape.InferenceSession(_model(), decided_ifs=False)._deciders == ()
    import onnx
    big = onnx.load_from_string(_model(big_weight=(deciding_inputs.MAX_MODEL_BYTES >> 2) + 1))
    assert deciding_inputs.deciding_inputs(big) == ()  # weights copied per variant: small models only
    assert deciding_inputs.deciding_inputs(onnx.load_from_string(_model())) == ("sr",)


def test_torch_feeds_take_the_variants_too():
    import torch
    model = _model()
    sess, ref = dynashape.InferenceSession(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for sr in (8000, 16000, 16000, 8000):
        x = rng.standard_normal((3, 6)).astype(np.float32)
        got = sess.run(None, {"x": torch.from_numpy(x), "sr": torch.tensor(sr)})[0]
        want = ref.run(None, {"x": x, "sr": np.array(sr, np.int64)})[0]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    assert sess.stats()["decided_if_runs"] == 3 and sess.stats()["decided_if_variants"] == 2


def test_each_request_runs_its_own_request_of_a_variant():
    model = _model()
    sess, ref = dynashape.InferenceSession(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    reqs = [sess.create_infer_request(), sess.create_infer_request()]
    for i in range(4):
        f = {"x": rng.standard_normal((i + 1, 6)).astype(np.float32), "sr": np.array(8000, np.int64)}
        np.testing.assert_allclose(reqs[i % 2].run(None, f)[0], ref.run(None, f)[0], rtol=1e-6, atol=1e-6)
    for r in reqs:
        st = r.stats()
        assert st["compiled_runs"] == 2 and st["decided_if_runs"] == 2 and st["decided_if_variants"] == 1
        assert len(r._decided_requests) == 1  # one variant, one request of it per request

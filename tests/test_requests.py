"""OpenVINO-style requests: set_tensor/get_tensor/infer, start_async/wait, a busy request refusing
a second caller, AsyncInferQueue, and session.reshape with partial shapes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import AsyncInferQueue, Dimension, PartialShape
from dynashape.errors import InputShapeError, RequestBusyError, UnknownInputError


def model(batch=1):
    g = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["h"]), helper.make_node("Mul", ["h", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [batch, 3])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def x(n, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, (n, 3)).astype(np.float32)


def want(a):
    return np.tanh(a) * a


def test_set_tensor_infer_get_tensor():
    req = dynashape.InferenceSession(model()).create_infer_request()
    a = x(1)
    req.set_tensor("x", a)
    out = req.infer()
    np.testing.assert_allclose(out["y"], want(a), rtol=1e-6)
    np.testing.assert_allclose(req.get_tensor("y"), want(a), rtol=1e-6)
    assert req.get_tensor("x") is a
    with pytest.raises(UnknownInputError):
        req.set_tensor("nope", a)


def test_start_async_wait_and_errors():
    req = dynashape.InferenceSession(model()).create_infer_request()
    a = x(1, 3)
    req.start_async({"x": a})
    req.wait()
    np.testing.assert_allclose(req.results["y"], want(a), rtol=1e-6)
    req.start_async({"x": x(2)})  # batch 2 on a batch-1 model: the error comes out of wait()
    with pytest.raises(InputShapeError):
        req.wait()
    req.start_async({"x": a})
    assert req.wait_for(10_000)
    np.testing.assert_allclose(req.results["y"], want(a), rtol=1e-6)


def test_a_busy_request_refuses_a_second_caller():
    sess = dynashape.InferenceSession(model())
    req = sess.create_infer_request()
    gate, seen = threading.Event(), []
    orig = req._run_checked

    def slow(*args):
        gate.wait(5)
        return orig(*args)

    req._run_checked = slow
    t = threading.Thread(target=lambda: seen.append(req.run(None, {"x": x(1)})))
    t.start()
    while not req._busy.locked():
        pass
    with pytest.raises(RequestBusyError, match="one request per thread"):
        req.run(None, {"x": x(1)})
    gate.set()
    t.join()
    np.testing.assert_allclose(seen[0][0], want(x(1)), rtol=1e-6)
    req._run_checked = orig
    np.testing.assert_allclose(req.run(None, {"x": x(1, 5)})[0], want(x(1, 5)), rtol=1e-6)


def test_async_infer_queue():
    sess = dynashape.InferenceSession(model(), dynamic_dims={"x": [Dimension(1, 8), 3]})
    q = AsyncInferQueue(sess, 3)
    got, lock = {}, threading.Lock()

    def done(request, k):
        with lock:
            got[k] = request.results["y"]

    q.set_callback(done)
    for k in range(12):
        q.start_async({"x": x(1 + k % 8, k)}, k)
    q.wait_all()
    assert sorted(got) == list(range(12))
    for k, y in got.items():
        np.testing.assert_allclose(y, want(x(1 + k % 8, k)), rtol=1e-6)


def test_reshape_with_partial_shapes():
    sess = dynashape.InferenceSession(model())
    req = sess.create_infer_request()
    with pytest.raises(InputShapeError):
        sess.run(None, {"x": x(4)})
    sess.reshape({"x": "[1..8,3]"})
    assert sess.get_inputs()[0].partial_shape == PartialShape("[1..8,3]")
    assert sess.get_outputs()[0].partial_shape == PartialShape("[1..8,3]")
    np.testing.assert_allclose(sess.run(None, {"x": x(4)})[0], want(x(4)), rtol=1e-6)
    np.testing.assert_allclose(req.run(None, {"x": x(6)})[0], want(x(6)), rtol=1e-6)  # made before: follows
    sess.reshape({"x": PartialShape([2, 3])})
    with pytest.raises(InputShapeError):
        sess.run(None, {"x": x(4)})

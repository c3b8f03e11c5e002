"""Shape sequences from hypothesis (in and out of the declared ranges), and threads: one request
per thread, and one session shared by all; every answer checked against onnxruntime, every
refusal typed, and the session right after it."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import Dimension
from dynashape.errors import InputShapeError

N_RANGE, S_RANGE = (1, 6), (1, 9)


def model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Softmax", ["hb"], ["p"], axis=-1), helper.make_node("Mul", ["p", "x"], ["px"]),
             helper.make_node("ReduceSum", ["px", "axes"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "S", 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4])], initializer=[w, b, axes])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


MODEL = model()
DIMS = {"x": [Dimension(*N_RANGE), Dimension(*S_RANGE), 4]}


def reference():
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(MODEL.SerializeToString(), so, providers=["CPUExecutionProvider"])


def feed(n, s, seed):
    return {"x": np.random.default_rng(seed).uniform(-2, 2, (n, s, 4)).astype(np.float32)}


def inside(n, s):
    return N_RANGE[0] <= n <= N_RANGE[1] and S_RANGE[0] <= s <= S_RANGE[1]


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 11)), min_size=1, max_size=8))
def test_shape_sequences(executor, shapes, device):
    sess = dynashape.InferenceSession(MODEL, device=device, executor=executor, dynamic_dims=DIMS)
    ref = reference()
    for k, (n, s) in enumerate(shapes):
        f = feed(n, s, k)
        if not inside(n, s):
            with pytest.raises(InputShapeError, match="outside the declared range"):
                sess.run(None, f)
            continue
        (got,) = sess.run(None, f)
        np.testing.assert_allclose(np.asarray(got), ref.run(None, f)[0], rtol=1e-5, atol=1e-5)


def _worker(run, errors, seed):
    ref = reference()
    rng = np.random.default_rng(seed)
    try:
        for k in range(25):
            n, s = int(rng.integers(1, 7)), int(rng.integers(1, 10))
            f = feed(n, s, seed * 1000 + k)
            (got,) = run(f)
            np.testing.assert_allclose(np.asarray(got), ref.run(None, f)[0], rtol=1e-5, atol=1e-5)
            if k % 7 == 3:  # a bad feed in between: typed, and nothing else disturbed
                try:
                    run(feed(9, 2, k))
                    errors.append(AssertionError("an out-of-range feed ran"))
                except InputShapeError:
                    pass
    except Exception as e:  # noqa: BLE001  reported by the test
        errors.append(e)


@pytest.mark.parametrize("shared", [False, True], ids=["request-per-thread", "one-shared-session"])
def test_threads(shared, device):
    sess = dynashape.InferenceSession(MODEL, device=device, dynamic_dims=DIMS)
    errors: list = []
    threads = []
    for t in range(4):
        if shared:
            def run(f):
                return sess.run(None, f)
        else:
            req = sess.create_infer_request()

            def run(f, req=req):
                return req.run(None, f)
        threads.append(threading.Thread(target=_worker, args=(run, errors, t)))
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors

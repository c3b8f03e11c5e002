"""A feed the session must copy (a read-only broadcast view holds no memory until copied) is
size-checked before the copy: the typed MemoryLimitError naming the input and the limit, not
numpy's own MemoryError (issue 35), and the session keeps working after it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import dynashape
from dynashape.errors import MemoryLimitError
from tests.helpers import add_chain


def _feeds(x: np.ndarray, rng) -> dict:
    return {"x": x, "b": rng.standard_normal((1, x.shape[1])).astype(np.float32)}


def _check_calls(sess, model, rng, shapes) -> None:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in shapes:
        feeds = _feeds(rng.standard_normal(shape).astype(np.float32), rng)
        (got,), (want,) = sess.run(None, feeds), ref.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=str(shape))


def test_a_broadcast_view_of_2_40_elements_is_refused_by_name():
    model = add_chain(shape=("N", "M"))
    sess = dynashape.InferenceSession(model)
    rng = np.random.default_rng(0)
    _check_calls(sess, model, rng, [(2, 3)])
    huge = np.broadcast_to(np.float32(1), (2**20, 2**20))
    with pytest.raises(MemoryLimitError) as info:
        sess.run(None, _feeds(huge, rng))
    msg = str(info.value)
    assert "input 'x'" in msg and "what this machine holds" in msg and str(4 * 2**40) in msg, msg
    assert isinstance(info.value, MemoryError)  # ``except MemoryError`` code keeps working
    _check_calls(sess, model, rng, [(2, 3), (5, 7), (1, 1), (5, 7)])  # the session is unharmed


def test_max_buffer_bytes_bounds_the_copy_of_a_feed():
    model = add_chain(shape=("N", "M"))
    sess = dynashape.InferenceSession(model, max_buffer_bytes=1 << 20)
    rng = np.random.default_rng(1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in [(512, 256), (3, 9), (64, 64)]:  # below the limit: copied, and run
        view = np.broadcast_to(rng.standard_normal((1, shape[1])).astype(np.float32), shape)
        feeds = _feeds(view, rng)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(MemoryLimitError, match=r"input 'x' .*max_buffer_bytes \(1048576 bytes\)"):
        sess.run(None, _feeds(np.broadcast_to(np.float32(2), (1024, 1024)), rng))
    _check_calls(sess, model, rng, [(4, 4), (8, 2)])

"""Bad input gets a typed error naming what was given and expected; the session keeps working."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import Dimension
from dynashape.errors import (
    DynashapeError,
    InputRankError,
    InputShapeError,
    InputTypeError,
    InvalidModelError,
    MissingInputError,
    UnknownInputError,
    UnknownOutputError,
    UnsupportedOpError,
)

from .helpers import add_chain, rand, two_inputs_shared_symbol


@pytest.fixture
def sess():
    return dynashape.InferenceSession(add_chain(2), dynamic_dims={"x": [Dimension(1, 8), 4]})


def good(sess, n=3):
    x, b = rand(n, 4), rand(1, 4)
    (y,) = sess.run(None, {"x": x, "b": b})
    np.testing.assert_array_equal(y, (x + b) + b)  # same float32 order as the two Adds


@pytest.mark.parametrize("feeds, err, words", [
    ({"x": rand(2, 4), "b": rand(1, 4), "z": rand(1)}, UnknownInputError, ["'z'", "['x', 'b']"]),
    ({"x": rand(2, 4)}, MissingInputError, ["['b']"]),
    ({"x": rand(2, 4).astype(np.float64), "b": rand(1, 4)}, InputTypeError, ["'x'", "double", "float"]),
    ({"x": rand(2, 4, 1), "b": rand(1, 4)}, InputRankError, ["'x'", "rank 3", "rank 2"]),
    ({"x": rand(9, 4), "b": rand(1, 4)}, InputShapeError, ["'x'", "axis 0", "9", "[1, 8]"]),
    ({"x": rand(2, 5), "b": rand(1, 4)}, InputShapeError, ["'x'", "axis 1", "5", "[4, 4]"]),
    # a ragged list (a list of numbers is taken as onnxruntime takes it)
    ({"x": [[1.0] * 4, [1.0]], "b": rand(1, 4)}, InputTypeError, ["'x'", "list"]),
])
def test_bad_feeds_then_good_run(sess, feeds, err, words):
    good(sess, 3)
    with pytest.raises(err) as info:
        sess.run(None, feeds)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert isinstance(info.value, DynashapeError)
    good(sess, 3)  # same shape as before the error: the unchanged-shape path
    good(sess, 5)  # and a new shape


def test_unknown_output_name(sess):
    with pytest.raises(UnknownOutputError, match="'nope'"):
        sess.run(["nope"], {"x": rand(2, 4), "b": rand(1, 4)})
    good(sess)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_shared_symbol_that_disagrees_runs_with_one_warning(executor):
    # onnxruntime runs feeds that break a dim name; so do we, warning once, as it computes
    import onnxruntime as ort
    m = two_inputs_shared_symbol()
    s = dynashape.InferenceSession(m, executor=executor)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x, y = rand(4, 3), rand(4, 3)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], x * y)
    with pytest.warns(dynashape.errors.DimensionWarning, match="'batch'") as w:
        for n in (1, 3, 1):
            x, y = rand(n + 1, 3), rand(1, 3)
            np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], ref.run(None, {"x": x, "y": y})[0])
    assert len([r for r in w if issubclass(r.category, dynashape.errors.DimensionWarning)]) == 1
    with pytest.raises(dynashape.errors.ShapeError, match="Mul"):  # 2 vs 4 cannot broadcast
        s.run(None, {"x": rand(2, 3), "y": rand(4, 3)})
    x, y = rand(5, 3), rand(5, 3)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], x * y)


def test_unlinking_that_changes_nothing_raises_instead_of_looping(monkeypatch):
    # if parsing again left the axes linked, the run must give the typed error, not retry forever
    s = dynashape.InferenceSession(two_inputs_shared_symbol())
    monkeypatch.setattr(s, "_load", lambda proto: None)
    with pytest.warns(dynashape.errors.DimensionWarning), \
            pytest.raises(dynashape.errors.SymbolDisagreementError, match="'batch'"):
        s.run(None, {"x": rand(2, 3), "y": rand(1, 3)})


def test_shared_symbol_pinned_by_dim_params_must_agree():
    s = dynashape.InferenceSession(two_inputs_shared_symbol(), dim_params={"batch": Dimension(1, 8)})
    with pytest.raises(InputShapeError, match="'batch'.*dim_params"):
        s.run(None, {"x": rand(2, 3), "y": rand(1, 3)})
    x, y = rand(4, 3), rand(4, 3)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], x * y)


def test_unsupported_op_names_everything():
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_node", domain="com.example")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 3)])
    with pytest.raises(UnsupportedOpError) as info:
        dynashape.InferenceSession(m)
    msg = str(info.value)
    for w in ("'FancyOp'", "'com.example'", "opset 3", "'my_node'", "docs/operators.md"):
        assert w in msg


def test_unsupported_attribute_is_a_load_error():
    node = helper.make_node("Add", ["x", "x"], ["y"], name="add0", weird=3)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    with pytest.raises(UnsupportedOpError, match="weird"):
        dynashape.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_truncated_and_malformed_files(tmp_path):
    data = add_chain(50).SerializeToString()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError):
        dynashape.InferenceSession(str(bad))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\x00 this is not a model" * 10)
    with pytest.raises(InvalidModelError):
        dynashape.InferenceSession(junk)
    with pytest.raises(InvalidModelError, match="does not exist"):
        dynashape.InferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(InvalidModelError):
        dynashape.InferenceSession(b"")
    with pytest.raises(InvalidModelError, match="path, bytes"):
        dynashape.InferenceSession(12345)


def test_every_truncation_point_is_caught(tmp_path):
    """Whatever byte a file is cut at, loading raises InvalidModelError or gives a usable model."""
    data = add_chain(3).SerializeToString()
    for cut in range(1, len(data), max(1, len(data) // 40)):
        try:
            s = dynashape.InferenceSession(data[:cut])
        except InvalidModelError:
            continue
        except DynashapeError as e:  # any other typed error is acceptable too, but not a crash
            assert str(e)
            continue
        assert s.get_outputs()  # parsed to something consistent


def test_undefined_value_reference():
    node = helper.make_node("Add", ["x", "ghost"], ["y"], name="n0")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModelError, match="'ghost'"):
        dynashape.InferenceSession(m.SerializeToString())


def test_runtime_shape_error_names_the_node():
    """Shapes that pass the input checks but clash inside the graph name the node."""
    from dynashape.errors import ShapeError
    node = helper.make_node("Add", ["x", "y"], ["z"], name="the_add")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["A"]),
                                        helper.make_tensor_value_info("y", TP.FLOAT, ["B"])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, None)])
    s = dynashape.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(ShapeError, match="the_add"):
        s.run(None, {"x": rand(3), "y": rand(4)})
    x, y = rand(4), rand(4)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], x + y)


def test_bad_device():
    from dynashape.errors import OptionsError
    with pytest.raises(OptionsError, match="device"):
        dynashape.InferenceSession(add_chain(), device="tpu")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(OptionsError, match="CUDA"):
            dynashape.InferenceSession(add_chain(), device="cuda")


def test_load_sources(tmp_path):
    m = add_chain(2)
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    x, b = rand(3, 4), rand(1, 4)
    for src in (m, m.SerializeToString(), str(p), p):
        y = dynashape.InferenceSession(src).run(None, {"x": x, "b": b})[0]
        np.testing.assert_array_equal(y, (x + b) + b)  # same float32 order as the two Adds


def test_external_data(tmp_path):
    w = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    node = helper.make_node("Add", ["x", "w"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 64])],
                          initializer=[onnx.numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / "ext.onnx"
    onnx.save(m, p, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    assert (tmp_path / "w.bin").stat().st_size == w.nbytes
    x = rand(3, 64)
    np.testing.assert_allclose(dynashape.InferenceSession(p).run(None, {"x": x})[0], x + w, rtol=1e-6)
    (tmp_path / "w.bin").write_bytes(b"12")  # truncated external data
    with pytest.raises(InvalidModelError):
        dynashape.InferenceSession(p)


def test_unsupported_standard_op_is_a_load_error():
    """ImageDecoder is a real ONNX op we do not run (no image codec): refused at load, by name."""
    node = helper.make_node("ImageDecoder", ["x"], ["y"], name="decode")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.UINT8, ["n"])],
                          [helper.make_tensor_value_info("y", TP.UINT8, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(UnsupportedOpError) as info:
        dynashape.InferenceSession(m)
    for w in ("'ImageDecoder'", "opset 20", "'decode'", "docs/operators.md"):
        assert w in str(info.value)

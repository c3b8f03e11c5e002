import numpy as np
import pytest

import dynashape
from dynashape import Dimension, PartialShape
from dynashape.errors import InputShapeError, OptionsError

from .helpers import add_chain, two_inputs_shared_symbol


def shape_of(sess, name):
    return next(a for a in sess.get_inputs() if a.name == name).partial_shape


def test_symbolic_dims_stay_symbols():
    s = dynashape.InferenceSession(two_inputs_shared_symbol())
    x, y = shape_of(s, "x"), shape_of(s, "y")
    assert x[0].symbol == "batch" and x[0].known_equal(y[0])
    assert s.get_inputs()[0].shape == ["batch", 3]


def test_default_dynamic_dim_applies_to_symbolic_dims():
    s = dynashape.InferenceSession(add_chain(), default_dynamic_dim=Dimension(1, 16))
    assert shape_of(s, "x") == PartialShape([Dimension(1, 16), 4])
    assert shape_of(s, "b") == PartialShape([1, 4])  # fixed dims are not touched


def test_dim_params_beat_default():
    s = dynashape.InferenceSession(add_chain(), default_dynamic_dim=Dimension(1, 16),
                                   dim_params={"N": Dimension(2, 6)})
    assert shape_of(s, "x")[0] == Dimension(2, 6)


def test_dynamic_dims_beat_dim_params_but_must_overlap():
    s = dynashape.InferenceSession(add_chain(), dim_params={"N": Dimension(1, 10)},
                                   dynamic_dims={"x": [Dimension(4, 20), 4]})
    assert shape_of(s, "x")[0] == Dimension(4, 10)  # both constraints hold: their intersection
    with pytest.raises(OptionsError, match="do not overlap"):
        dynashape.InferenceSession(add_chain(), dim_params={"N": Dimension(1, 3)},
                                   dynamic_dims={"x": [Dimension(4, 20), 4]})


def test_dynamic_dims_can_make_a_fixed_model_dynamic():
    s = dynashape.InferenceSession(add_chain(shape=(2, 4)), dynamic_dims={"x": [Dimension(1, 8), 4]})
    assert shape_of(s, "x") == PartialShape([Dimension(1, 8), 4])
    out = s.run(None, {"x": np.ones((5, 4), np.float32) * 0.5, "b": np.ones((1, 4), np.float32)})[0]
    assert out.shape == (5, 4)


@pytest.mark.parametrize("opts, match", [
    ({"dynamic_dims": {"nope": [1, 4]}}, "does not have"),
    ({"dynamic_dims": {"x": [1, 2, 3]}}, "rank"),
    ({"dynamic_dims": {"x": [Dimension(1, 4), 5]}}, "fixes it to 4"),
    ({"dim_params": {"Q": Dimension(1, 2)}}, "no input uses"),
    ({"dim_params": {"N": "big"}}, "malformed"),
    ({"bogus_option": 1}, "unknown option"),
])
def test_contradictory_or_malformed_options(opts, match):
    with pytest.raises(OptionsError, match=match):
        dynashape.InferenceSession(add_chain(), **opts)


def test_shared_symbol_gets_one_range():
    s = dynashape.InferenceSession(two_inputs_shared_symbol(), dynamic_dims={"x": [Dimension(1, 4), 3]})
    assert shape_of(s, "y")[0] == Dimension(1, 4)  # y shares "batch", so it inherits x's range
    with pytest.raises(InputShapeError, match="outside the declared range"):
        s.run(None, {"x": np.ones((2, 3), np.float32), "y": np.ones((5, 3), np.float32)})


def test_disjoint_symbol_ranges_are_an_error():
    with pytest.raises(OptionsError, match="symbol 'batch'"):
        dynashape.InferenceSession(two_inputs_shared_symbol(),
                                   dynamic_dims={"x": [Dimension(1, 2), 3], "y": [Dimension(5, 9), 3]})


@pytest.mark.parametrize("placeholder", ["?", "unk__7", "-1", "None"])
def test_placeholder_dim_names_mean_unknown_not_equal(placeholder):
    # PaddleOCR names every dynamic axis '?', tf2onnx writes 'unk__N': those axes are independent.
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [placeholder, 3, placeholder, placeholder])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = dynashape.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(0)
    for shape in [(2, 3, 48, 192), (1, 3, 32, 100), (3, 3, 48, 48)]:
        a = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(s.run(None, {"x": a})[0], np.maximum(a, 0))

"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime and the onnx reference;
the ai.onnx.preview.training optimizers against the reference; the random generators by their
properties (shape, dtype, range, statistics, determinism of a seed), each over a sequence of
shapes through one session."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dynashape
from tests.helpers import assert_binomial, assert_moments

from .harness import DEVICE, make_model, rand, run_sequence

RNG = np.random.default_rng(7)
# (N, C, d1, ...): grow, shrink, change rank of nothing but sizes, repeat
LOSS_SEQ = {
    2: [(3, 5), (6, 4), (2, 7), (3, 5), (1, 3)],
    3: [(2, 4, 3), (3, 6, 5), (1, 3, 2), (2, 4, 3), (4, 5, 1)],
    5: [(2, 3, 2, 3, 2), (1, 4, 3, 2, 2), (2, 2, 1, 1, 4), (2, 3, 2, 3, 2), (3, 5, 2, 2, 1)],
}


def _loss_feeds(shapes, ignore_index=None, with_weight=False, dtype=np.float32, tdtype=np.int64):
    feeds = []
    for shape in shapes:
        n, c, rest = shape[0], shape[1], shape[2:]
        target = RNG.integers(0, c, size=(n, *rest)).astype(tdtype)
        if ignore_index is not None:
            target[RNG.random(target.shape) < 0.3] = ignore_index
            target.reshape(-1)[0] = 0  # at least one kept element, so that the mean is defined
        f = {"in0": rand(shape, dtype, RNG), "in1": target}
        if with_weight:
            f["in2"] = rand((c,), dtype, RNG, low=0.1, high=2.0)
        feeds.append(f)
    return feeds


def _loss_model(op_type, rank, attrs, with_weight, n_outputs=1, elem=TensorProto.FLOAT, telem=TensorProto.INT64,
                opset=13):
    n_in = 3 if with_weight else 2
    return make_model(op_type, n_in, [elem, telem, elem][:n_in], attrs, opset=opset, n_outputs=n_outputs,
                      ranks=[rank, rank - 1, 1][:n_in])


LOSS_CASES = [
    # (reduction, ignore_index, with_weight, rank)
    ("mean", None, False, 2),
    ("mean", None, True, 3),
    ("sum", None, True, 2),
    ("none", None, False, 5),
    ("mean", 1, True, 3),
    ("mean", -5, True, 5),
    ("sum", -1, False, 3),
    ("none", -1, True, 2),
    ("mean", 2, False, 3),
    ("sum", 100, True, 3),  # an ignore_index no class has, present in the targets
]


@pytest.mark.parametrize("reduction, ii, with_weight, rank", LOSS_CASES)
def test_negative_log_likelihood_loss(reduction, ii, with_weight, rank):
    attrs = {"reduction": reduction} | ({} if ii is None else {"ignore_index": ii})
    model = _loss_model("NegativeLogLikelihoodLoss", rank, attrs, with_weight)
    run_sequence(model, _loss_feeds(LOSS_SEQ[rank], ii, with_weight))


@pytest.mark.parametrize("reduction, ii, with_weight, rank", LOSS_CASES)
@pytest.mark.parametrize("log_prob", [False, True])
def test_softmax_cross_entropy_loss(reduction, ii, with_weight, rank, log_prob):
    attrs = {"reduction": reduction} | ({} if ii is None else {"ignore_index": ii})
    model = _loss_model("SoftmaxCrossEntropyLoss", rank, attrs, with_weight, n_outputs=2 if log_prob else 1)
    run_sequence(model, _loss_feeds(LOSS_SEQ[rank], ii, with_weight))


def test_losses_double_and_int32_targets():
    for op_type in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
        model = _loss_model(op_type, 3, {"reduction": "mean", "ignore_index": 0}, True, elem=TensorProto.DOUBLE,
                            telem=TensorProto.INT32, opset=12)
        feeds = _loss_feeds(LOSS_SEQ[3], None, True, np.float64, np.int32)
        for f in feeds:  # ignore class 0 but keep one element of another class
            f["in1"].reshape(-1)[0] = 1
        run_sequence(model, feeds)


def test_mean_without_weight_ignores_negative_index():
    # onnx's reference evaluator divides by every element (ignored ones too) when ignore_index is
    # -1 and there is no weight; the spec and onnxruntime divide by the kept ones
    model = _loss_model("NegativeLogLikelihoodLoss", 3, {"ignore_index": -1}, False)
    run_sequence(model, _loss_feeds(LOSS_SEQ[3], -1, False), references=("ort",))


def test_loss_float16():
    model = _loss_model("SoftmaxCrossEntropyLoss", 3, {"reduction": "mean"}, True, n_outputs=2,
                        elem=TensorProto.FLOAT16)
    run_sequence(model, _loss_feeds(LOSS_SEQ[3], None, True, np.float16), references=("ort",), rtol=2e-3, atol=2e-3)


def test_loss_bad_reduction():
    model = _loss_model("NegativeLogLikelihoodLoss", 2, {"reduction": "avg"}, False)
    with pytest.raises(dynashape.errors.DynashapeError, match="reduction"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, _loss_feeds([(2, 3)])[0])


# optimizers (onnxruntime's CPU build lacks the ai.onnx.preview.training ops: the reference only)
TRAINING = "ai.onnx.preview.training"
OPT_SEQ = [[(3, 4), (5,)], [(6, 2), (2,)], [(1, 1), (7,)], [(3, 4), (5,)], [(2, 5), (3,)]]


def _optimizer_model(op_type, groups, attrs, n=2):
    """Inputs R, T, then n tensors per group (X, G, then the states), outputs n per group but G."""
    names = ["R", "T"] + [f"{k}{i}" for k in groups for i in range(n)]
    inputs = [helper.make_tensor_value_info("R", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [helper.make_tensor_value_info(nm, TensorProto.FLOAT, [f"{nm}_{d}" for d in range(2 - nm.endswith("1"))])
               for nm in names[2:]]  # tensor 0 is 2-D, tensor 1 is 1-D
    outs = [f"{k}{i}_new" for k in groups.replace("G", "") for i in range(n)]
    node = helper.make_node(op_type, names, outs, domain=TRAINING, **attrs)
    g = helper.make_graph([node], op_type, inputs,
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)],
                             ir_version=8)


def _optimizer_feeds(groups, t_values):
    feeds = []
    for (s0, s1), t in zip(OPT_SEQ, t_values):
        f = {"R": np.array(RNG.uniform(0.01, 0.5), np.float32), "T": np.array(t, np.int64)}
        for k in groups:
            low = 0.1 if k == "H" else -2.0  # squared-gradient accumulators are positive
            f[f"{k}0"], f[f"{k}1"] = rand(s0, np.float32, RNG, low=low), rand(s1, np.float32, RNG, low=low)
        feeds.append(f)
    return feeds


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum(mode):
    model = _optimizer_model("Momentum", "XGV", {"alpha": 0.9, "beta": 0.1, "mode": mode, "norm_coefficient": 0.01})
    run_sequence(model, _optimizer_feeds("XGV", [0, 3, 1, 0, 7]), references=("ref",))


def test_adagrad():
    model = _optimizer_model("Adagrad", "XGH", {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001})
    run_sequence(model, _optimizer_feeds("XGH", [0, 3, 1, 0, 7]), references=("ref",))


def test_adam():
    model = _optimizer_model("Adam", "XGVH", {"alpha": 0.8, "beta": 0.95, "epsilon": 1e-4, "norm_coefficient": 0.01,
                                         "norm_coefficient_post": 0.02})
    run_sequence(model, _optimizer_feeds("XGVH", [0, 3, 1, 0, 7]), references=("ref",), rtol=1e-4, atol=1e-5)


# random generators: no reference can match the draws; check what is defined
def _session(model):
    return dynashape.InferenceSession(model, device=DEVICE)


def _generator_model(op_type, attrs):
    node = helper.make_node(op_type, [], ["y"], **attrs)
    g = helper.make_graph([node], op_type, [], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def test_random_uniform_and_normal():
    shape = [40, 50]
    y = _session(_generator_model("RandomUniform", {"shape": shape, "low": -3.0, "high": 5.0,
                                                     "dtype": TensorProto.DOUBLE})).run(None, {})[0]
    assert y.shape == tuple(shape) and y.dtype == np.float64
    # uniform on [-3, 5): mean 1, variance 8^2 / 12, fourth central moment 8^4 / 80
    assert y.min() >= -3.0 and y.max() < 5.0
    assert_moments(y, 1.0, 64 / 12, 8 ** 4 / 80, "RandomUniform [-3, 5)")
    sess = _session(_generator_model("RandomNormal", {"shape": shape, "mean": 2.0, "scale": 0.5}))
    a, b = sess.run(None, {})[0], sess.run(None, {})[0]
    assert a.shape == tuple(shape) and a.dtype == np.float32
    assert_moments(a, 2.0, 0.25, 3 * 0.25 ** 2, "RandomNormal(2, 0.5)")  # normal: mu4 = 3 sigma^4
    assert not np.array_equal(a, b)  # no seed: a new draw on every run


def test_random_seed_repeats_the_draw():
    for op_type in ("RandomUniform", "RandomNormal"):
        sess = _session(_generator_model(op_type, {"shape": [7, 3], "seed": 3.0}))
        a, b = sess.run(None, {})[0], sess.run(None, {})[0]
        np.testing.assert_array_equal(a, b)
        c = _session(_generator_model(op_type, {"shape": [7, 3], "seed": 4.0})).run(None, {})[0]
        assert not np.array_equal(a, c)


@pytest.mark.parametrize("op_type", ["RandomUniformLike", "RandomNormalLike"])
def test_random_like_follows_input(op_type):
    model = make_model(op_type, 1, [TensorProto.FLOAT16], {"seed": 1.0}, opset=17, ranks=[2])
    sess = _session(model)
    for shape in [(30, 20), (50, 40), (3, 1), (30, 20)]:
        y = sess.run(None, {"in0": rand(shape, np.float16, RNG)})[0]
        assert y.shape == shape and y.dtype == np.float16  # dtype: the input's
    # the defaults: uniform on [0, 1) (float16 rounds the draws near 1 up to 1), normal(0, 1)
    if op_type == "RandomUniformLike":
        assert y.min() >= 0 and y.max() <= 1
        assert_moments(y, 0.5, 1 / 12, 1 / 80, op_type)
    else:
        assert_moments(y, 0.0, 1.0, 3.0, op_type)
    model = make_model(op_type, 1, [TensorProto.INT32], {"dtype": TensorProto.DOUBLE}, opset=17, ranks=[3])
    sess = _session(model)
    for shape in [(2, 3, 4), (5, 1, 2), (2, 3, 4)]:
        y = sess.run(None, {"in0": rand(shape, np.int32, RNG)})[0]
        assert y.shape == shape and y.dtype == np.float64


def test_bernoulli():
    model = make_model("Bernoulli", 1, [TensorProto.FLOAT], {}, opset=15, ranks=[2])
    sess = _session(model)
    for shape in [(4, 5), (9, 2), (1, 3), (4, 5)]:
        p = RNG.integers(0, 2, size=shape).astype(np.float32)  # p of 0 or 1: the draw is certain
        y = sess.run(None, {"in0": p})[0]
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, p)
    y = sess.run(None, {"in0": np.full((200, 100), 0.3, np.float32)})[0]
    assert np.isin(y, (0, 1)).all()
    assert_binomial(int(y.sum()), y.size, 0.3, "Bernoulli(0.3)")
    model = make_model("Bernoulli", 1, [TensorProto.DOUBLE], {"dtype": TensorProto.BOOL, "seed": 5.0}, opset=15,
                       ranks=[1])
    sess = _session(model)
    p = RNG.uniform(0, 1, 64)
    a, b = sess.run(None, {"in0": p})[0], sess.run(None, {"in0": p})[0]
    assert a.dtype == np.bool_
    np.testing.assert_array_equal(a, b)

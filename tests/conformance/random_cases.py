"""The properties of the node suite's random-output cases (Bernoulli, training-mode Dropout).

Their expected data come from numpy's generators, which no other generator reproduces, so the
values cannot be compared. What the spec defines is checked instead, on the case's own data (the
shapes and types of its expected outputs, the support of every value) and on the case's model
with its dims made dynamic, fed a large tensor: the rate of the draws against the binomial
(tests/helpers.py: assert_binomial), Dropout's scaling to the bit (the arithmetic onnxruntime
does, checked on onnxruntime's own output too), its mask against its output, its ratio input, its
training_mode input, and what the seed attribute promises.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import numpy_helper

import dynashape
from tests.helpers import assert_binomial

N = 1 << 18  # elements of the large feeds: the binomial's 6 sigma is ~0.6% of N at p = 0.5


def check_random_case(case, device: str) -> None:
    """Check what the spec defines for a random-output case; a case with no checker fails."""
    if case.name.startswith("test_bernoulli"):
        _check_bernoulli(case, device)
    elif case.name.startswith("test_training_dropout"):
        _check_training_dropout(case, device)
    else:
        raise AssertionError(f"{case.name} is listed as random but has no property check: write one")


# shared -------------------------------------------------------------------------------------------
def _arrays(values) -> list:
    return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in values]


def _run_own_data(case, device: str) -> list[tuple[list, list]]:
    """Each data set's inputs and outputs, through the backend as run_case runs them, with every
    output of the expected shape and type."""
    from dynashape.backend import DynashapeBackend

    rep = DynashapeBackend.prepare(case.model, device)
    runs = []
    for inputs, refs in case.data_sets:
        inputs, refs = _arrays(inputs), _arrays(refs)
        outs = [np.asarray(o) for o in rep.run(inputs)]
        assert len(outs) == len(refs), f"{len(outs)} outputs, {len(refs)} expected"
        for k, (o, r) in enumerate(zip(outs, refs)):
            assert o.shape == r.shape and o.dtype == r.dtype, \
                f"output {k}: {o.dtype}{list(o.shape)}, expected {r.dtype}{list(r.shape)}"
        runs.append((inputs, outs))
    return runs


def _dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every dim of its inputs and outputs symbolic, so large tensors can be fed."""
    m = copy.deepcopy(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        for k, d in enumerate(vi.type.tensor_type.shape.dim):
            d.Clear()
            d.dim_param = f"{vi.name}_{k}"
    return m


def _seed(model: onnx.ModelProto) -> float | int | None:
    """The seed attribute of the model's random node (the expanded cases' RandomUniformLike; a
    float for the random ops, an int for Dropout)."""
    for node in model.graph.node:
        for a in node.attribute:
            if a.name == "seed":
                return onnx.helper.get_attribute_value(a)
    return None


def _session(model, device):
    return dynashape.InferenceSession(model, device=device)


def _check_seed(model, device, feeds: dict, what: str) -> None:
    """With a seed, two new sessions draw the same values (onnxruntime and the reference evaluator
    agree on that much), and so do two calls of one session (ops/training.py: the generator is
    seeded at every call, as the reference evaluator does). Without one, two sessions drawing N
    values draw differently."""
    sess = _session(model, device)
    first, other = sess.run(None, feeds), _session(model, device).run(None, feeds)
    if _seed(model) is not None:
        for a, b, c in zip(first, other, sess.run(None, feeds)):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: seeded, but a new session draws differently")
            np.testing.assert_array_equal(a, c, err_msg=f"{what}: seeded, but a second call draws differently")
        return
    assert any(not np.array_equal(a, b) for a, b in zip(first, other)), \
        f"{what}: no seed, yet two sessions drew the same {N} values"


# Bernoulli ----------------------------------------------------------------------------------------
def _draws_below(model: onnx.ModelProto) -> bool:
    """Whether a draw is 1 where u < p (the Bernoulli op), or where u > p: the _expanded cases run
    onnx's function body for Bernoulli, which is Greater(X_random, input) (onnx 1.23,
    defs/generator/defs.cc), so their ones come with probability 1 - p. The reference evaluator
    runs it so too; a runtime must run the graph it is given, and the check follows that graph."""
    ops = {n.op_type: n for n in model.graph.node}
    if "Bernoulli" in ops:
        return True
    return ops["Greater"].input[0] != ops["RandomUniformLike"].output[0]


def _check_bernoulli(case, device: str) -> None:
    for _, (y,) in _run_own_data(case, device):
        assert np.isin(y, (0, 1)).all(), f"draws outside {{0, 1}}: {y}"
    model = _dynamic(case.model)
    p_type = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    below = _draws_below(model)
    levels = (0.0, 0.2, 0.5, 0.9, 1.0)  # blocks of N / 8 draws each, at these probabilities
    block = N // 8
    p = np.repeat(np.array(levels, p_type), block)
    sess = _session(model, device)
    (y,) = sess.run(None, {"x": p})
    assert y.shape == p.shape and np.isin(y, (0, 1)).all()
    for i, level in enumerate(levels):
        ones = int(np.count_nonzero(y[i * block:(i + 1) * block]))
        q = level if below else 1.0 - level  # the probability of a one
        what = f"{case.name}: ones at p = {level} (probability {q})"
        if q == 0.0:  # u < 0 or u > 1: never, u being in [0, 1)
            assert ones == 0, f"{what}: {ones} of {block}"
        elif q == 1.0 and below:  # u < 1: always
            assert ones == block, f"{what}: {ones} of {block}"
        elif q == 1.0:  # u > 0: all but the draws of exactly 0 (2^-24 each for float32: ~0.002 here)
            assert ones >= block - 3, f"{what}: {ones} of {block}"
        else:
            assert_binomial(ones, block, q, what)
    _check_seed(model, device, {"x": p}, case.name)


# Dropout in training mode --------------------------------------------------------------------------
def _scaled(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """x / (1 - ratio) as onnxruntime computes it: 1 - ratio in the ratio's type, the division in
    x's type (float32 for float16)."""
    wide = np.float32 if x.dtype == np.float16 else x.dtype
    return (x.astype(wide) / (np.asarray(1, r.dtype) - r).astype(wide)).astype(x.dtype)


def _check_dropout_output(x, r, outs, what: str) -> np.ndarray:
    """Every value is 0 (dropped) or x / (1 - ratio) to the bit (kept), and the mask, where the
    model outputs one, says which; x has no zeros. Returns the kept positions."""
    y = outs[0]
    kept = y != 0
    want = _scaled(x, r)
    np.testing.assert_array_equal(y[kept], want[kept], err_msg=f"{what}: kept values are not x / (1 - ratio)")
    if len(outs) > 1:
        assert outs[1].dtype == np.bool_, f"{what}: mask of type {outs[1].dtype}"
        np.testing.assert_array_equal(outs[1], kept, err_msg=f"{what}: the mask disagrees with the output")
    return kept


def _check_training_dropout(case, device: str) -> None:
    for (x, r, t), outs in _run_own_data(case, device):
        assert t and (x != 0).all()
        _check_dropout_output(x, r, outs, f"{case.name} on its own data")
    model = _dynamic(case.model)
    case_ratio = _arrays(case.data_sets[0][0])[1]
    rng = np.random.default_rng(35)
    x = (rng.uniform(0.5, 2.0, N) * rng.choice((-1.0, 1.0), N)).astype(np.float32).reshape(64, 64, 64)
    sess = _session(model, device)
    ort_sess = _ort(model)
    for ratio in sorted({0.0, 0.1, 0.3, float(case_ratio), 0.9}):
        r = np.array(ratio, case_ratio.dtype)
        feeds = {"x": x, "r": r, "t": np.array(True)}
        what = f"{case.name} at ratio {ratio}"
        outs = sess.run(None, feeds)
        kept = _check_dropout_output(x, r, outs, what)
        if ratio == 0.0:  # nothing dropped: the identity, every mask value true
            np.testing.assert_array_equal(outs[0], x, err_msg=what)
        else:
            assert_binomial(N - int(np.count_nonzero(kept)), N, float(r), f"{what}: dropped")
        if ort_sess is not None:  # the expected scaling is onnxruntime's arithmetic: check it there too
            _check_dropout_output(x, r, ort_sess.run(None, feeds), f"{what}, onnxruntime")
        if ratio == float(case_ratio):
            _check_seed(model, device, feeds, what)
    # training_mode false: the identity whatever the ratio
    outs = sess.run(None, {"x": x, "r": case_ratio, "t": np.array(False)})
    np.testing.assert_array_equal(outs[0], x, err_msg=f"{case.name}: training_mode false")
    if len(outs) > 1:
        assert outs[1].all(), f"{case.name}: training_mode false drops values"


def _ort(model):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

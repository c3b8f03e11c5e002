"""ONNX-ML ops (ops/ml.py) over sequences of shapes in one session, against onnxruntime and the
ONNX reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynashape

from .harness import DEVICE, rand, run_sequence

F32, F64, I64, STR = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.STRING
ML = "ai.onnx.ml"


def model(op_type, in_types, out_types, attrs=None, ml_opset=1, ranks=None):
    """One ai.onnx.ml node; inputs have dynamic dims (unknown rank unless ``ranks``)."""
    ins = [helper.make_tensor_value_info(f"in{i}", t, None if ranks is None else [f"d{i}_{k}" for k in range(ranks[i])])
           for i, t in enumerate(in_types)]
    outs = [helper.make_tensor_value_info(f"out{k}", t, None) for k, t in enumerate(out_types)]
    node = helper.make_node(op_type, [i.name for i in ins], [o.name for o in outs], domain=ML, **(attrs or {}))
    g = helper.make_graph([node], op_type.lower(), ins, outs)
    imports = [helper.make_opsetid("", 19), helper.make_opsetid(ML, ml_opset)]
    return helper.make_model(g, opset_imports=imports, ir_version=9)


def run_against_ref_text(m, feeds_seq):
    """For string outputs, which the reference evaluator returns as numpy str_ arrays (the
    harness wants the object dtype): one session over the sequence, compared value by value."""
    from onnx.reference import ReferenceEvaluator
    sess, ref = dynashape.InferenceSession(m, device=DEVICE), ReferenceEvaluator(m)
    for feeds in feeds_seq:
        got, want = sess.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert got.dtype == object and got.shape == want.shape and got.tolist() == want.tolist(), (got, want)


def strings(values) -> np.ndarray:
    a = np.empty(len(values), dtype=object)
    a[:] = list(values)
    return a


# ---- LabelEncoder ---------------------------------------------------------------------------------
def test_label_encoder_v2_string_to_int():
    rng = np.random.default_rng(0)
    vocab = strings(["a", "b", "c", "zz", "q"])
    m = model("LabelEncoder", [STR], [I64], {"keys_strings": ["a", "b", "c"], "values_int64s": [5, 6, 7],
                                             "default_int64": 42}, ml_opset=2)
    run_sequence(m, [{"in0": rng.choice(vocab, s)} for s in [(5,), (2, 3), (7,), (1, 1, 4)]])


def test_label_encoder_v2_int_to_string():
    rng = np.random.default_rng(1)
    m = model("LabelEncoder", [I64], [STR], {"keys_int64s": [1, 3, 5], "values_strings": ["one", "three", "five"],
                                             "default_string": "?"}, ml_opset=2)
    feeds = [{"in0": rng.integers(0, 7, s)} for s in [(6,), (3, 2), (9,)]]
    run_sequence(m, feeds, references=("ort",))
    run_against_ref_text(m, feeds)


def test_label_encoder_repeated_key():
    # the spec: a repeated key maps to its last value; onnxruntime keeps the first: reference only
    rng = np.random.default_rng(6)
    m = model("LabelEncoder", [I64], [I64], {"keys_int64s": [1, 3, 1], "values_int64s": [10, 30, 11]}, ml_opset=2)
    run_sequence(m, [{"in0": rng.integers(0, 4, s)} for s in [(6,), (3, 2), (9,)]], references=("ref",))


def test_label_encoder_float_nan_key():
    # A NaN key matches any NaN input (spec of opset 4). Neither reference does it (onnxruntime has
    # no opset 4 and its opset 2 gives the default, the reference's dict misses): checked by hand.
    m = model("LabelEncoder", [F32], [F32], {"keys_floats": [0.5, float("nan"), 2.0], "values_floats": [1.0, 9.0, 3.0],
                                             "default_float": -7.0}, ml_opset=4)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    nan_bits = np.array([0x7FC00001, 0xFFC00000], np.uint32).view(np.float32)  # NaNs of other bit patterns
    for x in (np.array([0.5, np.nan, 1.25, 2.0], np.float32), nan_bits.reshape(2, 1), np.array([[2.0]], np.float32)):
        want = np.where(np.isnan(x), 9.0, np.where(x == 0.5, 1.0, np.where(x == 2.0, 3.0, -7.0))).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"in0": x})[0], want)


def test_label_encoder_v4_tensor_attrs():
    rng = np.random.default_rng(3)
    keys = numpy_helper.from_array(np.array([3, 1, 4, 1, 5], np.int64), "keys_tensor")
    vals = numpy_helper.from_array(np.array([30, 10, 40, 11, 50], np.int16), "values_tensor")
    dflt = numpy_helper.from_array(np.array([-3], np.int16), "default_tensor")
    m = model("LabelEncoder", [I64], [TensorProto.INT16], {"keys_tensor": keys, "values_tensor": vals,
                                                           "default_tensor": dflt}, ml_opset=4)
    # onnxruntime has no LabelEncoder opset 4: reference only
    run_sequence(m, [{"in0": rng.integers(0, 7, s)} for s in [(6,), (3, 4), (2,)]], references=("ref",))


def test_label_encoder_v4_double_to_string():
    rng = np.random.default_rng(4)
    keys = numpy_helper.from_array(np.array([0.25, 1.5, -2.0], np.float64), "keys_tensor")
    vals = numpy_helper.from_array(strings(["p", "q", "r"]), "values_tensor")
    dflt = numpy_helper.from_array(strings(["none"]), "default_tensor")
    m = model("LabelEncoder", [F64], [STR], {"keys_tensor": keys, "values_tensor": vals, "default_tensor": dflt},
              ml_opset=4)
    draw = [{"in0": rng.choice(np.array([0.25, 1.5, -2.0, 3.0]), s)} for s in [(4,), (2, 2), (5,)]]
    run_against_ref_text(m, draw)  # onnxruntime has no opset 4


def test_label_encoder_v1():
    rng = np.random.default_rng(5)
    m = model("LabelEncoder", [STR], [I64], {"classes_strings": ["x", "y", "z"], "default_int64": -5})
    run_sequence(m, [{"in0": rng.choice(strings("xyzw"), s)} for s in [(5,), (2, 2), (7,)]], references=("ort",))
    m = model("LabelEncoder", [I64], [STR], {"classes_strings": ["x", "y", "z"], "default_string": "-"})
    run_sequence(m, [{"in0": rng.integers(-1, 5, s)} for s in [(5,), (3,), (8,)]], references=("ort",))


# ---- tree ensembles ---------------------------------------------------------------------------------
def random_forest(rng, n_trees, n_features, n_targets, max_depth, modes, leaf_votes=1):
    """Random trees as (nodes, leaves): node = (feature, split, mode, members, true, false) with
    children ("n", i) or ("l", j); leaf = [(target, weight), ...]. Returns roots too."""
    nodes, leaves, roots = [], [], []

    def grow(depth):
        if depth == max_depth or (depth > 0 and rng.random() < 0.25):
            leaves.append([(int(rng.integers(0, n_targets)), float(np.float32(rng.uniform(-3, 3))))
                           for _ in range(leaf_votes)])
            return ("l", len(leaves) - 1)
        i = len(nodes)
        nodes.append(None)
        mode = int(rng.choice(modes))
        # members are 1..3: the reference evaluator mistakes a member 0.0 for the end of its set
        members = sorted({float(v) for v in rng.integers(1, 4, rng.integers(1, 4))}) if mode == 6 else []
        split = float(np.float32(rng.integers(-4, 5) / 2))  # halves: ties with the integer-ish inputs
        nodes[i] = (int(rng.integers(0, n_features)), split, mode, members, grow(depth + 1), grow(depth + 1),
                    int(rng.integers(0, 2)))
        return ("n", i)

    for _ in range(n_trees):
        roots.append(grow(0))
    return nodes, leaves, roots


def tree_ensemble_v5(rng, dtype, n_trees=5, n_features=3, n_targets=3, aggregate=1, post=0, modes=range(7)):
    nodes, leaves, roots = random_forest(rng, n_trees, n_features, n_targets, 4, list(modes))
    assert all(r[0] == "n" for r in roots)
    np_dt = np.float32 if dtype == F32 else np.float64

    def t(name, vals, dt):
        return numpy_helper.from_array(np.array(vals, dtype=dt), name)

    members = [v for n in nodes if n[2] == 6 for v in n[3] + [np.nan]]
    attrs = {
        "nodes_featureids": [n[0] for n in nodes], "nodes_splits": t("s", [n[1] for n in nodes], np_dt),
        "nodes_modes": t("m", [n[2] for n in nodes], np.uint8),
        "nodes_truenodeids": [n[4][1] for n in nodes], "nodes_trueleafs": [int(n[4][0] == "l") for n in nodes],
        "nodes_falsenodeids": [n[5][1] for n in nodes], "nodes_falseleafs": [int(n[5][0] == "l") for n in nodes],
        "nodes_missing_value_tracks_true": [n[6] for n in nodes],
        "leaf_targetids": [lf[0][0] for lf in leaves], "leaf_weights": t("w", [lf[0][1] for lf in leaves], np_dt),
        "tree_roots": [r[1] for r in roots], "n_targets": n_targets, "aggregate_function": aggregate,
        "post_transform": post,
    }
    if members:
        attrs["membership_values"] = t("mv", members, np_dt)
    return model("TreeEnsemble", [dtype], [dtype], attrs, ml_opset=5, ranks=[2])


def features(rng, shape, dtype=np.float32, nan=True):
    # Integers, so that many values sit exactly on splits (halves and integers) and set members.
    # Not fractions: onnxruntime truncates a feature to an integer before a set membership test.
    x = rng.integers(-3, 5, shape).astype(dtype)
    if nan:
        x[rng.random(shape) < 0.1] = np.nan
    return x


SHAPES = [(6, 3), (11, 3), (1, 3), (6, 3)]


@pytest.mark.parametrize("seed", range(4))
def test_tree_ensemble_sum_average(seed):
    rng = np.random.default_rng(seed)
    for dtype, np_dt in ((F32, np.float32), (F64, np.float64)):
        for aggregate in (0, 1):
            m = tree_ensemble_v5(rng, dtype, aggregate=aggregate)
            run_sequence(m, [{"in0": features(rng, s, np_dt)} for s in SHAPES])


@pytest.mark.parametrize("post", range(5))
def test_tree_ensemble_min_max_post(post):
    # onnxruntime only: the reference evaluator ignores post_transform and starts MIN/MAX at the
    # float limits (a target no tree voted for stays there; onnxruntime and we give it 0).
    # onnxruntime reads post_transform 1 as LOGISTIC and 2 as SOFTMAX, the spec the other way
    # round: its model gets the swapped code.
    import onnxruntime
    rng = np.random.default_rng(10 + post)
    for aggregate in (1, 2, 3):
        m = tree_ensemble_v5(rng, F32, aggregate=aggregate, post=post, n_targets=3 if post else 4)
        if post == 4:  # probit wants scores in [0, 1]: leaf weights there, one tree
            m = tree_ensemble_v5(rng, F32, n_trees=1, aggregate=aggregate, post=post)
            for a in m.graph.node[0].attribute:
                if a.name == "leaf_weights":
                    w = numpy_helper.to_array(a.t)
                    a.t.CopyFrom(numpy_helper.from_array((np.abs(w) / 3.5 + 0.05).astype(np.float32), "w"))
        m_ort = type(m)()
        m_ort.CopyFrom(m)
        for a in m_ort.graph.node[0].attribute:
            if a.name == "post_transform":
                a.i = {1: 2, 2: 1}.get(a.i, a.i)
        ort = onnxruntime.InferenceSession(m_ort.SerializeToString(), providers=["CPUExecutionProvider"])
        sess = dynashape.InferenceSession(m, device=DEVICE)
        for shape in SHAPES:
            x = features(rng, shape)
            # onnxruntime's erfinv (PROBIT) is an approximation good to about 2e-4
            np.testing.assert_allclose(sess.run(None, {"in0": x})[0], ort.run(None, {"in0": x})[0], atol=1e-4,
                                       rtol=1e-3 if post == 4 else 1e-5)


def tree_regressor_v3(rng, n_trees=4, n_features=3, n_targets=2, aggregate="SUM", post="NONE", base=None, votes=2,
                      as_tensor=False, ml_opset=3):
    nodes, leaves, roots = random_forest(rng, n_trees, n_features, n_targets, 4, list(range(6)), votes)
    names = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                             "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
                             "target_treeids", "target_nodeids", "target_ids", "target_weights")}
    # per tree, node ids are given by a breadth-first walk from the root, and nodes are listed in
    # node id order (onnxruntime needs that order; we would take any)
    for tree, root in enumerate(roots):
        ids: dict = {}
        order = [root]
        for ref in order:
            ids[ref] = len(ids)
            if ref[0] == "n":
                order += [nodes[ref[1]][4], nodes[ref[1]][5]]
        for ref in order:
            n = nodes[ref[1]] if ref[0] == "n" else None
            attrs["nodes_treeids"].append(tree)
            attrs["nodes_nodeids"].append(ids[ref])
            attrs["nodes_featureids"].append(n[0] if n else 0)
            attrs["nodes_values"].append(n[1] if n else 0.0)
            attrs["nodes_modes"].append(names[n[2]] if n else "LEAF")
            attrs["nodes_truenodeids"].append(ids[n[4]] if n else 0)
            attrs["nodes_falsenodeids"].append(ids[n[5]] if n else 0)
            attrs["nodes_missing_value_tracks_true"].append(n[6] if n else 0)
            if n is None:
                for target, w in leaves[ref[1]]:
                    attrs["target_treeids"].append(tree)
                    attrs["target_nodeids"].append(ids[ref])
                    attrs["target_ids"].append(target)
                    attrs["target_weights"].append(w)
    attrs.update(n_targets=n_targets, aggregate_function=aggregate, post_transform=post)
    if base is not None:
        attrs["base_values"] = base
    if as_tensor:
        for k in ("nodes_values", "target_weights"):
            attrs[k + "_as_tensor"] = numpy_helper.from_array(np.array(attrs.pop(k), np.float64), k)
    return model("TreeEnsembleRegressor", [F32], [F32], attrs, ml_opset=ml_opset, ranks=[2])


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_ensemble_regressor(aggregate):
    # onnxruntime: without base_values (it leaves a target no tree voted for at 0 even where a base
    # value is given; we give it the base value, as the reference evaluator does for SUM, AVERAGE)
    rng = np.random.default_rng(20)
    for post, n_targets in (("NONE", 2), ("LOGISTIC", 3), ("SOFTMAX", 2), ("SOFTMAX_ZERO", 3), ("NONE", 1),
                            ("LOGISTIC", 1), ("PROBIT", 1)):
        # one vote per leaf for one target: onnxruntime reads only the first vote of a leaf then
        m = tree_regressor_v3(rng, aggregate=aggregate, post=post, n_targets=n_targets, votes=min(n_targets, 2))
        feeds = [{"in0": features(rng, s)} for s in SHAPES]
        if post == "PROBIT":  # scores in (0, 1): every row reaches a leaf voting in (0, 1)
            w = next(a for a in m.graph.node[0].attribute if a.name == "target_weights")
            w.floats[:] = list(rng.uniform(0.05, 0.95, len(w.floats)).astype(np.float32))
            if aggregate in ("SUM", "AVERAGE"):
                continue  # a sum of votes leaves (0, 1)
        run_sequence(m, feeds, references=("ort",), atol=1e-4, rtol=1e-3 if post == "PROBIT" else 1e-4)
    if aggregate in ("SUM", "AVERAGE"):
        m = tree_regressor_v3(rng, aggregate=aggregate, n_targets=3, base=[0.5, -1.0, 2.0])
        run_sequence(m, [{"in0": features(rng, s, nan=False)} for s in SHAPES], references=("ref",))


def test_tree_ensemble_regressor_double_splits():
    # *_as_tensor (doubles): onnxruntime refuses them for float input and the reference evaluator
    # does not read them. The splits and weights are exact in float32 too, so the same trees with
    # float attributes in onnxruntime give the expected values.
    import onnxruntime
    m_f = tree_regressor_v3(np.random.default_rng(21))
    m_d = tree_regressor_v3(np.random.default_rng(21), as_tensor=True)
    ort = onnxruntime.InferenceSession(m_f.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = dynashape.InferenceSession(m_d, device=DEVICE)
    rng = np.random.default_rng(22)
    for shape in SHAPES:
        x = features(rng, shape)
        np.testing.assert_allclose(sess.run(None, {"in0": x})[0], ort.run(None, {"in0": x})[0], rtol=1e-6)
    m = tree_regressor_v3(rng, ml_opset=1)
    run_sequence(m, [{"in0": features(rng, s)} for s in SHAPES], references=("ort",))


# ---- small ops ------------------------------------------------------------------------------------
def test_array_feature_extractor():
    rng = np.random.default_rng(30)
    m = model("ArrayFeatureExtractor", [F32, I64], [F32])
    steps = [((3, 4), [0, 3]), ((5,), [1, 1, 4]), ((2, 3, 6), [[5, 0]]), ((3, 4), [2])]
    run_sequence(m, [{"in0": rand(s, rng=rng), "in1": np.array(i, np.int64)} for s, i in steps])
    m = model("ArrayFeatureExtractor", [STR, I64], [STR])
    words = strings(["u", "v", "w", "xy"])
    run_sequence(m, [{"in0": rng.choice(words, s), "in1": np.array(i, np.int64)} for s, i in steps])


def test_binarizer():
    rng = np.random.default_rng(31)
    for dt, refs in ((np.float32, ("ort", "ref")), (np.float64, ("ref",))):  # onnxruntime: float only
        m = model("Binarizer", [F32 if dt == np.float32 else F64], [F32 if dt == np.float32 else F64],
                  {"threshold": 0.25})
        run_sequence(m, [{"in0": rand(s, dt, rng)} for s in [(3, 4), (7,), (2, 2, 5), (3, 4)]], references=refs)


def test_scaler():
    rng = np.random.default_rng(32)
    m = model("Scaler", [F32], [F32], {"offset": [0.5, -1.0, 2.0], "scale": [2.0, 0.5, -1.5]})
    run_sequence(m, [{"in0": rand(s, rng=rng)} for s in [(4, 3), (1, 3), (7, 3)]])
    m = model("Scaler", [I64], [F32], {"offset": [1.5], "scale": [0.25]})
    # the reference evaluator returns int64 here, not float: ort only
    run_sequence(m, [{"in0": rand(s, np.int64, rng, -9, 9)} for s in [(4, 3), (1, 5), (6,)]], references=("ort",))


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm):
    rng = np.random.default_rng(33)
    m = model("Normalizer", [F32], [F32], {"norm": norm})
    # MAX: X / max(X) (spec, onnxruntime); the reference divides by max(|X|): ort only
    refs = ("ort",) if norm == "MAX" else ("ort", "ref")
    run_sequence(m, [{"in0": rand(s, rng=rng)} for s in [(4, 3), (1, 6), (7, 2), (4, 3)]], references=refs)


def test_imputer():
    rng = np.random.default_rng(34)
    m = model("Imputer", [F32], [F32], {"imputed_value_floats": [1.0, 2.0, 3.0], "replaced_value_float": float("nan")})

    def x(s):
        a = rand(s, rng=rng)
        a[rng.random(s) < 0.3] = np.nan
        return {"in0": a}
    run_sequence(m, [x(s) for s in [(4, 3), (1, 3), (9, 3)]])
    m = model("Imputer", [I64], [I64], {"imputed_value_int64s": [7], "replaced_value_int64": 0})
    run_sequence(m, [{"in0": rng.integers(-2, 3, s)} for s in [(4, 3), (2, 5), (6, 1)]])


def test_one_hot_encoder():
    rng = np.random.default_rng(35)
    m = model("OneHotEncoder", [I64], [F32], {"cats_int64s": [4, 1, 7]})
    run_sequence(m, [{"in0": rng.choice([1, 4, 7, 9], s)} for s in [(2, 3), (5,), (1, 4)]])
    m = model("OneHotEncoder", [STR], [F32], {"cats_strings": ["b", "a"], "zeros": 1})
    run_sequence(m, [{"in0": rng.choice(strings("abc"), s)} for s in [(2, 3), (5,), (1, 4)]])
    m = model("OneHotEncoder", [F64], [F32], {"cats_int64s": [2, 3]})
    run_sequence(m, [{"in0": rng.choice([2.0, 3.0, 2.5], s)} for s in [(3, 2), (4,), (3, 2)]], references=("ort",))


def test_feature_vectorizer():
    rng = np.random.default_rng(36)
    # narrower inputs are padded with zeros, wider ones cut (in1 is 2 wide for 3, in2 3 wide for 1)
    # (the reference evaluator keeps the input type, the spec says float: ort only there)
    for in_type, dt, refs in ((F32, np.float32, ("ort", "ref")), (I64, np.int64, ("ort",)),
                              (F64, np.float64, ("ort",))):
        m = model("FeatureVectorizer", [in_type] * 3, [F32], {"inputdimensions": [2, 3, 1]})
        steps = [[(4, 2), (4, 2), (4, 3)], [(1, 2), (1, 2), (1, 3)], [(6, 2), (6, 2), (6, 3)]]
        feeds = [{f"in{i}": rand(s, dt, rng, -5, 5) for i, s in enumerate(step)} for step in steps]
        run_sequence(m, feeds, references=refs)

"""String ops (ops/strings.py) over sequences of shapes in one session, against onnxruntime and the
ONNX reference evaluator. Strings are fresh random words each step, never empty unless a case
asks for it."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from .harness import run_sequence

STR, I64, I32 = TensorProto.STRING, TensorProto.INT64, TensorProto.INT32


def model(op_type, in_types, out_types, attrs=None, opset=20):
    """One node; every input has a fully dynamic shape of unknown rank, outputs are typed."""
    ins = [helper.make_tensor_value_info(f"in{i}", t, None) for i, t in enumerate(in_types)]
    outs = [helper.make_tensor_value_info(f"out{k}", t, None) for k, t in enumerate(out_types)]
    node = helper.make_node(op_type, [i.name for i in ins], [o.name for o in outs], **(attrs or {}))
    g = helper.make_graph([node], op_type.lower(), ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def words(shape, rng, alphabet="abcXYZ-. 1", lo=1, hi=8) -> np.ndarray:
    flat = ["".join(rng.choice(list(alphabet), rng.integers(lo, hi))) for _ in range(int(np.prod(shape)))]
    a = np.empty(len(flat), dtype=object)
    a[:] = flat
    return a.reshape(shape)


def test_string_concat_broadcast():
    rng = np.random.default_rng(0)
    shapes = [((3,), (3,)), ((2, 3), (1, 3)), ((4,), ()), ((2, 1, 2), (3, 1)), ((3,), (3,))]
    feeds = [{"in0": words(a, rng, "ab的中"), "in1": words(b, rng, "xy的")} for a, b in shapes]
    run_sequence(model("StringConcat", [STR, STR], [STR]), feeds)


def test_string_split():
    rng = np.random.default_rng(1)
    shapes = [(3,), (2, 2), (5,), (1,), (2, 3)]
    for attrs in ({"delimiter": "-"}, {"delimiter": "-", "maxsplit": 1}, {}, {"delimiter": "ab"}):
        feeds = [{"in0": words(s, rng, "ab- c", 1, 12)} for s in shapes]
        run_sequence(model("StringSplit", [STR], [STR, I64], attrs), feeds)


def test_string_split_onnxruntime_edges():
    # Where the reference (Python's str.split) and onnxruntime differ, we side with onnxruntime:
    # an empty string holds no substring even with a delimiter (Python: [""]), and with maxsplit
    # and no delimiter the trailing whitespace of the tail is trimmed too (as the spec says).
    # (onnxruntime splits on " " only, not on other whitespace: these strings use spaces only.)
    rng = np.random.default_rng(8)
    shapes = [(6,), (2, 3), (9,)]
    for attrs in ({"delimiter": "-"}, {"delimiter": "-", "maxsplit": 2}, {"maxsplit": 1}, {"maxsplit": 0}):
        feeds = [{"in0": words(s, rng, "a- ", 0, 9)} for s in shapes]
        run_sequence(model("StringSplit", [STR], [STR, I64], attrs), feeds, references=("ort",))


def test_string_split_empty_input():
    # onnxruntime and the reference agree on [0] -> ([0, 0], [0])
    empty = np.empty((0,), dtype=object)
    feeds = [{"in0": empty}, {"in0": words((2,), np.random.default_rng(2))}, {"in0": empty}]
    run_sequence(model("StringSplit", [STR], [STR, I64]), feeds)


def test_string_normalizer():
    rng = np.random.default_rng(3)
    # ASCII only: beyond it the three disagree (onnxruntime maps case per character with the C
    # library's locale tables, the reference strips accents, we use Python's str.upper/lower).
    # locale "C": onnxruntime fails on the default en_US.UTF-8 where that locale is not installed.
    # onnxruntime only: the reference returns a numpy str_ array (not object) and ignores
    # is_case_sensitive=0 when matching stopwords.
    vocab = np.array(["Monday", "monday", "MONDAY", "tuesday", "Tuesday", "x"], dtype=object)
    cases = [({"case_change_action": "LOWER", "stopwords": ["monday"], "is_case_sensitive": 1}, [(4,), (7,), (2,)]),
             ({"case_change_action": "UPPER", "stopwords": ["monday", "x"]}, [(1, 6), (1, 3), (1, 9)]),
             ({"stopwords": ["tuesday"]}, [(5,), (1,), (8,)]),
             ({"case_change_action": "LOWER"}, [(3,), (6,), (3,)])]
    for attrs, shapes in cases:
        feeds = [{"in0": rng.choice(vocab, s)} for s in shapes]
        run_sequence(model("StringNormalizer", [STR], [STR], {**attrs, "locale": "C"}, opset=10), feeds,
                     references=("ort",))


def test_string_normalizer_all_dropped():
    x = np.array(["monday", "Monday"], dtype=object)
    m = model("StringNormalizer", [STR], [STR], {"stopwords": ["MONDAY"], "locale": "C"}, opset=10)
    feeds = [{"in0": x}, {"in0": x.reshape(1, 2)}, {"in0": np.array(["a", "monday"], dtype=object)}]
    run_sequence(m, feeds, references=("ort",))  # see test_string_normalizer


def test_regex_full_match():
    rng = np.random.default_rng(4)
    m = model("RegexFullMatch", [STR], [TensorProto.BOOL], {"pattern": r"[a-c]+\d?(-\w+)?"})
    feeds = [{"in0": words(s, rng, "abcd1-x", 1, 6)} for s in [(5,), (2, 3), (1,), (4, 1, 2)]]
    run_sequence(m, feeds)


def test_regex_posix_class():
    # RE2's [[:alpha:]]: only onnxruntime (RE2) knows it; the reference evaluator uses Python's re
    m = model("RegexFullMatch", [STR], [TensorProto.BOOL], {"pattern": r"[[:alpha:]]+[[:digit:]_]*"})
    rng = np.random.default_rng(5)
    feeds = [{"in0": words(s, rng, "ab:[]1_", 1, 6)} for s in [(6,), (3, 2), (6,)]]
    run_sequence(m, feeds, references=("ort",))


def _tfidf_model(mode, in_type, pool, counts, indexes, lo, hi, skip, weights=None):
    attrs = {"mode": mode, "min_gram_length": lo, "max_gram_length": hi, "max_skip_count": skip,
             "ngram_counts": counts, "ngram_indexes": indexes}
    attrs["pool_strings" if in_type == STR else "pool_int64s"] = pool
    if weights is not None:
        attrs["weights"] = weights
    return model("TfIdfVectorizer", [in_type], [TensorProto.FLOAT], attrs, opset=9)


def test_tfidf_ints():
    rng = np.random.default_rng(6)
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 2, 3, 4]  # 4 unigrams, 3 bigrams, 1 trigram
    counts = [0, 4, 10]
    weights = [0.5, 1.5, 2.0, 0.25, 1.0, 3.0, 0.75, 2.5]
    shapes = [(12,), (3, 10), (20,), (1, 4), (3, 10)]
    for mode, lo, hi, skip in (("TF", 1, 3, 2), ("IDF", 2, 2, 0), ("TFIDF", 1, 2, 5), ("TF", 3, 3, 1)):
        for dt in (np.int64, np.int32):
            feeds = [{"in0": rng.integers(2, 9, s).astype(dt)} for s in shapes]
            in_type = I64 if dt == np.int64 else I32
            run_sequence(_tfidf_model(mode, in_type, pool, counts, list(range(8)), lo, hi, skip, weights), feeds)


def test_tfidf_permuted_indexes():
    # weights[i] scales the i-th pool n-gram (spec, onnxruntime); the reference evaluator takes it
    # for output column i instead, which differs once ngram_indexes is not the identity: ort only.
    rng = np.random.default_rng(9)
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 2, 3, 4]
    weights = [0.5, 1.5, 2.0, 0.25, 1.0, 3.0, 0.75, 2.5]
    for mode in ("TF", "IDF", "TFIDF"):
        m = _tfidf_model(mode, I64, pool, [0, 4, 10], [7, 0, 1, 2, 3, 4, 5, 6], 1, 3, 1, weights)
        run_sequence(m, [{"in0": rng.integers(2, 9, s)} for s in [(12,), (2, 9), (30,)]], references=("ort",))


def test_tfidf_strings():
    rng = np.random.default_rng(7)
    vocab = np.array(["a", "b", "c", "d", "e"], dtype=object)
    pool = ["a", "c", "a", "b", "b", "c", "c", "a"]  # unigrams a, c; bigrams ab, bc, ca
    shapes = [(9,), (2, 7), (4,), (2, 7)]
    feeds = [{"in0": rng.choice(vocab, s)} for s in shapes]
    run_sequence(_tfidf_model("TFIDF", STR, pool, [0, 2], [0, 1, 2, 3, 4], 1, 2, 1, [1., 2., 3., 4., 5.]), feeds)


def test_tfidf_empty_input():
    # a zero-length row: every count is 0 (onnxruntime only; the reference fails on empty input)
    m = _tfidf_model("TF", I64, [1, 2, 1, 2], [0, 2], [0, 1, 2], 1, 2, 0)
    run_sequence(m, [{"in0": np.zeros((2, 0), np.int64)}, {"in0": np.array([[1, 2, 2]], np.int64)}],
                 references=("ort",))

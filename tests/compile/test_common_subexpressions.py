"""``eliminate_common_subexpressions`` (compile/common_subexpressions.py): a node that repeats an
earlier one (op, attributes, inputs; small constants by value) goes and its readers read the
first; random ops, returned values and other attributes keep theirs. The generated code's groups
share a value made from shapes whose expression repeats (codegen/builder.py ``_computed_already``:
T5's per-layer ``arange`` read from the Shape of different tensors). Each model runs over changing
shapes with fresh random inputs in the compiled session, the interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np

from tests.compile.test_fusion import Builder, check_sequence, fused_ops, randn, spec_of

SHAPES = [(2, 3), (5, 3), (1, 3), (5, 3)]


def _feeds(seed: int, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, *s)} for s in shapes]


def _mask_term(b: Builder, x: str) -> str:
    """What an exporter writes per layer: positions 0 .. n - 1 from x's own Shape, as a column."""
    n = b.op("Gather", b.op("Shape", x), b.const(0, np.int64), axis=0)
    pos = b.op("Cast", b.op("Range", b.const(0, np.int64), n, b.const(1, np.int64)), to=1)
    return b.op("Unsqueeze", pos, b.const([1], np.int64))


def test_repeated_layers_compute_their_shape_arithmetic_once():
    b = Builder()
    x = b.input("x", ["n", 3])
    y = b.op("Sum", *[b.op("Add", b.op("Tanh", x), _mask_term(b, x)) for _ in range(3)])
    ops = fused_ops(check_sequence(b.model([y]), _feeds(1)))
    assert ops["Shape"] <= 1 and ops["Range"] <= 1 and ops["Unsqueeze"] <= 1, dict(ops)
    assert ops["Tanh"] == 1 and ops["Add"] == 1, dict(ops)


def test_small_constants_match_by_value():
    b = Builder()
    x = b.input("x", ["n", 3])
    y = b.op("Mul", b.op("Add", x, b.const([1.0, 2.0, 3.0])), b.op("Add", x, b.const([1.0, 2.0, 3.0])))
    ops = fused_ops(check_sequence(b.model([y]), _feeds(3)))
    assert ops["Add"] == 1, dict(ops)


def test_other_attributes_random_ops_and_returned_values_stay():
    b = Builder()
    x = b.input("x", ["n", 3])
    s0 = b.op("Softmax", x, axis=0)
    s1 = b.op("Softmax", x, axis=1)
    r = b.op("Abs", x)
    r2 = b.op("Abs", x)  # returned under its own name: stays
    ops = fused_ops(check_sequence(b.model([b.op("Add", s0, s1), r, r2]), _feeds(4)))
    assert ops["Softmax"] == 2 and ops["Abs"] == 2, dict(ops)
    b = Builder()
    x = b.input("x", ["n", 3])
    noise = [b.op("RandomUniformLike", x, low=1.0, high=2.0) for _ in range(2)]
    y = b.op("Sub", noise[0], noise[1])
    import dynashape
    sess = dynashape.InferenceSession(b.model([y]), executor="compiled", fusion=True)
    assert fused_ops(sess)["RandomUniformLike"] == 2
    got = sess.run(None, _feeds(5)[0])[0]
    assert np.abs(got).max() > 0  # two draws, not one read twice


def test_generated_groups_share_a_repeated_expression():
    """Two Ranges over the lengths of two different tensors that the shape program knows are the
    same symbol: one ``arange`` in the group of that symbol, and the results still agree."""
    b = Builder()
    x = b.input("x", ["n", 3])
    t = b.op("Tanh", x)  # another tensor of the same length
    ranges = [b.op("Cast", b.op("Range", b.const(0, np.int64),
                                b.op("Gather", b.op("Shape", src), b.const(0, np.int64), axis=0),
                                b.const(1, np.int64)), to=1) for src in (x, t)]
    y = b.op("Add", b.op("Add", t, b.op("Unsqueeze", ranges[0], b.const([1], np.int64))),
             b.op("Unsqueeze", ranges[1], b.const([1], np.int64)))
    feeds = _feeds(6)
    sess = check_sequence(b.model([y]), feeds)
    src = spec_of(sess, feeds[-1]).source
    assert src.count("torch.arange(") == 1, src

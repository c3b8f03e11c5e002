"""``skip_identities`` (compile/skip_identities.py): readers of an Identity read its input (the
pattern behind it then fuses); an Identity the graph returns, or whose output a branch of an If
reads from the enclosing scope, stays. Each model runs over changing shapes with fresh random
inputs in the fused compiled session, the interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn

SHAPES = [(2, 3), (5, 3), (1, 3)]


def _feeds(seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, *s)} for s in SHAPES]


def test_identity_between_a_pattern_goes():
    b = Builder()
    x = b.input("x", ["n", 3])
    s = b.op("Identity", b.op("Sigmoid", x))
    y = b.op("Mul", x, s)  # SiLU behind the Identity
    ops = fused_ops(check_sequence(b.model([y]), _feeds(1)))
    assert ops["Identity"] == 0 and ops[f"{FUSED}.Silu"] == 1, dict(ops)


def test_returned_identity_stays():
    b = Builder()
    x = b.input("x", ["n", 3])
    i = b.op("Identity", b.op("Relu", x))
    ops = fused_ops(check_sequence(b.model([i, b.op("Neg", i)]), _feeds(2)))
    assert ops["Identity"] == 1, dict(ops)


def test_identity_read_by_a_branch_stays():
    b = Builder()
    x = b.input("x", ["n", 3])
    i = b.op("Identity", b.op("Relu", x))
    cond = b.op("Greater", b.op("ReduceSum", x, keepdims=0), b.const(0.0))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    then = helper.make_graph([helper.make_node("Neg", [i], ["y"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Abs", [i], ["y"])], "else", [], [out])
    b.nodes.append(helper.make_node("If", [cond], ["z"], name="branch", then_branch=then, else_branch=other))
    sess = check_sequence(b.model(["z"]), _feeds(3))
    assert [n.op_type for n in sess.program.fused.nodes].count("Identity") == 1


def test_a_concat_of_one_input_goes_too():
    b = Builder()
    x = b.input("x", ["n", 3])
    c = b.op("Concat", b.op("Relu", x), axis=1)
    y = b.op("Concat", c, b.op("Neg", x), axis=1)
    ops = fused_ops(check_sequence(b.model([y]), _feeds(4)))
    assert ops["Concat"] == 1, dict(ops)


def test_a_product_by_one_goes_unless_it_broadcasts():
    """Paddle2ONNX's SiLU, x * sigmoid(1 * x), fuses; a 1 of higher rank, or a 2, keeps its Mul."""
    b = Builder()
    x = b.input("x", ["n", 3])
    y = b.op("Mul", x, b.op("Sigmoid", b.op("Mul", x, b.const([1.0]))))
    z = b.op("Neg", b.op("Div", b.op("Neg", x), b.const(1.0)))  # (a returned Div would stay)
    ops = fused_ops(check_sequence(b.model([y, z]), _feeds(5)))
    assert ops[f"{FUSED}.Silu"] == 1 and ops["Mul"] == 0 and ops["Div"] == 0, dict(ops)
    b = Builder()
    x = b.input("x", ["n", 3])
    y = b.op("Add", b.op("Mul", x, b.const([[[1.0]]])), b.op("Mul", x, b.const(2.0)))
    ops = fused_ops(check_sequence(b.model([y]), _feeds(6)))
    assert ops["Mul"] == 2, dict(ops)


def test_an_output_that_is_an_input_or_a_constant_is_the_callers_copy():
    """A graph output that is an input (through an Identity) or an initializer is copied for the
    caller, as onnxruntime's are: the memory plan gives inputs a root of their own, so a view of
    one is not taken for memory the caller owns (before, an Identity of an input was handed back as
    the input itself, and in a Loop body that aliasing broke the carried values)."""
    import torch

    import dynashape

    b = Builder()
    x = b.input("x", ["n", 3])
    c = b.const(np.arange(3, dtype=np.float32))
    model = b.model([b.op("Identity", x), b.op("Identity", c), b.op("Add", x, c)])
    sess = dynashape.InferenceSession(model)
    xt = torch.randn(4, 3)
    keep = xt.clone()
    a, k, _ = sess.run(None, {"x": xt})
    a[:] = 7.0
    k[:] = 7.0
    assert torch.equal(xt, keep)
    assert sess.run(None, {"x": xt})[1].tolist() == [0.0, 1.0, 2.0]

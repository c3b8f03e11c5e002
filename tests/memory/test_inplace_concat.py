"""In-place concat with several producers: each input's producer writes straight into its slot of
the Concat's storage, the Concat copies nothing; layouts that change during a run stay correct.

Both executors do it. The generated code plans the slots with the shape program, so a slot is
where it belongs from the first run on, whatever the lengths; the interpreter lays the storage out
at run time from what it has seen, and its expectations below say where that guess costs a copy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape

from ..ops.harness import DEVICE, rand
from .test_session_memory import ort_run


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in outputs],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def branches() -> onnx.ModelProto:
    """An Inception-style block: three branches of one input, concatenated along channels, then
    used by one more node (the Concat's output is not the graph's)."""
    return model([helper.make_node("Relu", ["x"], ["a"]),
                  helper.make_node("Sigmoid", ["x"], ["b"]),
                  helper.make_node("Mul", ["x", "x"], ["c"]),
                  helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1),
                  helper.make_node("Tanh", ["cat"], ["y"])],
                 [("x", ["N", 4, "H", "W"])], [("y", ["N", 12, "H", "W"])])


def run_sequence(sess, m, shapes, make):
    copied = []
    for shape in shapes:
        feeds = make(shape)
        got = sess.run(None, feeds)
        for g, w in zip(got, ort_run(m, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        copied.append(sess.memory_stats()["concat_bytes_copied"])
    return np.diff([0, *copied]).tolist()


EXECUTORS = pytest.mark.parametrize("executor", ["compiled", "interpreter"])


@EXECUTORS
@pytest.mark.parametrize("batch", [1, 3])  # batch 1: contiguous slots; 3: strided ones
def test_every_branch_writes_into_its_slot(batch, executor):
    m = branches()
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    shapes = [(batch, 4, 5, 6)] * 3 + [(batch, 4, 7, 3)] * 3
    per_run = run_sequence(sess, m, shapes, lambda s: {"x": rand(s)})
    # nothing moves, from the first run on and across a change of H and W: the branches' channel
    # counts are fixed (compile-time shape inference knows them) and the other dims follow the
    # first branch's
    assert per_run == [0] * 6
    assert sess.memory_stats()["concat_inputs_in_place"] == 3 * 6


@EXECUTORS
def test_a_branch_of_unknown_length_is_laid_out_from_the_last_run(executor):
    """The channel counts are dynamic here: the interpreter's first run cannot lay the storage
    out and copies; from the second on the last run's lengths serve. The shape program knows
    every length as an expression of C: nothing is ever copied."""
    m = branches()
    for vi in m.graph.input:
        vi.type.tensor_type.shape.dim[1].dim_param = "C"
    for vi in m.graph.output:
        vi.type.tensor_type.shape.dim[1].dim_param = "C3"
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    per_run = run_sequence(sess, m, [(2, 4, 5, 6)] * 3 + [(2, 5, 5, 6)] * 2, lambda s: {"x": rand(s)})
    n = 2 * 5 * 6 * 4
    if executor == "compiled":
        assert per_run == [0] * 5
        return
    # a change of C: the layout guessed b and c with the old C and is too small; a, already
    # written into it, moves out, and all three are copied into a new storage, once
    assert per_run == [3 * 4 * n, 0, 0, (1 + 3) * 5 * n, 0]


@EXECUTORS
@pytest.mark.parametrize("batch", [1, 3])
def test_producers_that_cannot_write_into_a_slot_are_copied_in_one_go(batch, executor):
    """LeakyRelu returns torch's own tensor: nothing is in place, the Concat copies every input
    (one torch.cat into a strided view of the storage when batch > 1)."""
    m = model([helper.make_node("LeakyRelu", ["x"], ["a"]),
               helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.5),
               helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
               helper.make_node("Tanh", ["cat"], ["y"])],
              [("x", ["N", 3, "W"])], [("y", ["N", 6, "W"])])
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    per_run = run_sequence(sess, m, [(batch, 3, 4), (batch, 3, 7), (batch, 3, 7)], lambda s: {"x": rand(s)})
    assert per_run == [2 * batch * 3 * w * 4 for w in (4, 7, 7)]
    assert sess.memory_stats()["concat_inputs_in_place"] == 0


@EXECUTORS
def test_without_inplace_concat_every_run_copies_the_branches(executor):
    m = branches()
    sess = dynashape.InferenceSession(m, device=DEVICE, inplace_concat=False, executor=executor)
    per_run = run_sequence(sess, m, [(1, 4, 5, 6)] * 3, lambda s: {"x": rand(s)})
    assert per_run == [3 * 4 * 5 * 6 * 4] * 3


@EXECUTORS
def test_an_input_made_after_the_first_producer_changes_the_layout_mid_run(executor):
    """cat = Concat(n, f): f's producer runs first and lays the storage out with n's shape of the
    last run. When n's length changes, f sits at the wrong place in the storage: the Concat must
    move it out before copying n over it. (The shape program places f right from the start.)"""
    m = model([helper.make_node("Relu", ["z"], ["f"]),
               helper.make_node("Sigmoid", ["x"], ["n"]),
               helper.make_node("Concat", ["n", "f"], ["cat"], axis=0),
               helper.make_node("Neg", ["n"], ["n2"]),  # a second reader: n is no producer of the Concat
               helper.make_node("Tanh", ["cat"], ["y"])],
              [("x", ["L"]), ("z", [6])], [("y", ["T"]), ("n2", ["L"])])
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    z = rand((6,))
    per_run = run_sequence(sess, m, [3, 3, 5, 5, 2, 9], lambda n: {"x": rand((n,)), "z": z})
    if executor == "compiled":
        assert per_run == [n * 4 for n in (3, 3, 5, 5, 2, 9)]  # n copied, f always in its slot
        return
    # n is always copied (4 bytes a position); f only in the first run and when n's length changed
    # (moved out of the storage, then into its slot)
    assert per_run == [(3 + 6) * 4, 3 * 4, (5 + 6 + 6) * 4, 5 * 4, (2 + 6 + 6) * 4, (9 + 6 + 6) * 4]


def two_fed() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["a"]),
                  helper.make_node("Sigmoid", ["w"], ["b"]),
                  helper.make_node("Concat", ["a", "b"], ["cat"], axis=0),
                  helper.make_node("Tanh", ["cat"], ["y"])],
                 [("x", ["L", "K"]), ("w", ["M", "K2"])], [("y", ["T", "K"])])


@EXECUTORS
def test_a_failed_run_leaves_no_layout_behind(executor):
    """The first producer lays out a storage, then the Concat fails (the widths disagree): the
    session reports it, and the next runs are right."""
    m = two_fed()
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    good = lambda: {"x": rand((3, 4)), "w": rand((2, 4))}  # noqa: E731
    run_sequence(sess, m, [0, 0], lambda _: good())
    with pytest.raises(dynashape.errors.ShapeError, match="Concat"):
        sess.run(None, {"x": rand((3, 4)), "w": rand((2, 5))})
    per_run = run_sequence(sess, m, [0, 0], lambda _: good())
    assert per_run[1] == 0


@EXECUTORS
def test_a_layout_is_for_its_own_run_only(executor):
    """When the first producer has nothing to do (an empty output), the second must not use the
    layout of an earlier run."""
    m = two_fed()
    sess = dynashape.InferenceSession(m, device=DEVICE, executor=executor)
    per_run = run_sequence(sess, m, [3, 3, 0, 3, 3], lambda n: {"x": rand((n, 4)), "w": rand((2, 4))})
    if executor == "compiled":
        assert per_run == [0] * 5  # both producers write into their slots, an empty one too
        return
    assert per_run[1] == 0 and per_run[2] == 2 * 4 * 4 and per_run[4] == 0

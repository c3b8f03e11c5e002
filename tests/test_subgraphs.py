"""Subgraphs: parsed with outer-scope reads, run as nested networks that see this run's values."""

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

from .ops.harness import run_sequence


def if_model() -> onnx.ModelProto:
    # then: x * w (w an outer input), else: x + outer constant; both read outer values
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TP.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "M"]),
                                         helper.make_tensor_value_info("w", TP.FLOAT, ["M"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "M"])],
                          initializer=[onnx.numpy_helper.from_array(np.array(0, np.float32), "zero"),
                                       onnx.numpy_helper.from_array(np.array([3.5], np.float32), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_with_outer_values_over_changing_shapes():
    rng = np.random.default_rng(0)
    feeds = []
    for n, m, sign in ((2, 3, 1), (5, 4, -1), (2, 3, -1), (1, 7, 1), (5, 4, 1), (2, 3, 1)):
        x = np.abs(rng.uniform(0.1, 2, (n, m))).astype(np.float32) * sign  # the sum's sign picks the branch
        feeds.append({"x": x, "w": rng.uniform(-2, 2, (m,)).astype(np.float32)})
    sess = run_sequence(if_model(), feeds)
    assert any(n.op_type == "If" for n in sess.program.graph.nodes)


def _loop_of(body_nodes: list, constant: tuple[str, float]) -> onnx.ModelProto:
    """Loop(M, "", acc0) over ``body_nodes`` (i, cond_in, acc_in -> cond_out, acc_out, scan_out; x an
    outer value, ``constant`` a scalar of the body): the final acc and the scanned accs."""
    body = helper.make_graph(
        body_nodes,
        "body", [helper.make_tensor_value_info("i", TP.INT64, []),
                 helper.make_tensor_value_info("cond_in", TP.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TP.FLOAT, ["N"])],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
         helper.make_tensor_value_info("acc_out", TP.FLOAT, ["N"]),
         helper.make_tensor_value_info("scan_out", TP.FLOAT, ["N"])],
        initializer=[onnx.numpy_helper.from_array(np.array(constant[1], np.float32), constant[0])])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "scans"], body=body)]
    g = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("M", TP.INT64, []),
                                           helper.make_tensor_value_info("acc0", TP.FLOAT, ["N"]),
                                           helper.make_tensor_value_info("x", TP.FLOAT, ["N"])],
                          [helper.make_tensor_value_info("acc", TP.FLOAT, ["N"]),
                           helper.make_tensor_value_info("scans", TP.FLOAT, ["T", "N"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def loop_model() -> onnx.ModelProto:
    """A Loop of M iterations: acc = acc * 0.5 + x (x an outer value), scan output acc each step."""
    return _loop_of([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                     helper.make_node("Mul", ["acc_in", "half"], ["h"]),
                     helper.make_node("Add", ["h", "x"], ["acc_out"]),
                     helper.make_node("Identity", ["acc_out"], ["scan_out"])], ("half", 0.5))


def test_loop_body_reuses_its_buffers_and_outputs_stay_the_callers():
    """The compiled body writes its outputs into two buffer sets in turn, not fresh tensors per
    iteration: allocations do not grow with the trip count. The carried values each iteration
    reads are never the buffers it writes (results equal onnxruntime's), and what the Loop hands
    out (final value, stacked scan outputs) stays the caller's across later calls."""
    import dynashape

    rng = np.random.default_rng(4)
    feeds = [{"M": np.array(m, np.int64), "acc0": rng.uniform(-2, 2, (n,)).astype(np.float32),
              "x": rng.uniform(-2, 2, (n,)).astype(np.float32)} for m, n in ((5, 3), (40, 3), (7, 6), (40, 3))]
    # (onnx's ReferenceEvaluator fails on a Loop without a condition input: onnxruntime only)
    run_sequence(loop_model(), feeds, references=("ort",))
    sess = dynashape.InferenceSession(loop_model())
    first = sess.run(None, feeds[1])
    kept = [a.copy() for a in first]
    allocs = sess.memory_stats()["allocations"]
    for m in (10, 80, 160):
        sess.run(None, {**feeds[1], "M": np.array(m, np.int64)})
    grew = sess.memory_stats()["allocations"] - allocs
    assert grew <= 6, f"{grew} allocations for 250 more iterations"
    for a, b in zip(first, kept):
        np.testing.assert_array_equal(a, b)


def same_names_in_both_branches() -> onnx.ModelProto:
    """Both branches define 'shape' and 'r' (as optimum's merged decoders do): then reshapes x to
    (N, M) = rank 2, else to (N, M, 1) = rank 3, each branch's target a Concat of the input's dims.
    ONNX's inference with data propagation keeps 'shape's value by name across the branches, typed
    the else branch's 'r' rank 2, and our validator then refused the model (a Transpose of 3 axes)."""
    def branch(name, dims, perm, out):
        nodes = [helper.make_node("Shape", ["x"], ["xs"]),
                 helper.make_node("Concat", ["xs", *dims], ["shape"], axis=0),
                 helper.make_node("Reshape", ["x", "shape"], ["r"]),
                 helper.make_node("Transpose", ["r"], [out], perm=perm)]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TP.FLOAT, None)])

    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", [], [1, 0], "t"),
                              else_branch=branch("else", ["one"], [1, 0, 2], "e"))]
    g = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "M"]),
                                         helper.make_tensor_value_info("cond", TP.BOOL, [])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          initializer=[onnx.numpy_helper.from_array(np.array([1], np.int64), "one")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_name_defined_in_both_branches_keeps_each_branch_its_own_rank():
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((n, m)).astype(np.float32), "cond": np.array(c)}
             for n, m, c in ((2, 3, True), (4, 5, False), (1, 7, False), (2, 3, True))]
    run_sequence(same_names_in_both_branches(), feeds)


def loop_that_stops_itself() -> onnx.ModelProto:
    """Loop(M, "") whose body turns its condition false once the accumulator passes a limit: the
    spec's table says the condition is ignored in this form, onnxruntime stops on it (and models are
    made to run there)."""
    return _loop_of([helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
                     helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
                     helper.make_node("Less", ["s", "limit"], ["cond_out"]),
                     helper.make_node("Identity", ["acc_out"], ["scan_out"])], ("limit", 6.0))


def test_a_loop_without_a_condition_input_stops_on_its_bodys_condition():
    rng = np.random.default_rng(2)
    feeds = [{"M": np.array(m, np.int64), "acc0": rng.uniform(0, 0.5, n).astype(np.float32),
              "x": rng.uniform(0.2, 1.0, n).astype(np.float32)} for m, n in ((10, 3), (4, 2), (12, 5), (10, 3))]
    # onnx's reference evaluator runs no iteration at all without a condition input (it starts from
    # cond=None) and then fails to stack the empty scan outputs: onnxruntime alone is the reference
    sess = run_sequence(loop_that_stops_itself(), feeds, references=("ort",))
    out = sess.run(None, feeds[0])
    assert 1 <= out[1].shape[0] < 10  # stopped before its trip count


def loop_carrying_weights() -> onnx.ModelProto:
    """paddle2onnx's form: a Loop carrying its weight W unchanged (an output that is its own input),
    a state h = tanh(h @ W), p, the previous h, and h + p scanned (p_out is another slot's input: h_in
    lives in one of the body's buffer sets, which the iteration after next writes again, so it
    must be copied, or that iteration would read p after writing h over it)."""
    f = TP.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h_in", "w_in"], ["hw"]),
         helper.make_node("Tanh", ["hw"], ["h_out"]),
         helper.make_node("Identity", ["h_in"], ["p_out"]),
         helper.make_node("Add", ["h_out", "p_in"], ["scan_out"])],
        "body", [helper.make_tensor_value_info("i", TP.INT64, []),
                 helper.make_tensor_value_info("cond_in", TP.BOOL, []),
                 helper.make_tensor_value_info("w_in", f, ["K", "K"]),
                 helper.make_tensor_value_info("h_in", f, ["N", "K"]),
                 helper.make_tensor_value_info("p_in", f, ["N", "K"])],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []), helper.make_tensor_value_info("w_in", f, ["K", "K"]),
         helper.make_tensor_value_info("h_out", f, ["N", "K"]), helper.make_tensor_value_info("p_out", f, ["N", "K"]),
         helper.make_tensor_value_info("scan_out", f, ["N", "K"])])
    nodes = [helper.make_node("Loop", ["M", "", "w", "h0", "p0"], ["w_end", "h", "p", "hs"], body=body)]
    g = helper.make_graph(nodes, "loop_w", [helper.make_tensor_value_info("M", TP.INT64, []),
                                             helper.make_tensor_value_info("w", f, ["K", "K"]),
                                             helper.make_tensor_value_info("h0", f, ["N", "K"]),
                                             helper.make_tensor_value_info("p0", f, ["N", "K"])],
                          [helper.make_tensor_value_info(n, f, None) for n in ("w_end", "h", "p", "hs")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_loop_passes_its_carried_weights_through_uncopied_and_other_carries_stay_right():
    import dynashape

    rng = np.random.default_rng(7)
    feeds = [{"M": np.array(m, np.int64), "w": rng.uniform(-0.5, 0.5, (k, k)).astype(np.float32),
              "h0": rng.uniform(-1, 1, (n, k)).astype(np.float32), "p0": rng.uniform(-1, 1, (n, k)).astype(np.float32)}
             for m, n, k in ((5, 2, 8), (9, 3, 8), (4, 1, 16))]
    run_sequence(loop_carrying_weights(), feeds, references=("ort",))
    sess = dynashape.InferenceSession(loop_carrying_weights())
    w = feeds[1]["w"].copy()
    out = sess.run(None, feeds[1])
    np.testing.assert_array_equal(out[0], w)  # the weight came through whole...
    out[0][:] = 0  # ...and the caller's copy is its own: the next call still sees the weight
    np.testing.assert_allclose(sess.run(None, feeds[1])[1], out[1], rtol=1e-6)
    np.testing.assert_array_equal(feeds[1]["w"], w)

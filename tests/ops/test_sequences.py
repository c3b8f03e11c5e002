"""Sequences, optionals, Loop, Scan and SequenceMap over changing shapes, against onnxruntime and
onnx's ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

from .harness import rand, run_sequence

F = TP.FLOAT
OPSET = 18


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def _t(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _seq(name, elem=F):
    return helper.make_tensor_sequence_value_info(name, elem, None)


def _scalar(name, value, dtype=np.int64):
    return onnx.numpy_helper.from_array(np.array(value, dtype=dtype), name)


def test_sequence_ops_chain():
    """split -> insert -> erase -> at / length / concat, with the split length and the inserted
    tensor's size changing from run to run."""
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=1),
        helper.make_node("SequenceInsert", ["s", "y", "pos"], ["s2"]),
        helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
        helper.make_node("SequenceLength", ["s3"], ["n"]),
        helper.make_node("SequenceAt", ["s3", "minus1"], ["last"]),
        helper.make_node("ConcatFromSequence", ["s3"], ["cat"], axis=0),
    ]
    m = _model(nodes, [_t("x", F, ["a", 3]), _t("y", F, ["b", 3]), _t("pos", TP.INT64, [])],
               [_t("n", TP.INT64, []), _t("last", F, None), _t("cat", F, None)],
               [_scalar("zero", 0), _scalar("minus1", -1)])
    rng = np.random.default_rng(1)
    feeds = [{"x": rand((a, 3), rng=rng), "y": rand((b, 3), rng=rng), "pos": np.array(p, np.int64)}
             for a, b, p in [(3, 1, 1), (5, 2, 5), (2, 4, -1), (5, 2, 0), (3, 1, 1)]]
    # The reference evaluator maps position == len (append, allowed by the spec) to 0 with a
    # modulo: it is checked on the runs without that position only.
    run_sequence(m, feeds, references=("ort",))
    run_sequence(m, [f for f in feeds if f["pos"] != f["x"].shape[0]], references=("ref",))


def test_sequence_input_and_output():
    m = _model([helper.make_node("SequenceInsert", ["s", "x"], ["out"])], [_seq("s"), _t("x", F, None)],
               [_seq("out")])
    rng = np.random.default_rng(2)
    feeds = [{"s": [rand((k, 2), rng=rng) for k in ks], "x": rand((3,), rng=rng)} for ks in ([1], [2, 3], [4], [1])]
    sess = run_sequence(m, feeds)
    # an empty sequence in: neither peer takes one as a feed (onnxruntime refuses it, the
    # reference evaluator fails converting it), so the expected result is written out here
    x = rand((3,), rng=rng)
    (out,) = sess.run(None, {"s": [], "x": x})
    assert len(out) == 1 and np.array_equal(out[0], x)


def test_loop_with_dynamic_trip_count_and_growing_scan_output():
    """y_k = y_{k-1} * 2 + x for k < n; scan output stacks every y: the trip count and x's shape
    change between runs."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["y_in", "two"], ["t"]),
         helper.make_node("Add", ["t", "x"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"])],
        "body", [_t("i", TP.INT64, []), _t("cond_in", TP.BOOL, []), _t("y_in", F, None)],
        [_t("cond_out", TP.BOOL, []), _t("y_out", F, None), _t("scan", F, None)],
        initializer=[onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    loop = helper.make_node("Loop", ["n", "", "y0"], ["y", "ys"], body=body)
    m = _model([loop], [_t("n", TP.INT64, []), _t("y0", F, ["a"]), _t("x", F, ["a"])],
               [_t("y", F, None), _t("ys", F, None)])
    rng = np.random.default_rng(3)
    feeds = [{"n": np.array(n, np.int64), "y0": rand((a,), rng=rng), "x": rand((a,), rng=rng)}
             for n, a in [(3, 2), (5, 4), (1, 4), (3, 2)]]
    # the reference evaluator runs no iteration when the condition input is absent (the spec's
    # "for loop" form runs M of them)
    run_sequence(m, feeds, references=("ort",))


def test_loop_while_condition_from_body():
    """A while loop: keep going while the running sum stays below the limit."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "step"], ["s_out"]),
         helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"])],
        "body", [_t("i", TP.INT64, []), _t("cond_in", TP.BOOL, []), _t("s_in", F, None)],
        [_t("cond_out", TP.BOOL, []), _t("s_out", F, None)])
    loop = helper.make_node("Loop", ["", "go", "s0"], ["s"], body=body)
    m = _model([loop], [_t("go", TP.BOOL, []), _t("s0", F, ["a"]), _t("step", F, ["a"]), _t("limit", F, [])],
               [_t("s", F, None)])
    rng = np.random.default_rng(4)
    feeds = [{"go": np.array(True), "s0": rand((a,), rng=rng, low=0.0, high=1.0),
              "step": rand((a,), rng=rng, low=0.5, high=1.0), "limit": np.array(lim, np.float32)}
             for a, lim in [(2, 5.0), (3, 20.0), (1, 2.0), (2, 5.0)]]
    run_sequence(m, feeds)


def test_scan_forward_and_reverse_over_changing_lengths():
    """Running sum (state) and per-step outputs, one scan input read in reverse and one scan
    output written along axis 1."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "a"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "b"], ["prod"])],
        "body", [_t("acc_in", F, None), _t("a", F, None), _t("b", F, None)],
        [_t("acc_out", F, None), _t("prod", F, None)])
    scan = helper.make_node("Scan", ["acc0", "xa", "xb"], ["acc", "ys"], body=body, num_scan_inputs=2,
                            scan_input_directions=[0, 1], scan_output_axes=[1])
    m = _model([scan], [_t("acc0", F, ["c"]), _t("xa", F, ["t", "c"]), _t("xb", F, ["t", "c"])],
               [_t("acc", F, None), _t("ys", F, None)])
    rng = np.random.default_rng(5)
    feeds = [{"acc0": rand((c,), rng=rng), "xa": rand((t, c), rng=rng), "xb": rand((t, c), rng=rng)}
             for t, c in [(4, 3), (7, 2), (1, 2), (4, 3)]]
    run_sequence(m, feeds, references=("ort",))  # the reference evaluator's Scan reads forward only


def test_sequence_map_over_tensors_of_changing_shapes():
    body = helper.make_graph([helper.make_node("Add", ["e", "bias"], ["o"]),
                              helper.make_node("Shape", ["e"], ["shp"])],
                             "body", [_t("e", F, None), _t("bias", F, None)], [_t("o", F, None),
                                                                                 _t("shp", TP.INT64, None)])
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["s"], axis=0),
             helper.make_node("SequenceMap", ["s", "bias"], ["outs", "shapes"], body=body),
             helper.make_node("ConcatFromSequence", ["shapes"], ["all_shapes"], axis=0, new_axis=1)]
    m = _model(nodes, [_t("x", F, ["n", 2]), _t("sizes", TP.INT64, ["k"]), _t("bias", F, [2])],
               [_seq("outs"), _t("all_shapes", TP.INT64, None)])
    rng = np.random.default_rng(6)
    feeds = [{"x": rand((sum(s), 2), rng=rng), "sizes": np.array(s, np.int64), "bias": rand((2,), rng=rng)}
             for s in ([1, 2], [3, 1, 2], [4], [1, 2])]
    run_sequence(m, feeds)


def test_optional_present_and_empty():
    """If picks an empty optional or one holding x; OptionalHasElement reports which."""
    then_g = helper.make_graph([helper.make_node("Optional", ["x"], ["o"])], "t", [],
                               [helper.make_tensor_value_info("o", F, None)])
    then_g.output[0].type.CopyFrom(helper.make_optional_type_proto(helper.make_tensor_type_proto(F, None)))
    else_g = helper.make_graph([helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(F, None))],
                               "e", [], [helper.make_tensor_value_info("o", F, None)])
    else_g.output[0].type.CopyFrom(then_g.output[0].type)
    nodes = [helper.make_node("If", ["c"], ["opt"], then_branch=then_g, else_branch=else_g),
             helper.make_node("OptionalHasElement", ["opt"], ["has"])]
    m = _model(nodes, [_t("c", TP.BOOL, []), _t("x", F, ["n"])], [_t("has", TP.BOOL, [])])
    rng = np.random.default_rng(7)
    # the reference evaluator reports an element in the empty optional of the else branch
    run_sequence(m, [{"c": np.array(c), "x": rand((n,), rng=rng)} for c, n in [(True, 2), (False, 3), (True, 5)]],
                 references=("ort",))


def test_bad_sequence_feed_is_a_typed_error_then_the_session_works():
    import dynashape
    from dynashape.errors import InputTypeError
    m = _model([helper.make_node("SequenceLength", ["s"], ["n"])], [_seq("s")], [_t("n", TP.INT64, [])])
    sess = dynashape.InferenceSession(m)
    for bad, words in (([rand((2,)), rand((3,)).astype(np.float64)], ["'s'", "element 1", "double", "float"]),
                       ([rand((2,)), "text"], ["'s'", "element 1", "str"])):
        try:
            sess.run(None, {"s": bad})
        except InputTypeError as e:
            assert all(w in str(e) for w in words), str(e)
        else:
            raise AssertionError("no error for a bad sequence element")
    assert int(sess.run(None, {"s": [rand((2,)), rand((4,))]})[0]) == 2

"""``hoist_loop_invariants`` (compile/hoist_loop_invariants.py): a Loop body's nodes that compute the
same value every iteration move before the Loop. Models run over changing shapes and trip counts
(none too) with fresh random inputs in the compiled session (fused graph: hoisted), the
interpreter (the graph as it was) and onnxruntime; what varies stays in the body."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from dynashape.compile.hoist_loop_invariants import hoist_loop_invariants
from tests.compile.test_fusion import check_sequence

F = TP.FLOAT
H = 6


def _loop_model(nested: bool = False) -> onnx.ModelProto:
    """s_{i+1} = tanh(s_i + feat @ W * 0.5 + i) over M iterations; W carried through the body as
    paddle2onnx carries weights (Squeeze(Add(Unsqueeze(w, 0), 0), 0)); ``feat @ W``, its scaling and
    a Transpose of ``feat`` are invariant; the iteration's term is not. With ``nested``, the step
    itself is a Loop of 2 inner iterations whose invariant is the outer body's ``feat @ W``."""
    rng = np.random.default_rng(0)
    c = [numpy_helper.from_array(np.array([0], np.int64), "ax0"), numpy_helper.from_array(np.array(0.0, np.float32),
                                                                                           "zero"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(2, np.int64), "two"),
         numpy_helper.from_array(np.array(True), "yes")]
    step = [helper.make_node("MatMul", ["feat", "w_in"], ["proj"]),
            helper.make_node("Mul", ["proj", "half"], ["scaled"]),
            helper.make_node("Transpose", ["feat"], ["feat_t"], perm=[1, 0]),
            helper.make_node("ReduceMean", ["feat_t"], ["tsum"], keepdims=0, axes=[1]),
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Add", ["scaled", "fi"], ["term"])]
    if nested:
        inner = helper.make_graph(
            [helper.make_node("Mul", ["scaled", "half"], ["again"]),  # invariant over both Loops
             helper.make_node("Add", ["t", "again"], ["t2"]), helper.make_node("Tanh", ["t2"], ["t_out"]),
             helper.make_node("Identity", ["cj"], ["cj_out"])], "inner",
            [helper.make_tensor_value_info("j", TP.INT64, []), helper.make_tensor_value_info("cj", TP.BOOL, []),
             helper.make_tensor_value_info("t", F, ["b", H])],
            [helper.make_tensor_value_info("cj_out", TP.BOOL, []), helper.make_tensor_value_info("t_out", F, ["b", H])])
        step += [helper.make_node("Loop", ["two", "yes", "s"], ["s_inner"], body=inner),
                 helper.make_node("Add", ["s_inner", "term"], ["pre"])]
    else:
        step += [helper.make_node("Add", ["s", "term"], ["pre"])]
    step += [helper.make_node("Tanh", ["pre"], ["s_out"]),
             helper.make_node("Unsqueeze", ["w_in", "ax0"], ["w_u"]),
             helper.make_node("Add", ["w_u", "zero"], ["w_z"]),
             helper.make_node("Squeeze", ["w_z", "ax0"], ["w_out"]),
             helper.make_node("Identity", ["c"], ["c_out"]),
             helper.make_node("Identity", ["tsum"], ["scan"])]
    body = helper.make_graph(
        step, "body",
        [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("c", TP.BOOL, []),
         helper.make_tensor_value_info("s", F, ["b", H]), helper.make_tensor_value_info("w_in", F, [H, H])],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []), helper.make_tensor_value_info("s_out", F, ["b", H]),
         helper.make_tensor_value_info("w_out", F, [H, H]), helper.make_tensor_value_info("scan", F, [H])])
    w = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32) / 3, "w")
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["feat"]),
         helper.make_node("Loop", ["M", "", "s0", "w"], ["s_final", "w_final", "sums"], body=body)], "loop",
        [helper.make_tensor_value_info("x", F, ["b", H]), helper.make_tensor_value_info("s0", F, ["b", H]),
         helper.make_tensor_value_info("M", TP.INT64, [])],
        [helper.make_tensor_value_info("s_final", F, ["b", H]), helper.make_tensor_value_info("sums", F, ["m", H])],
        [w, *c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def _feeds(rng, cases):
    return [{"x": rng.standard_normal((b, H)).astype(np.float32), "s0": rng.standard_normal((b, H)).astype(np.float32),
             "M": np.array(m, np.int64)} for b, m in cases]


@pytest.mark.parametrize("nested", [False, True])
def test_invariant_nodes_move_before_the_loop_and_the_results_hold(nested):
    sess = check_sequence(_loop_model(nested), _feeds(np.random.default_rng(1), [(2, 3), (1, 5), (3, 0), (2, 1)]))
    g = sess.program.fused
    loop = next(n for n in g.nodes if n.op_type == "Loop")
    body = loop.subgraphs["body"]
    before = [n.op_type for n in g.nodes[:g.nodes.index(loop)]]
    # feat @ W (W read as the Loop's initial value), its scaling, the Transpose and its mean: out of the body
    for op in ("MatMul", "Mul", "Transpose", "ReduceMean"):
        assert op in before and op not in [n.op_type for n in body.nodes], (before, [n.op_type for n in body.nodes])
    assert "Cast" in [n.op_type for n in body.nodes]  # the iteration's term stays
    if nested:  # the inner body's invariant moved out of both Loops
        assert before.count("Mul") == 2
        inner = next(n for n in body.nodes if n.op_type == "Loop").subgraphs["body"]
        assert [n.op_type for n in inner.nodes if n.op_type == "Mul"] == []


def test_a_body_output_and_what_reads_the_iteration_stay():
    """The pass on the parsed graph: nodes feeding a body output (an ONNX graph's outputs are its own
    values) and nodes reading the iteration number or a carried value that changes are kept."""
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model, prepare_proto
    g = parse_model(prepare_proto(_loop_model()), ParseOptions())
    hoist_loop_invariants(g)
    body = next(n for n in g.nodes if n.op_type == "Loop").subgraphs["body"]
    kept = [n.op_type for n in body.nodes]
    # the carried weight's hand-back ends in a body output: its last node stays, the rest moves; the
    # scan output's Identity is a body output too
    assert kept.count("Unsqueeze") == 0 and kept.count("Squeeze") == 1 and "Identity" in kept
    assert "Tanh" in kept and "Cast" in kept
    assert {v.name for v in body.outer} >= {"scaled", "tsum"}  # what the body now reads from outside


def test_cpu_and_cuda_sessions_hoist_and_others_keep_their_loop_bodies(monkeypatch):
    from dynashape.compile import pipeline
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model, prepare_proto

    def body_ops(device):
        g = pipeline.compile_graph(parse_model(prepare_proto(_loop_model()), ParseOptions()), device=device).fused
        return [n.op_type for n in next(n for n in g.nodes if n.op_type == "Loop").subgraphs["body"].nodes]
    # (on CUDA the product is fused to Linear: what stays in the body is checked by op type, either name)
    assert not {"MatMul", "Linear"} & set(body_ops("cpu")) and not {"MatMul", "Linear"} & set(body_ops("cuda"))
    monkeypatch.setattr(pipeline, "HOIST_DEVICES", ("cpu",))  # a device the pass is not checked on
    assert {"MatMul", "Linear"} & set(body_ops("cuda"))

"""Ifs whose condition the shapes decide (compile/shape_program.py ``_taken_branch``): exporters
write ``x.squeeze(0)`` as "If dim 0 is 1, Squeeze, else Identity", and silero-vad nests such Ifs
on the ranks of each other's results. A specialization traces the branch its signature takes as
inline code, the test a guard; another signature gets another specialization. A condition that
comes from data stays a break point (the If runs its body)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper

import dynashape

from .test_guards_and_breaks import ORT_ATOL, ORT_RTOL, compare_all, const, make_model, ort_session, rand


def _squeeze_if(name: str, x: str, out: str) -> list:
    """``out`` = Squeeze(x, 0) when x's dim 0 is 1, else x: the If an exporter writes."""
    then_g = helper.make_graph([helper.make_node("Squeeze", [x, "zero"], [f"{name}_sq"])], f"{name}_then", [],
                               [helper.make_tensor_value_info(f"{name}_sq", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Identity", [x], [f"{name}_id"])], f"{name}_else", [],
                               [helper.make_tensor_value_info(f"{name}_id", TP.FLOAT, None)])
    return [helper.make_node("Shape", [x], [f"{name}_shape"]),
            helper.make_node("Gather", [f"{name}_shape", "zero_i"], [f"{name}_d0"]),
            helper.make_node("Equal", [f"{name}_d0", "one"], [f"{name}_is1"]),
            helper.make_node("If", [f"{name}_is1"], [out], name=name, then_branch=then_g, else_branch=else_g)]


def _model(nested: bool = False):
    nodes = _squeeze_if("sq", "x", "s")
    inits = [const([0], "zero", np.int64), const(0, "zero_i", np.int64), const(1, "one", np.int64),
             const(2.0, "two", np.float32)]
    if nested:  # a second If on the first one's rank (Shape -> Size -> Equal), as silero-vad's
        rank_then = helper.make_graph([helper.make_node("Unsqueeze", ["s", "zero"], ["r_un"])], "r_then", [],
                                      [helper.make_tensor_value_info("r_un", TP.FLOAT, None)])
        rank_else = helper.make_graph([helper.make_node("Neg", ["s"], ["r_neg"])], "r_else", [],
                                      [helper.make_tensor_value_info("r_neg", TP.FLOAT, None)])
        nodes += [helper.make_node("Shape", ["s"], ["s_shape"]), helper.make_node("Size", ["s_shape"], ["s_rank"]),
                  helper.make_node("Equal", ["s_rank", "one"], ["s_is_vec"]),
                  helper.make_node("If", ["s_is_vec"], ["r"], name="rank_if", then_branch=rank_then,
                                   else_branch=rank_else)]
        last = "r"
    else:
        last = "s"
    nodes.append(helper.make_node("Mul", [last, "two"], ["y"]))
    return make_model(nodes, [("x", TP.FLOAT, ["N", 4])], ["y"], inits)


def _sources(sess) -> str:
    return "\n".join(spec.source for spec in sess.compiled.specs)


def test_a_squeeze_if_runs_as_the_branch_its_batch_takes():
    rng = np.random.default_rng(3)
    seq = [{"x": rand(rng, (n, 4))} for n in (1, 3, 1, 5, 2, 1)]
    comp = compare_all(_model(), seq)
    s = comp.stats()
    # batch 1 squeezes, the others pass x on: one specialization each, the If decided in both
    assert s["specializations"] == 2 and s["ifs_decided_by_shapes"] == 2
    src = _sources(comp)
    assert "st.sub[" not in src  # no body call left: the branches are lines of the runner
    assert "!= 1" in src or "== 1" in src or "- 1" in src  # the dim test is a guard


def test_nested_ifs_on_a_rank_are_decided_one_after_the_other():
    rng = np.random.default_rng(4)
    seq = [{"x": rand(rng, (n, 4))} for n in (3, 1, 1, 6, 1)]
    comp = compare_all(_model(nested=True), seq)
    s = comp.stats()
    assert s["specializations"] == 2 and s["ifs_decided_by_shapes"] == 4  # two Ifs in each
    assert "st.sub[" not in _sources(comp)


def test_a_condition_from_data_stays_a_break_point():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t_out"])], "t", [],
                               [helper.make_tensor_value_info("t_out", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e_out"])], "e", [],
                               [helper.make_tensor_value_info("e_out", TP.FLOAT, None)])
    m = make_model([helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                    helper.make_node("Greater", ["total", "zero_f"], ["pos"]),
                    helper.make_node("If", ["pos"], ["y"], name="by_data", then_branch=then_g, else_branch=else_g)],
                   [("x", TP.FLOAT, ["N", 4])], ["y"], [const(0.0, "zero_f", np.float32)])
    rng = np.random.default_rng(5)
    comp, ref = dynashape.InferenceSession(m, executor="compiled"), ort_session(m)
    for n, lo in ((2, 0.5), (2, -1.5), (3, 0.5), (3, -1.5)):  # both branches at each batch
        feeds = {"x": rand(rng, (n, 4), low=lo, high=lo + 1)}
        np.testing.assert_allclose(comp.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=ORT_RTOL, atol=ORT_ATOL)
    assert comp.stats().get("ifs_decided_by_shapes", 0) == 0
    assert "st.sub[" in _sources(comp)  # the If's body runs: its condition is data


def test_a_condition_on_a_dim_known_only_at_run_time_stays_a_break_point():
    """The count of NonZero's result is a runtime symbol: no guard can be checked before the run, so
    the If on it runs its body (a squeeze when exactly one element is nonzero)."""
    sq_then = helper.make_graph([helper.make_node("Squeeze", ["nzf", "one_ax"], ["t_out"])], "t", [],
                                [helper.make_tensor_value_info("t_out", TP.FLOAT, None)])
    sq_else = helper.make_graph([helper.make_node("Identity", ["nzf"], ["e_out"])], "e", [],
                                [helper.make_tensor_value_info("e_out", TP.FLOAT, None)])
    m = make_model([helper.make_node("Greater", ["x", "zero_f"], ["pos"]),
                    helper.make_node("NonZero", ["pos"], ["nz"]),
                    helper.make_node("Cast", ["nz"], ["nzf"], to=TP.FLOAT),
                    helper.make_node("Shape", ["nz"], ["nz_shape"]),
                    helper.make_node("Gather", ["nz_shape", "one_i"], ["count"]),
                    helper.make_node("Equal", ["count", "one_i"], ["single"]),
                    helper.make_node("If", ["single"], ["y"], name="by_count", then_branch=sq_then,
                                     else_branch=sq_else)],
                   [("x", TP.FLOAT, ["N", 4])], ["y"],
                   [const(0.0, "zero_f", np.float32), const(1, "one_i", np.int64), const([1], "one_ax", np.int64)])
    comp, ref = dynashape.InferenceSession(m, executor="compiled"), ort_session(m)
    rng = np.random.default_rng(6)
    for n, hits in ((2, 1), (2, 3), (3, 1), (3, 5), (2, 1)):
        x = -np.abs(rand(rng, (n, 4)))
        x.reshape(-1)[rng.choice(n * 4, hits, replace=False)] = 1.0  # exactly ``hits`` positive elements
        got, want = comp.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert comp.stats().get("ifs_decided_by_shapes", 0) == 0

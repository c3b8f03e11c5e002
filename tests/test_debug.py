"""Intermediate values as outputs (extra_outputs) and first_divergence against onnxruntime."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.debug import first_divergence
from dynashape.errors import OptionsError
from dynashape.ops import registry

from .helpers import rand


def _model() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).uniform(-1, 1, (4, 5)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm_node"),
             helper.make_node("Relu", ["mm"], ["act"], name="act_node"),
             helper.make_node("ReduceSum", ["act"], ["s"], name="sum_node", keepdims=1),
             helper.make_node("Add", ["act", "s"], ["y"], name="add_node")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 5])], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_extra_outputs_follow_the_models_own(executor):
    import onnxruntime as ort
    m = _model()
    s = dynashape.InferenceSession(m, executor=executor, extra_outputs=["act", "mm"])
    assert [a.name for a in s.get_outputs()] == ["y", "act", "mm"]
    w = onnx.numpy_helper.to_array(m.graph.initializer[0])
    for n in (3, 1, 6):
        x = rand(n, 4)
        y, act, mm = s.run(None, {"x": x})
        np.testing.assert_allclose(mm, x @ w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(act, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    every = dynashape.InferenceSession(m, executor=executor, extra_outputs="all")
    assert [a.name for a in every.get_outputs()] == ["y", "mm", "act", "s"]


def test_extra_outputs_names_must_exist():
    with pytest.raises(OptionsError, match="nope"):
        dynashape.InferenceSession(_model(), extra_outputs=["nope"])


def test_first_divergence_agrees_on_a_right_model():
    rows = first_divergence(_model(), {"x": rand(3, 4)}, all_rows=True)
    assert [r.output for r in rows] == ["mm", "act", "s", "y"]
    assert all(r.max_abs < 1e-5 for r in rows)


def test_first_divergence_names_the_node_that_parts(monkeypatch):
    # a Relu that lets a little through below zero: what a wrong kernel looks like from outside
    key = ("", "Relu")
    versions = registry._REGISTRY[key]
    leaky = [dataclasses.replace(v, fn=lambda x, out=None: torch_leaky(x, out)) for v in versions]
    monkeypatch.setitem(registry._REGISTRY, key, leaky)
    x = rand(3, 4) * 3
    rows = first_divergence(_model(), {"x": x})
    assert rows and rows[0].node == "act_node" and rows[0].op_type == "Relu" and rows[0].max_abs > 1e-3
    assert rows[0].output == "act"


def torch_leaky(x, out):
    import torch
    y = torch.nn.functional.leaky_relu(x, 0.1)
    return out.copy_(y) if out is not None else y


def _scalar_model() -> onnx.ModelProto:
    """0-d intermediates: a norm of x (ReduceSumSquare to a scalar, Sqrt), x divided by it, and a
    scalar count from the shape (Size -> Cast) subtracted."""
    nodes = [helper.make_node("ReduceSumSquare", ["x"], ["ss"], name="ss_node", keepdims=0),
             helper.make_node("Sqrt", ["ss"], ["norm"], name="norm_node"),
             helper.make_node("Div", ["x", "norm"], ["unit"], name="unit_node"),
             helper.make_node("Size", ["x"], ["count"], name="count_node"),
             helper.make_node("Cast", ["count"], ["countf"], name="countf_node", to=TP.FLOAT),
             helper.make_node("Reciprocal", ["countf"], ["inv"], name="inv_node"),
             helper.make_node("Sub", ["unit", "inv"], ["y"], name="y_node")]
    g = helper.make_graph(nodes, "scalars", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", "m"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", "m"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_first_divergence_compares_0d_values():
    rng = np.random.default_rng(5)
    for shape in [(3, 4), (1, 7), (5, 2), (3, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        rows = first_divergence(_scalar_model(), {"x": x}, all_rows=True)
        assert [r.output for r in rows] == ["ss", "norm", "unit", "count", "countf", "inv", "y"], shape
        assert all(r.max_abs <= 1e-5 for r in rows), rows
        assert first_divergence(_scalar_model(), {"x": x}) == []


def test_first_divergence_names_a_0d_node_that_parts(monkeypatch):
    key = ("", "Sqrt")  # a square root off by 1%: the first value to part is a 0-d one
    versions = registry._REGISTRY[key]
    off = [dataclasses.replace(v, fn=lambda x, out=None: _scaled_sqrt(x, out)) for v in versions]
    monkeypatch.setitem(registry._REGISTRY, key, off)
    x = np.random.default_rng(6).standard_normal((4, 3)).astype(np.float32)
    # (the interpreter calls the registered kernel; the generated code calls torch.sqrt itself)
    rows = first_divergence(_scalar_model(), {"x": x}, executor="interpreter")
    assert rows and rows[0].node == "norm_node" and rows[0].output == "norm" and rows[0].max_abs > 1e-3, rows


def _scaled_sqrt(x, out):
    import torch
    y = torch.sqrt(x) * 1.01
    return out.copy_(y) if out is not None else y


def test_compare_values_of_0d_and_infinite_values():
    from dynashape.debug import compare_values
    assert compare_values(np.float32(2.0), np.float32(2.0), 1e-4, 1e-5) == (0.0, False, "")
    err, bad, _ = compare_values(np.float32(2.5), np.float32(2.0), 1e-4, 1e-5)
    assert bad and err == 0.5
    inf = np.array([-np.inf, 1.0, np.nan], np.float32)
    assert compare_values(inf, inf.copy(), 1e-4, 1e-5)[1] is False  # a mask's -inf equals -inf
    assert compare_values(np.array([np.inf], np.float32), np.array([-np.inf], np.float32), 1e-4, 1e-5)[1] is True


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_extra_outputs_return_an_initializer_and_an_input_as_onnxruntime_does(executor):
    """onnxruntime returns a graph output that is an initializer (the constant) or an input (the
    feed): extra_outputs naming one does the same."""
    import onnxruntime as ort
    m = _model()
    s = dynashape.InferenceSession(m, executor=executor, extra_outputs=["w", "act", "x"])
    assert [a.name for a in s.get_outputs()] == ["y", "w", "act", "x"]
    plain = onnx.ModelProto()
    plain.CopyFrom(m)
    for name in ("w", "act", "x"):
        plain.graph.output.append(helper.make_tensor_value_info(name, TP.FLOAT, None))
    ref = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for n in (3, 1, 6):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got, want = s.run(None, {"x": x}), ref.run(None, {"x": x})
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[1], onnx.numpy_helper.to_array(m.graph.initializer[0]))
        np.testing.assert_array_equal(got[3], x)


def test_extra_outputs_unknown_name_says_what_names_are_allowed():
    with pytest.raises(OptionsError, match=r"\['nope'\], which is no node output, initializer or input"):
        dynashape.InferenceSession(_model(), extra_outputs=["w", "nope"])


def _branchy_model() -> onnx.ModelProto:
    """An If on an input whose branches read values of the main graph (``mm``, the initializer
    ``w``): its then branch holds an initializer of its own and a second If, on a condition computed
    inside the branch, whose then branch has the Relu; its else branch a Loop whose body reads the
    branch's value ``e`` (a name the inlining renames) and the main graph's ``mm``."""
    f = TP.FLOAT
    rng = np.random.default_rng(1)
    w = onnx.numpy_helper.from_array(rng.uniform(-1, 1, (4, 5)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.uniform(-1, 1, (5,)).astype(np.float32), "b")
    vi = helper.make_tensor_value_info
    inner_then = helper.make_graph([helper.make_node("Relu", ["t1"], ["r"], name="relu_node"),
                                    helper.make_node("Mul", ["r", "mm"], ["rm"], name="mul_node")],
                                   "inner_then", [], [vi("rm", f, None)])
    inner_else = helper.make_graph([helper.make_node("Neg", ["t1"], ["ng"], name="neg_node")],
                                   "inner_else", [], [vi("ng", f, None)])
    then = helper.make_graph([helper.make_node("Add", ["mm", "b"], ["t1"], name="add_node"),
                              helper.make_node("Abs", ["t1"], ["ab"], name="abs_node"),
                              helper.make_node("ReduceMax", ["ab"], ["mx"], name="max_node", keepdims=0),
                              helper.make_node("Constant", [], ["zero"], name="zero_node",
                                               value=helper.make_tensor("z", f, [], [0.0])),
                              helper.make_node("Greater", ["mx", "zero"], ["c2"], name="gt_node"),
                              helper.make_node("If", ["c2"], ["t2"], name="inner", then_branch=inner_then,
                                               else_branch=inner_else)],
                             "then", [], [vi("t2", f, None)], initializer=[b])
    body = helper.make_graph([helper.make_node("Add", ["acc", "e"], ["acc1"], name="acc_node"),
                              helper.make_node("Sub", ["acc1", "mm"], ["acc2"], name="sub_node"),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond_node")],
                             "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc", f, None)],
                             [vi("cond_out", TP.BOOL, []), vi("acc2", f, None)])
    other = helper.make_graph([helper.make_node("Sigmoid", ["mm"], ["e"], name="sig_node"),
                               helper.make_node("Constant", [], ["trips"], name="trips_node",
                                                value=helper.make_tensor("n", TP.INT64, [], [2])),
                               helper.make_node("Loop", ["trips", "", "w"], ["lp"], name="loop_node", body=body)],
                              "else", [], [vi("lp", f, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm_node"),
             helper.make_node("If", ["cond"], ["chosen"], name="choose", then_branch=then, else_branch=other),
             helper.make_node("Add", ["chosen", "mm"], ["y"], name="y_node")]
    g = helper.make_graph(nodes, "g", [vi("x", f, [4, 4]), vi("cond", TP.BOOL, [])], [vi("y", f, [4, 5])],
                          initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_first_divergence_compares_the_values_inside_taken_branches():
    """Both branches of the If, the second If inside one (inlined on the second round, from the
    value of a condition computed inside the branch) and a Loop whose body reads a value of the
    branch around it: every inner value is compared, named through its If, and all agree."""
    rng = np.random.default_rng(2)
    m = _branchy_model()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    rows = first_divergence(m, {"x": x, "cond": np.array(True)}, all_rows=True)
    outs = [r.output for r in rows]
    assert outs == ["mm", "choose / then_branch / t1", "choose / then_branch / ab", "choose / then_branch / mx",
                    "choose / then_branch / zero", "choose / then_branch / c2",
                    "choose / then_branch / inner / then_branch / r", "choose / then_branch / inner / then_branch / rm",
                    "choose / then_branch / t2", "chosen", "y"], outs
    assert rows[6].node == "choose / then_branch / inner / then_branch / relu_node" and rows[6].op_type == "Relu"
    assert rows[9].node == "choose" and rows[9].op_type == "If"  # the If's output: its own, not the inlined copy's
    assert all(r.max_abs <= 1e-5 for r in rows), rows
    rows = first_divergence(m, {"x": x, "cond": np.array(False)}, all_rows=True)
    loop = "choose / else_branch / loop_node / iteration "
    assert [r.output for r in rows] == ["mm", "choose / else_branch / e", "choose / else_branch / trips",
                                        *[loop + f"{i} / {v}" for i in (0, 1)
                                          for v in ("cond_in", "acc1", "acc2", "cond_out")],
                                        "choose / else_branch / lp", "chosen", "y"]
    assert rows[-3].node == "choose / else_branch / loop_node" and rows[-3].op_type == "Loop"
    assert all(r.max_abs <= 1e-5 for r in rows), rows


def test_inlined_branches_compute_what_the_if_does():
    import onnxruntime as ort

    from dynashape.debug import inline_branches
    m = _branchy_model()
    x = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        flat = inline_branches(m, feeds)
        # the inner If and the Loop (in the other branch): a later round's
        assert sum(n.op_type in ("If", "Loop") for n in flat.graph.node) == 1
        onnx.checker.check_model(flat)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        got = ort.InferenceSession(flat.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
    plain = _model()
    assert inline_branches(plain, {"x": x}) is plain  # no If: the model itself


def test_first_divergence_names_a_node_inside_a_nested_branch(monkeypatch):
    """A wrong Relu kernel inside the second If (a branch of a branch, reading values of both
    scopes around it): the first row is that Relu, named through both Ifs."""
    key = ("", "Relu")
    versions = registry._REGISTRY[key]
    leaky = [dataclasses.replace(v, fn=lambda x, out=None: torch_leaky(x, out)) for v in versions]
    monkeypatch.setitem(registry._REGISTRY, key, leaky)
    x = np.random.default_rng(4).standard_normal((4, 4)).astype(np.float32) * 3
    rows = first_divergence(_branchy_model(), {"x": x, "cond": np.array(True)}, executor="interpreter")
    assert rows and rows[0].node == "choose / then_branch / inner / then_branch / relu_node", rows
    assert rows[0].op_type == "Relu" and rows[0].output == "choose / then_branch / inner / then_branch / r"
    assert rows[0].max_abs > 1e-3


def _loop_model() -> onnx.ModelProto:
    """A Loop over the rows of x (a word's characters): the trip count from x's shape, a condition
    computed in the body (it stops at the first row whose sum is below ``stop``, a while loop), the
    body reading the main graph's ``w`` and ``x`` (Gather of row i), an If inside it on the
    iteration's parity, a carried sum and a scanned row."""
    f = TP.FLOAT
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(11)
    w = onnx.numpy_helper.from_array(rng.uniform(-1, 1, (3, 3)).astype(np.float32), "w")
    two = onnx.numpy_helper.from_array(np.array(2, np.int64), "two")
    zero = onnx.numpy_helper.from_array(np.array(0, np.int64), "zero_i")
    odd = helper.make_graph([helper.make_node("Tanh", ["h"], ["th"], name="tanh_node")], "odd", [],
                            [vi("th", f, None)])
    even = helper.make_graph([helper.make_node("Neg", ["h"], ["nh"], name="neg_node")], "even", [],
                             [vi("nh", f, None)])
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["row"], name="row_node", axis=0),
         helper.make_node("MatMul", ["row", "w"], ["h"], name="h_node"),
         helper.make_node("Mod", ["i", "two"], ["par"], name="par_node"),
         helper.make_node("Equal", ["par", "zero_i"], ["is_even"], name="even_node"),
         helper.make_node("If", ["is_even"], ["hh"], name="parity", then_branch=even, else_branch=odd),
         helper.make_node("Add", ["acc", "hh"], ["acc_out"], name="acc_node"),
         helper.make_node("ReduceSum", ["row"], ["rs"], name="rs_node", keepdims=0),
         helper.make_node("Greater", ["rs", "stop"], ["go"], name="go_node"),
         helper.make_node("Identity", ["hh"], ["scan"], name="scan_node")],
        "body", [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("acc", f, [3])],
        [vi("go", TP.BOOL, []), vi("acc_out", f, [3]), vi("scan", f, [3])], initializer=[two, zero])
    nodes = [helper.make_node("Shape", ["x"], ["shp"], name="shape_node"),
             helper.make_node("Gather", ["shp", "zero"], ["n"], name="n_node", axis=0),
             helper.make_node("Loop", ["n", "true", "acc0"], ["acc", "rows"], name="chars", body=body),
             helper.make_node("ReduceSum", ["rows"], ["y"], name="y_node", keepdims=0)]
    g = helper.make_graph(nodes, "g", [vi("x", f, ["n", 3]), vi("stop", f, [])],
                          [vi("acc", f, [3]), vi("y", f, [])],
                          initializer=[w, onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
                                       onnx.numpy_helper.from_array(np.array(True), "true"),
                                       onnx.numpy_helper.from_array(np.zeros(3, np.float32), "acc0")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_first_divergence_unrolls_loops_as_onnxruntime_runs_them():
    """Every iteration that runs is compared (the count set by the condition, not the trip count:
    4 rows but a row sum below ``stop`` ends it early), the If inside each iteration too, and the
    unrolled copy computes what the Loop does, to the bit."""
    import onnxruntime as ort

    from dynashape.debug import inline_branches, loop_iterations
    m = _loop_model()
    x = np.array([[1, 2, 0], [2, 2, 2], [-5, 0, 0], [3, 3, 3]], np.float32)
    for stop, runs in ((0.5, 3), (-100.0, 4), (100.0, 1)):
        feeds = {"x": x, "stop": np.array(stop, np.float32)}
        assert loop_iterations(m, feeds) == {"acc": runs}
        flat = inline_branches(m, feeds, loop_iterations(m, feeds))
        assert not any(n.op_type == "Loop" for n in flat.graph.node)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        got = ort.InferenceSession(flat.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        rows = first_divergence(m, feeds, all_rows=True)
        assert all(r.max_abs <= 1e-5 for r in rows), rows
        names = {r.node for r in rows}
        assert f"chars / iteration {runs - 1} / h_node" in names and f"chars / iteration {runs} / h_node" not in names
        assert "chars / iteration 1 / parity / else_branch / tanh_node" in names or runs == 1
        assert "chars / iteration 0 / parity / then_branch / neg_node" in names
        assert [r.op_type for r in rows if r.output in ("acc", "rows")] == ["Loop", "Loop"]


def test_first_divergence_names_a_node_inside_a_loop_iteration(monkeypatch):
    """A wrong Tanh kernel (in the If of the odd iterations of the Loop): the first row is that Tanh in
    the Loop's second iteration."""
    key = ("", "Tanh")
    versions = registry._REGISTRY[key]
    off = [dataclasses.replace(v, fn=lambda x, out=None: _scaled_tanh(x, out)) for v in versions]
    monkeypatch.setitem(registry._REGISTRY, key, off)
    x = np.array([[1, 2, 0], [2, 2, 2], [-5, 0, 0], [3, 3, 3]], np.float32)
    rows = first_divergence(_loop_model(), {"x": x, "stop": np.array(0.5, np.float32)}, executor="interpreter")
    assert rows and rows[0].node == "chars / iteration 1 / parity / else_branch / tanh_node", rows
    assert rows[0].op_type == "Tanh" and rows[0].max_abs > 1e-3


def _scaled_tanh(x, out):
    import torch
    y = torch.tanh(x) * 1.01
    return out.copy_(y) if out is not None else y


def test_compare_values_relative_to_the_tensor_excuses_rounding_near_zero_only():
    """A sum of large terms that cancels to near zero differs by its rounding: element-wise rtol
    calls it a divergence, rtol times the value's largest magnitude does not; a real change still
    differs either way."""
    from dynashape.debug import compare_values
    w = np.array([100.0, -50.0, 1e-4], np.float32)
    g = w + np.array([0.0, 0.0, 3e-4], np.float32)  # the near-zero element off by 3e-4
    assert compare_values(g, w, 1e-4, 1e-5)[1] is True
    assert compare_values(g, w, 1e-4, 1e-5, relative_to="tensor")[1] is False
    assert compare_values(w * 1.01, w, 1e-4, 1e-5, relative_to="tensor")[1] is True

"""Specializations and their guards, the specialization cap, break points (data-dependent shapes),
arena growth under views and in-place concat, errors that name their node, and the generated source."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.errors import IndexOutOfRangeError, ShapeError

RTOL, ATOL = 1e-5, 1e-6
ORT_RTOL, ORT_ATOL = 1e-4, 1e-5


def make_model(nodes, inputs, outputs, inits=(), opset: int = 18) -> onnx.ModelProto:
    """``inputs``: (name, elem type, dims); outputs are float tensors of unknown shape."""
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def const(value, name: str, dtype=None):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def rand(rng, shape, low=-2.0, high=2.0) -> np.ndarray:
    x = rng.uniform(low, high, size=shape).astype(np.float32)
    x[np.abs(x) < 1e-3] = (low + high) / 2 or 0.5  # never zeros
    return x


def ort_session(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare_all(model, feeds_seq, torch_too: bool = True):
    """Run every feed dict through a compiled and an interpreter session and onnxruntime; compare."""
    comp = dynashape.InferenceSession(model, executor="compiled")
    interp = dynashape.InferenceSession(model, executor="interpreter")
    ref = ort_session(model)
    for step, feeds in enumerate(feeds_seq):
        got, want, base = comp.run(None, feeds), interp.run(None, feeds), ref.run(None, feeds)
        what = f"step {step} ({ {k: v.shape for k, v in feeds.items()} })"
        for i, (g, w, r) in enumerate(zip(got, want, base)):
            assert g.shape == w.shape == r.shape, f"{what} output {i}: {g.shape} {w.shape} {r.shape}"
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{what} output {i} vs interpreter")
            np.testing.assert_allclose(g, r, rtol=ORT_RTOL, atol=ORT_ATOL, err_msg=f"{what} output {i} vs ort")
        if torch_too:
            got_t = comp.run(None, {k: torch.from_numpy(v.copy()) for k, v in feeds.items()})
            for i, (g, w) in enumerate(zip(got_t, want)):
                assert isinstance(g, torch.Tensor)
                np.testing.assert_allclose(g.numpy(), w, rtol=RTOL, atol=ATOL, err_msg=f"{what} torch output {i}")
    stats = comp.stats()
    assert stats["compiled_runs"] == len(feeds_seq) * (2 if torch_too else 1)
    assert stats.get("interpreter_runs", 0) == 0
    return comp


# ---- a guard that fails ----------------------------------------------------------------------------
def broadcast_add(b_dims=(1, 4)) -> onnx.ModelProto:
    return make_model([helper.make_node("Add", ["x", "b"], ["y"], name="add")],
                      [("x", TP.FLOAT, ["N", 4]), ("b", TP.FLOAT, list(b_dims))], ["y"])


def test_broadcasting_against_a_literal_1_needs_no_guard():
    """[N, 4] + [1, 4] is [N, 4] whatever N is, 1 included: one specialization serves every N
    (asking ``N == 1`` made one for batch 1 and another for the rest)."""
    sess = dynashape.InferenceSession(broadcast_add(), executor="compiled")
    rng = np.random.default_rng(1)
    b = rand(rng, (1, 4))
    for n in (3, 1, 7, 1):
        x = rand(rng, (n, 4))
        (y,) = sess.run(None, {"x": x, "b": b})
        np.testing.assert_allclose(y, x + b, rtol=RTOL, atol=ATOL)
    s = sess.stats()
    assert (s["specializations"], s["shape_program_traces"], s.get("guard_misses", 0)) == (1, 1, 0)
    assert [g.source(str) for g in sess.compiled.specs[0].trace.guards if "N" in g.source(str)] == []


def test_a_failed_guard_makes_a_new_specialization_and_a_seen_signature_reuses_its_own():
    """[N, 4] + [M, 4]: which side broadcasts is decided on the values, a guard each time."""
    sess = dynashape.InferenceSession(broadcast_add(("M", 4)), executor="compiled")
    rng = np.random.default_rng(1)
    expected = [  # (N, M), specializations, traces, guard misses after the run
        ((3, 1), 1, 1, 0),
        ((3, 3), 2, 2, 1),  # N == M: the first one's guard M == 1 fails
        ((1, 3), 3, 3, 2),  # N broadcasts now
        ((5, 1), 3, 3, 2),  # the first specialization again: no new trace
        ((4, 4), 3, 3, 2),  # the second
    ]
    for step, ((n, m), specs, traces, misses) in enumerate(expected):
        x, b = rand(rng, (n, 4)), rand(rng, (m, 4))
        (y,) = sess.run(None, {"x": x, "b": b})
        np.testing.assert_allclose(y, x + b, rtol=RTOL, atol=ATOL)
        s = sess.stats()
        assert (s["specializations"], s["shape_program_traces"], s.get("guard_misses", 0)) == (specs, traces, misses), \
            f"step {step} (N, M = {n}, {m}): {s}"
        assert s["compiled_runs"] == step + 1 and s.get("interpreter_runs", 0) == 0
    first, second, third = sess.compiled.specs
    assert first.accepts(((3, 4), (1, 4))) and first.accepts(((7, 4), (1, 4))) and not first.accepts(((3, 4), (3, 4)))
    assert second.accepts(((3, 4), (3, 4))) and not second.accepts(((3, 4), (1, 4)))
    assert third.accepts(((1, 4), (5, 4))) and not third.accepts(((2, 4), (5, 4)))
    assert "M - 1 == 0" in [g.source(str) for g in first.trace.guards]


def test_the_specialization_cap_hands_over_to_the_interpreter(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_MAX_SPECIALIZATIONS", "1")
    sess = dynashape.InferenceSession(broadcast_add(("M", 4)), executor="compiled")
    rng = np.random.default_rng(2)
    runs = [((3, 1), 1, 0), ((3, 3), 1, 1), ((5, 1), 2, 1), ((3, 3), 2, 2), ((3, 1), 3, 2)]  # compiled, interpreted
    for (n, m), compiled, interpreted in runs:
        x, b = rand(rng, (n, 4)), rand(rng, (m, 4))
        (y,) = sess.run(None, {"x": x, "b": b})
        np.testing.assert_allclose(y, x + b, rtol=RTOL, atol=ATOL)
        s = sess.stats()
        assert s["specializations"] == 1 and s["shape_program_traces"] == 1
        assert (s["compiled_runs"], s.get("interpreter_runs", 0)) == (compiled, interpreted), s
    assert sess.stats()["specializations_refused"] >= 1
    # torch feeds take the same way
    x, b = torch.from_numpy(rand(rng, (3, 4))), torch.from_numpy(rand(rng, (3, 4)))
    (y,) = sess.run(None, {"x": x, "b": b})
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), x.numpy() + b.numpy(), rtol=RTOL, atol=ATOL)
    assert sess.stats()["interpreter_runs"] == 3


def test_without_the_cap_every_signature_is_compiled(monkeypatch):
    monkeypatch.delenv("DYNASHAPE_MAX_SPECIALIZATIONS", raising=False)
    sess = dynashape.InferenceSession(broadcast_add(("M", 4)), executor="compiled")
    rng = np.random.default_rng(3)
    for n, m in ((3, 1), (3, 3), (5, 1), (3, 3), (3, 1)):
        x, b = rand(rng, (n, 4)), rand(rng, (m, 4))
        np.testing.assert_allclose(sess.run(None, {"x": x, "b": b})[0], x + b, rtol=RTOL, atol=ATOL)
    s = sess.stats()
    assert s.get("interpreter_runs", 0) == 0 and s["compiled_runs"] == 5 and s["specializations"] == 2


# ---- break points ----------------------------------------------------------------------------------
def nonzero_model() -> onnx.ModelProto:
    """NonZero in the middle: K (the count of x > 0) is known only once it ran, and the ops after it
    (an outer product, a softmax, reductions) work on [K] and [K, K]."""
    return make_model([
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Greater", ["s", "half"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["nz"], name="the_nonzero"),
        helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
        helper.make_node("GatherND", ["x", "idx"], ["vals"]),  # [K]
        helper.make_node("Unsqueeze", ["vals", "ax0"], ["row"]),  # [1, K]
        helper.make_node("Transpose", ["row"], ["col"], perm=[1, 0]),  # [K, 1]
        helper.make_node("MatMul", ["col", "row"], ["outer"]),  # [K, K]
        helper.make_node("Softmax", ["outer"], ["sm"], axis=-1),
        helper.make_node("ReduceSum", ["sm", "ax1"], ["rs"], keepdims=0),  # [K]
        helper.make_node("Add", ["rs", "vals"], ["y"]),
        helper.make_node("Cast", ["nz"], ["nzf"], to=TP.FLOAT),
        helper.make_node("ReduceSum", ["nzf", "ax1"], ["y2"], keepdims=0),  # [2]: sums of the positions
    ], [("x", TP.FLOAT, ["N", "M"])], ["y", "y2"],
        [const(0.5, "half", np.float32), const([0], "ax0", np.int64), const([1], "ax1", np.int64)])


def test_nonzero_in_the_middle_of_a_graph():
    rng = np.random.default_rng(4)
    feeds = [{"x": rand(rng, s)} for s in [(3, 4), (3, 4), (5, 2), (3, 4), (1, 1), (6, 7)]]
    feeds.append({"x": rand(rng, (3, 4), -2.0, -0.5)})  # nothing is positive: K = 0
    feeds.append({"x": rand(rng, (3, 4), 0.5, 2.0)})  # everything is: K = 12
    comp = compare_all(nonzero_model(), feeds)
    # the data changes K, the shapes only N and M: one specialization serves them all
    assert comp.stats()["specializations"] == 1
    kinds = {n.node.name: n.kind for n in comp.compiled.specs[0].trace.nodes}
    assert kinds["the_nonzero"] == "dyn"
    assert comp.compiled.specs[0].trace.runtime_symbols  # NonZero's K


def unique_model(rng) -> onnx.ModelProto:
    return make_model([
        helper.make_node("Add", ["ids", "one"], ["ids1"]),
        helper.make_node("Unique", ["ids1"], ["u", "first", "inverse", "counts"], sorted=1, name="the_unique"),
        helper.make_node("Gather", ["emb", "u"], ["e"], axis=0),  # [U, 3]
        helper.make_node("Cast", ["counts"], ["cf"], to=TP.FLOAT),
        helper.make_node("Unsqueeze", ["cf", "ax1"], ["cf2"]),  # [U, 1]
        helper.make_node("Mul", ["e", "cf2"], ["weighted"]),  # [U, 3]
        helper.make_node("Gather", ["weighted", "inverse"], ["back"], axis=0),  # [L, 3]
        helper.make_node("Softmax", ["back"], ["y"], axis=0),
        helper.make_node("ReduceMean", ["weighted", "ax0"], ["y2"], keepdims=1),  # [1, 3]
    ], [("ids", TP.INT64, ["L"])], ["y", "y2"],
        [const(1, "one", np.int64), numpy_helper.from_array(rand(rng, (8, 3)), "emb"),
         const([0], "ax0", np.int64), const([1], "ax1", np.int64)])


def test_unique_in_the_middle_of_a_graph():
    rng = np.random.default_rng(5)
    lengths = [5, 5, 9, 1, 5, 12, 9]
    feeds = [{"ids": rng.integers(0, 7, n).astype(np.int64)} for n in lengths]
    feeds.append({"ids": np.full(6, 3, np.int64)})  # one distinct value
    comp = compare_all(unique_model(rng), feeds)
    assert comp.stats()["specializations"] == 1


def topk_model() -> onnx.ModelProto:
    """TopK whose k is ReduceMax of an int input: the [N, k] results feed a softmax, a matmul and a concat."""
    return make_model([
        helper.make_node("ReduceMax", ["kin"], ["k"], keepdims=1),  # [1]
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node("TopK", ["t", "k"], ["vals", "idx"], axis=1, name="the_topk"),  # [N, k]
        helper.make_node("Cast", ["idx"], ["idxf"], to=TP.FLOAT),
        helper.make_node("Add", ["vals", "idxf"], ["s"]),
        helper.make_node("Softmax", ["s"], ["sm"], axis=-1),
        helper.make_node("Transpose", ["sm"], ["smt"], perm=[1, 0]),  # [k, N]
        helper.make_node("MatMul", ["smt", "x"], ["y"]),  # [k, M]
        helper.make_node("Concat", ["vals", "sm"], ["y2"], axis=1),  # [N, 2k]
    ], [("x", TP.FLOAT, ["N", "M"]), ("kin", TP.INT64, ["A"])], ["y", "y2"])


def test_topk_with_k_from_data():
    rng = np.random.default_rng(6)

    def feeds(n, m, a, k=None):
        kin = rng.integers(1, m + 1, a).astype(np.int64)
        if k is not None:
            kin[:] = k
        return {"x": rand(rng, (n, m)), "kin": kin}
    seq = [feeds(3, 5, 2, 2), feeds(3, 5, 2, 4), feeds(4, 6, 3), feeds(3, 5, 2, 2), feeds(1, 1, 1), feeds(6, 6, 2, 6)]
    comp = compare_all(topk_model(), seq)
    assert comp.stats()["specializations"] == 1
    kinds = {n.node.name: n.kind for n in comp.compiled.specs[0].trace.nodes}
    assert kinds["the_topk"] == "dyn"


def reshape_from_data_model() -> onnx.ModelProto:
    return make_model([
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Reshape", ["s", "shp"], ["r"], name="the_reshape"),  # [P, Q] from the data of shp
        helper.make_node("Transpose", ["r"], ["rt"], perm=[1, 0]),
        helper.make_node("MatMul", ["r", "rt"], ["g"]),  # [P, P]
        helper.make_node("Softmax", ["g"], ["sm"], axis=-1),
        helper.make_node("MatMul", ["sm", "r"], ["y"]),  # [P, Q]
        helper.make_node("ReduceSum", ["r", "ax0"], ["y2"], keepdims=1),  # [1, Q]
    ], [("x", TP.FLOAT, ["N", "M"]), ("shp", TP.INT64, [2])], ["y", "y2"], [const([0], "ax0", np.int64)])


def test_reshape_whose_target_comes_from_data():
    rng = np.random.default_rng(7)

    def feeds(n, m, shp):
        return {"x": rand(rng, (n, m)), "shp": np.array(shp, np.int64)}
    seq = [feeds(3, 4, [4, 3]), feeds(3, 4, [2, 6]), feeds(3, 4, [12, -1]), feeds(2, 5, [1, 10]),
           feeds(3, 4, [4, 3]), feeds(1, 1, [1, 1]), feeds(4, 4, [-1, 2])]
    comp = compare_all(reshape_from_data_model(), seq)
    assert comp.stats()["specializations"] == 1
    assert {n.node.name: n.kind for n in comp.compiled.specs[0].trace.nodes}["the_reshape"] == "dyn"


# ---- arena growth under views and in-place concat ---------------------------------------------------
def views_and_concat() -> onnx.ModelProto:
    """Reshape, Transpose and Slice of intermediates; two branches concatenated (written in place)."""
    return make_model([
        helper.make_node("Relu", ["x"], ["a"]),  # [N, 8]
        helper.make_node("Reshape", ["a", "to4"], ["r"]),  # [2N, 4]
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),  # [4, 2N]
        helper.make_node("Slice", ["t", "s0", "e3", "ax0"], ["top"]),  # [3, 2N]
        helper.make_node("Slice", ["t", "s1", "e4", "ax0"], ["bottom"]),  # [3, 2N]
        helper.make_node("Sigmoid", ["top"], ["b1"]),
        helper.make_node("Tanh", ["bottom"], ["b2"]),
        helper.make_node("Concat", ["b1", "b2"], ["cat"], axis=0, name="the_concat"),  # [6, 2N]
        helper.make_node("Mul", ["cat", "two"], ["m"]),
        helper.make_node("Transpose", ["m"], ["mt"], perm=[1, 0]),  # [2N, 6]
        helper.make_node("Reshape", ["mt", "back"], ["y"]),  # [N, 12]
    ], [("x", TP.FLOAT, ["N", 8])], ["y"],
        [const([-1, 4], "to4", np.int64), const([0], "s0", np.int64), const([3], "e3", np.int64),
         const([1], "s1", np.int64), const([4], "e4", np.int64), const([0], "ax0", np.int64),
         const(2.0, "two", np.float32), const([-1, 12], "back", np.int64)])


@pytest.mark.parametrize("use_torch", [False, True])
def test_arena_grows_and_shrinks_under_views_and_in_place_concat(use_torch):
    model = views_and_concat()
    comp = dynashape.InferenceSession(model, executor="compiled")
    interp = dynashape.InferenceSession(model, executor="interpreter")
    rng = np.random.default_rng(8)
    in_place, arena = [], []
    kept = []
    for n in (2, 5, 17, 3, 40, 2, 40):
        x = rand(rng, (n, 8))
        (want,) = interp.run(None, {"x": x})
        (got,) = comp.run(None, {"x": torch.from_numpy(x) if use_torch else x})
        got = got.numpy() if use_torch else got
        assert got.shape == (n, 12)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"N={n}")
        kept.append((got, want.copy()))
        ms = comp.memory_stats()
        in_place.append(ms["concat_inputs_in_place"])
        arena.append(ms["arena_bytes"])
    for got, want in kept:  # earlier results were not overwritten by the arena's later users
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    ms, s = comp.memory_stats(), comp.stats()
    assert ms["arena_plans"] > 1 and ms["arena_bytes"] > 0
    assert ms["arena_grows"] >= 1
    assert all(b > 0 for b in arena)
    assert arena[4] >= arena[2] >= arena[0]  # N = 40 needs more than N = 17, more than N = 2
    assert all(later > earlier for earlier, later in zip(in_place, in_place[1:]))  # both branches, every run
    assert in_place[-1] == 2 * len(in_place)
    assert s["specializations"] == 1 and s.get("interpreter_runs", 0) == 0
    assert ms["concat_bytes_copied"] == 0


# ---- a failing node is named -----------------------------------------------------------------------
def gather_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["a"], name="pre"),
                       helper.make_node("Gather", ["a", "idx"], ["g"], axis=0, name="pick_rows"),
                       helper.make_node("Sigmoid", ["g"], ["y"], name="post")],
                      [("x", TP.FLOAT, ["N", 4]), ("idx", TP.INT64, ["K"])], ["y"], opset=17)


@pytest.mark.parametrize("use_torch", [False, True])
def test_a_kernel_that_fails_is_named_and_the_session_stays_usable(use_torch):
    sess = dynashape.InferenceSession(gather_model(), executor="compiled")
    rng = np.random.default_rng(9)
    conv = (lambda a: torch.from_numpy(a)) if use_torch else (lambda a: a)

    def good(n, idx):
        x, idx = rand(rng, (n, 4)), np.array(idx, np.int64)
        (y,) = sess.run(None, {"x": conv(x), "idx": conv(idx)})
        y = y.numpy() if use_torch else y
        np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.maximum(x, 0)[idx])), rtol=1e-5, atol=1e-6)
    good(5, [0, 4, -1])
    with pytest.raises(IndexOutOfRangeError) as info:  # a typed error (issue 12), the node named
        sess.run(None, {"x": conv(rand(rng, (5, 4))), "idx": conv(np.array([0, 7, 1], np.int64))})
    msg = str(info.value)
    assert "'pick_rows'" in msg and "Gather" in msg and "(5, 4)" in msg
    good(5, [1, 2, 3])  # the same signature again: right
    with pytest.raises(IndexOutOfRangeError, match=r"pick_rows.*Gather"):
        sess.run(None, {"x": conv(rand(rng, (3, 4))), "idx": conv(np.array([-4], np.int64))})
    good(3, [2, 0])
    good(6, [5])
    s = sess.stats()
    assert s.get("interpreter_runs", 0) == 0 and s["compiled_runs"] == 4


def range_model(start: str, limit: str, delta: str, extra=()) -> onnx.ModelProto:
    """Range over values computed from x's shape (a host node built with its group)."""
    return make_model([
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["m"], axis=0),
        *extra,
        helper.make_node("Range", [start, limit, delta], ["r"], name="the_range"),
        helper.make_node("Cast", ["r"], ["rf"], to=TP.FLOAT),
        helper.make_node("Relu", ["rf"], ["y"]),
    ], [("x", TP.FLOAT, ["N", "M"])], ["y"], [const(0, "i0", np.int64), const(1, "i1", np.int64)], opset=13)


def test_a_failure_inside_a_group_rebuild_is_named_and_the_session_stays_usable():
    """Range(0, N*M, M): its length is N whatever M is, as long as M != 0 (which the dividing
    records as a guard); with M = 0 the step is 0: a new specialization is traced for it and the
    Range kernel, run at run time there, fails."""
    model = range_model("i0", "nm", "m", [helper.make_node("Mul", ["n", "m"], ["nm"])])
    sess = dynashape.InferenceSession(model, executor="compiled")
    for n, m in [(5, 3), (6, 3)]:
        (y,) = sess.run(None, {"x": np.ones((n, m), np.float32)})
        np.testing.assert_array_equal(y, np.arange(0, n * m, m, dtype=np.float32))
    builds = sess.stats()["group_builds"]
    kinds = {n.node.name: n.kind for n in sess.compiled.specs[0].trace.nodes}
    assert kinds["the_range"] == "memo"
    with pytest.raises(ShapeError) as info:
        sess.run(None, {"x": np.ones((5, 0), np.float32)})
    assert "'the_range'" in str(info.value) and "Range" in str(info.value)
    assert sess.stats()["group_builds"] > builds  # it failed in a group build
    for n, m in [(4, 2), (5, 3), (5, 2)]:
        (y,) = sess.run(None, {"x": np.ones((n, m), np.float32)})
        np.testing.assert_array_equal(y, np.arange(0, n * m, m, dtype=np.float32))
    assert sess.stats()["specializations"] == 2  # M != 0 and M == 0


def test_a_range_whose_step_is_zero_from_the_first_run_is_named():
    model = range_model("i0", "n", "d", [helper.make_node("Sub", ["m", "i1"], ["d"])])
    sess = dynashape.InferenceSession(model, executor="compiled")
    with pytest.raises(ShapeError, match=r"'the_range' \(Range\)"):
        sess.run(None, {"x": np.ones((5, 1), np.float32)})
    (y,) = sess.run(None, {"x": np.ones((5, 3), np.float32)})
    np.testing.assert_array_equal(y, np.arange(0, 5, 2, dtype=np.float32))


def test_a_range_whose_step_becomes_zero_later_is_named():
    model = range_model("i0", "n", "d", [helper.make_node("Sub", ["m", "i1"], ["d"])])
    sess = dynashape.InferenceSession(model, executor="compiled")
    (y,) = sess.run(None, {"x": np.ones((5, 3), np.float32)})
    np.testing.assert_array_equal(y, np.arange(0, 5, 2, dtype=np.float32))
    with pytest.raises(ShapeError, match=r"'the_range' \(Range\)"):
        sess.run(None, {"x": np.ones((5, 1), np.float32)})


def test_a_range_with_a_zero_step_and_no_elements_fails_like_the_interpreter():
    model = range_model("n", "n", "d", [helper.make_node("Sub", ["m", "i1"], ["d"])])
    interp = dynashape.InferenceSession(model, executor="interpreter")
    with pytest.raises(ShapeError):
        interp.run(None, {"x": np.ones((5, 1), np.float32)})
    sess = dynashape.InferenceSession(model, executor="compiled")
    with pytest.raises(ShapeError, match=r"'the_range' \(Range\)"):
        sess.run(None, {"x": np.ones((5, 1), np.float32)})


# ---- the generated source --------------------------------------------------------------------------
def chain_model() -> onnx.ModelProto:
    """Four kernels that no fusion merges."""
    return make_model([helper.make_node("Tanh", ["x"], ["a"], name="k_tanh"),
                       helper.make_node("Sub", ["a", "x"], ["b"], name="k_sub"),
                       helper.make_node("Neg", ["b"], ["c"], name="k_neg"),
                       helper.make_node("Exp", ["c"], ["y"], name="k_exp")],
                      [("x", TP.FLOAT, ["N", 4])], ["y"])


def test_the_generated_source_is_inspectable():
    sess = dynashape.InferenceSession(chain_model(), executor="compiled")
    x = rand(np.random.default_rng(10), (3, 4))
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.exp(-(np.tanh(x) - x)), rtol=1e-5, atol=1e-6)
    spec = sess.compiled.specs[0]
    src = spec.source
    assert "def run(" in src and "def accepts(" in src
    compile(src, "<check>", "exec")  # valid Python as it stands
    lines = src.splitlines()
    run_at = next(i for i, line in enumerate(lines) if line.startswith("def run("))
    kernel_lines = {ln: node.name for ln, node in spec.line_nodes.items() if ln - 1 > run_at}
    # one line per kernel, in graph order, each mapped back to its node
    assert list(kernel_lines.values()) == ["k_tanh", "k_sub", "k_neg", "k_exp"]
    for ln in kernel_lines:
        assert "out=" in lines[ln - 1]


def test_dump_code_writes_the_source(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNASHAPE_DUMP_CODE", str(tmp_path / "code"))
    sess = dynashape.InferenceSession(broadcast_add(("M", 4)), executor="compiled")
    rng = np.random.default_rng(11)
    for m in (1, 3):
        sess.run(None, {"x": rand(rng, (3, 4)), "b": rand(rng, (m, 4))})
    files = sorted((tmp_path / "code").glob("*.py"))
    assert len(files) == 2  # one per specialization
    sources = sorted(f.read_text() for f in files)
    assert sources == sorted(spec.source for spec in sess.compiled.specs)
    for text in sources:
        assert "def run(" in text
        compile(text, "<dumped>", "exec")


def test_a_kernel_of_optional_outputs_after_a_break_point_returns_its_tensor_whole():
    """BatchNormalization (extra outputs optional) on a value whose shape comes from data has no
    planned buffer: its kernel returns the tensor itself, which must not be indexed as a tuple."""
    c = 3
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in
             [("s", np.linspace(0.5, 1.5, c)), ("b", np.linspace(-1, 1, c)), ("m", np.linspace(-0.2, 0.2, c)),
              ("v", np.linspace(0.5, 2.0, c))]]
    nodes = [helper.make_node("ReduceMax", ["kin"], ["kmax"], keepdims=1),
             helper.make_node("TopK", ["x", "kmax"], ["vals", "idx"], axis=2),
             helper.make_node("BatchNormalization", ["vals", "s", "b", "m", "v"], ["y"], epsilon=1e-5)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [1, c, "L"]),
                                       helper.make_tensor_value_info("kin", TP.INT64, [1])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], ir_version=8).SerializeToString()
    sess = dynashape.InferenceSession(model, executor="compiled")
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for n, k in [(6, 2), (9, 4), (6, 1), (7, 7)]:
        feeds = {"x": rng.standard_normal((1, c, n)).astype(np.float32), "kin": np.array([k], np.int64)}
        (y,) = sess.run(None, feeds)
        np.testing.assert_allclose(y, ref.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_views_after_a_break_run_without_a_size_check():
    """After a break whose shape the program cannot follow (an If whose branches give different
    ranks), an Unsqueeze of its result holds no more than its input: the generated code calls it
    directly (no st.sized, whose shape function and size check cost ~10 us a call), while an
    Expand to a shape read from data keeps the check."""
    import numpy as np
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper

    import dynashape
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["c0"], axis=0),
                                helper.make_node("Unsqueeze", ["c0", "ax"], ["c"])], "else", [],
                               [helper.make_tensor_value_info("c", TP.FLOAT, None)])  # another rank
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Unsqueeze", ["y", "ax"], ["u"]),
             helper.make_node("Cast", ["k"], ["kk"], to=TP.INT64),
             helper.make_node("Expand", ["one", "kk"], ["e"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n"]),
                                       helper.make_tensor_value_info("cond", TP.BOOL, []),
                                       helper.make_tensor_value_info("k", TP.FLOAT, [1])],
                          [helper.make_tensor_value_info("u", TP.FLOAT, None),
                           helper.make_tensor_value_info("e", TP.FLOAT, None)],
                          [onnx.numpy_helper.from_array(np.array([0], np.int64), "ax"),
                           onnx.numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    # the If as a node (its break is what this is about), not decided per value of cond
    sess = dynashape.InferenceSession(model, decided_ifs=False)
    for n, c, k in ((5, True, 3.0), (4, False, 2.0), (6, True, 7.0)):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        u, e = sess.run(None, {"x": x, "cond": np.array(c), "k": np.array([k], np.float32)})
        assert np.array_equal(u, x[None, :] if c else np.concatenate([x, x])[None, None, :])
        assert e.shape == (int(k),)
    ops = {n.op_type for spec in sess.compiled.specs for n, _ in spec.sized_nodes}
    assert "Unsqueeze" not in ops and "Expand" in ops, ops


def test_a_break_point_at_a_kernel_of_optional_results(monkeypatch):
    """A MaxPool whose shape function cannot run symbolically is a break point; its kernel, called
    without a buffer, returns (Y,) for a node without Indices: the generated code takes Y."""
    import dataclasses

    from dynashape.ops import registry
    od = registry.lookup("MaxPool", "", 17)
    real = od.infer

    def concrete_only(shapes, values, **attrs):
        if not all(type(d) is int for s in shapes for d in s):  # a symbolic dim
            raise TypeError("needs numbers")
        return real(shapes, values, **attrs)
    versions = [dataclasses.replace(v, infer=concrete_only) if v is od else v
                for v in registry._REGISTRY[("", "MaxPool")]]
    monkeypatch.setitem(registry._REGISTRY, ("", "MaxPool"), versions)
    g = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Neg", ["p"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = dynashape.InferenceSession(model, executor="compiled")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(1, 3, 8, 6), (2, 3, 5, 9), (1, 3, 8, 6)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    assert {n.kind for spec in sess.compiled.specs for n in spec.trace.nodes if n.node.op_type == "MaxPool"} == {"dyn"}


def test_a_size_from_data_is_checked_again_only_when_its_values_change(monkeypatch):
    """``st.sized`` remembers the shapes and values a node's sizes were last checked for (a Loop
    body's Range, every iteration): the same ones skip the shape function, other ones (an absurd
    length) are checked and refused."""
    from dynashape.errors import MemoryLimitError
    from dynashape.runtime import spec_state

    model = make_model([helper.make_node("Range", ["zero", "n", "one"], ["r"], name="the_range"),
                        helper.make_node("Cast", ["r"], ["y"], to=TP.FLOAT)],
                       [("n", TP.INT64, [])], ["y"], [const(0, "zero", np.int64), const(1, "one", np.int64)])
    sess = dynashape.InferenceSession(model, executor="compiled", max_buffer_bytes=1 << 20)
    calls = []
    real = spec_state.check_output_sizes
    monkeypatch.setattr(spec_state, "check_output_sizes", lambda *a, **k: calls.append(1) or real(*a, **k))
    for n in (5, 5, 5, 7, 7):
        np.testing.assert_array_equal(sess.run(None, {"n": np.array(n, np.int64)})[0], np.arange(n, dtype=np.float32))
    assert len(calls) == 2
    with pytest.raises(MemoryLimitError, match="Range"):
        sess.run(None, {"n": np.array(10**9, np.int64)})
    np.testing.assert_array_equal(sess.run(None, {"n": np.array(7, np.int64)})[0], np.arange(7, dtype=np.float32))

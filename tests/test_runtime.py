"""The per-node flow: what is skipped, what is reused, who owns the outputs.

Tests of the interpreter's own counters ask for ``executor="interpreter"``; what the generated
code does instead (groups built once per symbol values) is tested beside them."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape

from .helpers import add_chain, rand, shape_subgraph_model


def run_chain(sess, n, k=3, rng=None):
    x, b = rand(n, 4, rng=rng), rand(1, 4, rng=rng)
    y = sess.run(None, {"x": x, "b": b})[0]
    np.testing.assert_allclose(y, x + k * b, rtol=1e-5, atol=1e-6)
    return y


def test_unchanged_shapes_skip_update_shape():
    s = dynashape.InferenceSession(add_chain(3), executor="interpreter")
    run_chain(s, 2)
    st = s.stats()
    assert st["shape_change_runs"] == 1 and st["shape_updates"] == 3
    for _ in range(4):
        run_chain(s, 2)
    st2 = s.stats()
    assert st2["fast_runs"] == 4 and st2["shape_change_runs"] == 1
    # numpy outputs are copied out, so the network keeps every buffer: no node redoes its flow
    assert st2["shape_updates"] == st["shape_updates"]
    # torch outputs are handed to the caller: only the node producing the output redoes its flow
    x, b = torch.from_numpy(rand(2, 4)), torch.from_numpy(rand(1, 4))
    for _ in range(3):
        s.run(None, {"x": x, "b": b})
    st3 = s.stats()
    # the first torch run hands the buffer out; the two after it redo the output node's flow
    assert st3["shape_updates"] - st2["shape_updates"] == 2


def test_shrinking_reuses_buffers_growing_reallocates_tiny_reclaims():
    # exact sizes: no predictor
    s = dynashape.InferenceSession(add_chain(4), preallocation="0 0 0 1.0", executor="interpreter")
    run_chain(s, 8, 4)
    m0 = s.memory_stats()
    run_chain(s, 3, 4)  # smaller: every buffer is reused (numpy outputs are copied out: the output's too)
    m1 = s.memory_stats()
    assert m1["allocations"] == m0["allocations"]
    assert m1["buffer_reuses"] - m0["buffer_reuses"] == 4
    run_chain(s, 16, 4)  # larger: every buffer grows; the old ones go back to the pool first
    m2 = s.memory_stats()
    assert m2["buffer_grows"] - m1["buffer_grows"] == 4
    assert m2["allocations"] > m1["allocations"]
    run_chain(s, 1, 4)  # 4 elements in buffers of 64: required * 10 < capacity, so they are reclaimed
    m3 = s.memory_stats()
    assert m3["buffer_reclaims"] - m2["buffer_reclaims"] == 4
    run_chain(s, 1, 4)


def test_a_small_output_buffer_serves_shapes_that_alternate_10x_apart():
    """Compiled runs, numpy outputs: a kept output buffer 10x larger than needed goes back, unless it
    is at most 1 MiB (KEEP_SMALL_BYTES): a decoder's 1 token and a prompt's 10 would otherwise take a
    new buffer every call. A large one still goes back."""
    s = dynashape.InferenceSession(add_chain(2), preallocation="0 0 0 1.0")
    for n in (40, 2, 40, 2):  # 640 and 32 bytes
        run_chain(s, n, 2)
    m0 = s.memory_stats()
    for n in (2, 40, 2, 40, 2):
        run_chain(s, n, 2)
    assert s.memory_stats()["allocations"] == m0["allocations"]
    one = dynashape.InferenceSession(add_chain(1), preallocation="0 0 0 1.0")  # the output its only buffer
    run_chain(one, 1 << 17, 1)  # 2 MiB
    m1 = one.memory_stats()
    run_chain(one, 1 << 12, 1)  # 64 KiB: the 2 MiB buffer goes back for one of this size
    m2 = one.memory_stats()
    assert m2["allocations"] == m1["allocations"] + 1 and m2["frees"] == m1["frees"] + 1


def test_outputs_are_owned_by_the_caller():
    s = dynashape.InferenceSession(add_chain(2))
    rng = np.random.default_rng(1)
    y1 = run_chain(s, 2, 2, rng).copy()
    keep = s.run(None, {"x": np.ones((2, 4), np.float32), "b": np.ones((1, 4), np.float32)})[0]
    for n in (2, 2, 3):
        run_chain(s, n, 2, rng)
    np.testing.assert_array_equal(keep, np.full((2, 4), 3.0, np.float32))
    assert not np.array_equal(y1, keep)


def test_numpy_in_numpy_out_torch_in_torch_out():
    s = dynashape.InferenceSession(add_chain(2))
    x, b = rand(2, 4), rand(1, 4)
    (yn,) = s.run(None, {"x": x, "b": b})
    assert isinstance(yn, np.ndarray)
    (yt,) = s.run(None, {"x": torch.from_numpy(x), "b": torch.from_numpy(b)})
    assert isinstance(yt, torch.Tensor) and yt.device.type == "cpu"
    np.testing.assert_allclose(yt.numpy(), yn)


def test_infer_requests_are_independent():
    s = dynashape.InferenceSession(add_chain(3))
    r1, r2 = s.create_infer_request(), s.create_infer_request()
    rng = np.random.default_rng(2)
    for n1, n2 in ((2, 5), (5, 2), (3, 3), (7, 1)):
        x1, x2, b = rand(n1, 4, rng=rng), rand(n2, 4, rng=rng), rand(1, 4, rng=rng)
        y1 = r1.run(None, {"x": x1, "b": b})[0]
        y2 = r2.infer({"x": x2, "b": b})["y"]
        np.testing.assert_allclose(y1, x1 + 3 * b, rtol=1e-5)
        np.testing.assert_allclose(y2, x2 + 3 * b, rtol=1e-5)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
def test_empty_output_skips_the_kernel(executor):
    s = dynashape.InferenceSession(add_chain(3), executor=executor)
    (y,) = s.run(None, {"x": np.zeros((0, 4), np.float32), "b": rand(1, 4)})
    assert y.shape == (0, 4)
    if executor == "interpreter":
        assert s.stats()["empty_skips"] == 3
    run_chain(s, 2)  # and back to non-empty


def test_shape_subgraph_runs_on_host_and_only_when_shapes_change():
    s = dynashape.InferenceSession(shape_subgraph_model(), executor="interpreter")
    kinds = {n.op_type: getattr(n, "shape_of", False) for n in s.program.graph.nodes}
    # the float Cast feeds data, so it runs with the data; the int shape values stay on the host
    assert kinds == {"Shape": True, "Gather": True, "Cast": False, "Mul": False}
    rng = np.random.default_rng(3)
    for shape in ((2, 3), (2, 3), (4, 5), (4, 5), (1, 7), (2, 3)):
        x = rand(*shape, rng=rng)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], x * shape[1], rtol=1e-6)
    st = s.stats()
    assert st["fast_runs"] == 2 and st["shape_change_runs"] == 4


def test_generated_code_rebuilds_views_only_when_symbols_change():
    """The compiled form of the two tests above: an unchanged signature enters nothing; a new
    one builds its groups (views, shape values made tensors) once, and finds them when it returns."""
    s = dynashape.InferenceSession(shape_subgraph_model())
    rng = np.random.default_rng(3)
    for shape in ((2, 3), (2, 3), (4, 5), (4, 5), (1, 7), (2, 3)):
        x = rand(*shape, rng=rng)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], x * shape[1], rtol=1e-6)
    st = s.stats()
    assert st["compiled_runs"] == 6 and st.get("interpreter_runs", 0) == 0
    # Shape(x)[1] cast to float is part of the shape program; the Mul reads it as a tensor,
    # made once per value of M (3, 5, 7) and found for 3 again; nothing else needs memory
    assert st["group_builds"] == 3 and st["group_hits"] == 1
    assert st.get("arena_plans", 0) == 0 and st["specializations"] == 1


def test_static_shapes_fold_and_dead_nodes_go():
    inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "idx")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "idx"], ["d"], axis=0),
             helper.make_node("Cast", ["d"], ["df"], to=TP.FLOAT),
             helper.make_node("Mul", ["x", "df"], ["y"]),
             helper.make_node("Neg", ["x"], ["unused"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 6])], initializer=inits)
    s = dynashape.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    # axis 1 is static, so Shape -> Gather -> Cast fold to the constant 6.0; Neg is dead
    assert [n.op_type for n in s.program.graph.nodes] == ["Mul"]
    text = str(s.program)
    assert "Mul" in text and "float[N:?,6]" in text
    x = rand(3, 6)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], x * 6, rtol=1e-6)


def test_partial_shapes_propagate():
    from dynashape import Dimension
    s = dynashape.InferenceSession(add_chain(3), dynamic_dims={"x": [Dimension(2, 9), 4]})
    out = s.program.graph.outputs[0]
    assert out.shape[0] == Dimension(2, 9) and out.shape[1] == Dimension(4, 4)


def test_group_builds_are_kept_for_a_generation_of_lengths(monkeypatch):
    """Twenty lengths, then the same twenty again (a second generation of a decoder without a KV
    cache): the second pass finds every group build. Builds own tensors (the shape value made a
    tensor here) within a byte budget; with none, only the last build is kept."""
    from dynashape.runtime import spec_state
    rng = np.random.default_rng(4)
    lengths = list(range(1, 21))
    for budget, hits in ((spec_state.GROUP_CACHE_BYTES, 20), (0, 0)):
        monkeypatch.setattr(spec_state, "GROUP_CACHE_BYTES", budget)
        s = dynashape.InferenceSession(shape_subgraph_model())
        for m in lengths + lengths:
            x = rand(2, m, rng=rng)
            np.testing.assert_allclose(s.run(None, {"x": x})[0], x * m, rtol=1e-6)
        st = s.stats()
        assert st.get("group_hits", 0) == hits and st["group_builds"] == 40 - hits, dict(st)

"""The CPU pass that runs products by large constant float32 matrices through oneDNN with the
weight packed once (compile/cpu_packed_linear.py, ops/packed_linear.py): which products it takes,
that they equal the unfused graph over changing row counts, that a trace (a static impl's build)
gets the plain product, and that the packed copy is made once per weight, at load."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch.fx.experimental.proxy_tensor import make_fx

import dynashape
from dynashape.compile.pipeline import compile_graph
from dynashape.frontend.options import ParseOptions
from dynashape.frontend.parse import parse_model
from dynashape.ops import packed_linear

_HAS_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
pytestmark = pytest.mark.skipif(not _HAS_ONEDNN, reason="this torch has no oneDNN packed linear")


@pytest.fixture(autouse=True)
def _packing_on(monkeypatch):
    """The pass as on the AMD CPU it was measured on, whatever CPU runs the tests."""
    monkeypatch.setenv("DYNASHAPE_CPU_PACKED_WEIGHTS", "1")

K, N = 512, 640  # 327,680 weights: above MIN_WEIGHT, below MIN_WEIGHT_ONE_ROW


def _model(k: int = K, n: int = N, bias: bool = False, rank: int = 3, dtype=np.float32) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype), "W")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m" if bias else "y"])]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(dtype), "B"))
        nodes.append(helper.make_node("Add", ["m", "B"], ["y"]))
    lead = ["b", "s"][: rank - 1]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", et, [*lead, k])],
                          [helper.make_tensor_value_info("y", et, [*lead, n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ops(m, device="cpu") -> list[str]:
    return [n.op_type for n in compile_graph(parse_model(m, ParseOptions()), device=device).fused.nodes]


def test_which_products_are_packed():
    assert _ops(_model()) == ["PackedLinear"]
    assert _ops(_model(bias=True)) == ["PackedLinear"]  # fuse_linear's Linear, its bias with it
    assert _ops(_model(64, 64)) == ["MatMul"]  # small: MKL's call is cheaper
    assert _ops(_model(dtype=np.float16)) == ["Linear"]  # half precision keeps linear_layout's form
    assert _ops(_model(rank=1)) == ["MatMul"]  # a vector product
    assert _ops(_model(), device="cuda") == ["Linear"]  # CUDA: not this pass


def test_env_var_turns_it_off(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_CPU_PACKED_WEIGHTS", "0")
    assert _ops(_model()) == ["MatMul"]


@pytest.mark.parametrize("bias", [False, True])
def test_packed_products_equal_the_unfused_graph_over_changing_rows(bias):
    m = _model(bias=bias)
    fused = dynashape.InferenceSession(m.SerializeToString())
    plain = dynashape.InferenceSession(m.SerializeToString(), fusion=False)
    assert [n.op_type for n in fused.program.fused.nodes] == ["PackedLinear"]
    rng = np.random.default_rng(1)
    for b, s in [(1, 1), (4, 7), (1, 33), (2, 1), (8, 16), (1, 1), (3, 0)]:
        x = rng.standard_normal((b, s, K)).astype(np.float32)
        got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
        assert got.shape == (b, s, N)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _gemm(trans_b=1, bias=True, alpha=1.0, c_shape=None, unknown_rank=False) -> onnx.ModelProto:
    """Gemm(x, W, C) as exporters write a classifier (ddddocr's 1024 -> 8210), A of unknown rank
    when ``unknown_rank`` (a Reshape to a shape computed from data feeds it)."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((N, K) if trans_b else (K, N)) / np.sqrt(K)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    ins = ["a", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(c_shape or (N,)).astype(np.float32), "C"))
        ins.append("C")
    nodes = [helper.make_node("Gemm", ins, ["y"], transB=trans_b, alpha=alpha)]
    if unknown_rank:
        nodes.insert(0, helper.make_node("Reshape", ["x", "shape"], ["a"]))
        inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["r", K]),
                  helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [2])]
    else:
        nodes.insert(0, helper.make_node("Identity", ["x"], ["a"]))
        inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["r", K])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_plain_gemms_are_packed_and_equal_the_unfused_graph():
    assert "PackedLinear" not in _ops(_gemm(alpha=0.5))  # a scaled product stays a Gemm
    assert "PackedLinear" not in _ops(_gemm(c_shape=(1, N)))  # a C of another shape than a bias
    rng = np.random.default_rng(3)
    for m in (_gemm(), _gemm(trans_b=0), _gemm(bias=False), _gemm(unknown_rank=True)):
        fused = dynashape.InferenceSession(m.SerializeToString())
        plain = dynashape.InferenceSession(m.SerializeToString(), fusion=False)
        assert "PackedLinear" in [n.op_type for n in fused.program.fused.nodes]
        for rows in (1, 9, 33, 9, 2):
            feeds = {"x": rng.standard_normal((rows, K)).astype(np.float32)}
            if len(fused.get_inputs()) > 1:
                feeds["shape"] = np.array([rows, K], np.int64)
            np.testing.assert_allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_one_row_by_a_mid_sized_weight_takes_the_plain_product(monkeypatch):
    w = torch.randn(N, K)
    rows = []
    real = packed_linear._onednn
    monkeypatch.setattr(packed_linear, "_onednn", lambda x, p, b: rows.append(x.shape[0]) or real(x, p, b))
    monkeypatch.setattr(packed_linear, "_SEEN", set())
    one, four = torch.randn(1, K), torch.randn(4, K)
    for _ in range(2):  # (the first product of a row count is MKL's: below)
        torch.testing.assert_close(packed_linear._packed_linear(one, w), one @ w.t(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(packed_linear._packed_linear(four, w), four @ w.t(), rtol=1e-4, atol=1e-4)
    assert rows == [4]  # one row by 327,680 weights: MKL's product; four rows: oneDNN's
    big = torch.randn(1024, K)  # 524,288 weights: oneDNN for one row too
    for _ in range(2):
        torch.testing.assert_close(packed_linear._packed_linear(one, big), one @ big.t(), rtol=1e-4, atol=1e-4)
    assert rows == [4, 1]


def test_a_row_count_seen_once_takes_mkl_and_onednn_from_its_second_product(monkeypatch):
    """oneDNN compiles a primitive per row count: a shape seen once does not pay for it."""
    monkeypatch.setattr(packed_linear, "_SEEN", set())
    rows = []
    real = packed_linear._onednn
    monkeypatch.setattr(packed_linear, "_onednn", lambda x, p, b: rows.append(x.shape[0]) or real(x, p, b))
    w = torch.randn(N, K)
    for m in (3, 5, 3, 3, 5, 7):
        x = torch.randn(m, K)
        torch.testing.assert_close(packed_linear._packed_linear(x, w), x @ w.t(), rtol=1e-4, atol=1e-4)
    assert rows == [3, 3, 5]


def test_a_trace_gets_the_plain_product():
    w = torch.randn(K, N)
    packed_linear.pack(w, True)

    def f(x):
        return packed_linear._packed_linear(x, w, None, transposed=1).relu()
    # as a static impl's build traces a region (impls/static.py InductorImpl): weights are real tensors
    gm = make_fx(f, tracing_mode="fake", _allow_non_fake_inputs=True)(torch.randn(4, K))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("mkldnn" in t for t in targets), targets
    x = torch.randn(4, K)
    torch.testing.assert_close(gm(x), (x @ w).relu(), rtol=1e-4, atol=1e-4)


def test_the_weight_is_packed_once_at_load():
    m = _model()
    sess = dynashape.InferenceSession(m.SerializeToString())
    (node,) = sess.program.fused.nodes
    w = node.inputs[1].const
    p = packed_linear.pack(w, True)
    assert p.is_mkldnn and tuple(p.shape) == (N, K)
    x = np.random.default_rng(2).standard_normal((2, 3, K)).astype(np.float32)
    sess.run(None, {"x": x})
    assert packed_linear.pack(w, True) is p  # the same packed copy: made at load, not per call
    w.add_(0.0)  # an in-place change (version bump) makes a new one
    assert packed_linear.pack(w, True) is not p


def test_a_cpu_static_build_leaves_packed_products_to_the_specialised_source():
    """inductor would call MKL's product for the traced F.linear: the region keeps its source."""
    from dynashape.impls import static as static_mod
    w = torch.randn(K, N)

    def fn(n, x):
        return (packed_linear._packed_linear(x, w, None, transposed=1).relu().add(1.0).mul(2.0).sigmoid(),)
    with pytest.raises(static_mod.TooLittleToFuse, match="packed weights"):
        static_mod.InductorImpl(fn, (4,), (torch.randn(4, K),))


def test_a_biased_product_reads_the_models_weight_and_drops_the_transposed_copy():
    program = compile_graph(parse_model(_model(bias=True), ParseOptions()), device="cpu")
    (node,) = program.fused.nodes
    assert node.op_type == "PackedLinear" and node.attrs["transposed"] == 1
    assert node.inputs[1].const is program.graph.nodes[0].inputs[1].const  # shared with the unfused graph
    assert not any(name.endswith("_T") for name in program.fused.values)
    assert [n.op_type for n in node.unfused] == ["MatMul", "Add"]


def test_auto_is_off_on_intel_cpus(monkeypatch):
    """MKL keeps its fast paths on Intel CPUs (measured there: oneDNN's packed product 0.6-1.7x
    MKL's time): "auto" packs only elsewhere; "1" and "0" force it."""
    monkeypatch.delenv("DYNASHAPE_CPU_PACKED_WEIGHTS", raising=False)
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: "GenuineIntel")
    assert not packed_linear.available() and _ops(_model()) == ["MatMul"]
    monkeypatch.setenv("DYNASHAPE_CPU_PACKED_WEIGHTS", "1")
    assert packed_linear.available() and _ops(_model()) == ["PackedLinear"]
    monkeypatch.setenv("DYNASHAPE_CPU_PACKED_WEIGHTS", "auto")
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: "AuthenticAMD")
    assert packed_linear.available()

"""onnxruntime user code runs unchanged on dynashape: each check is one function of the module
``ort`` (onnxruntime or dynashape), run against both and compared."""

from __future__ import annotations

import contextlib
import json
import os
import threading

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import dynashape
from dynashape.errors import OptionsError, RunTerminatedError, UnsupportedFeatureError

ort_mod = pytest.importorskip("onnxruntime")

NODES = ["mm", "add", "relu", "sum"]


def _model() -> onnx.ModelProto:
    """x[N,4] @ W[4,3] + b -> relu -> y; z = reduce-sum of y over axis 1."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "B"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu"),
             helper.make_node("ReduceSum", ["y", "axes"], ["z"], name="sum", keepdims=0)]
    g = helper.make_graph(nodes, "compat_graph",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N"])],
                          [w, b, axes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="compat-test",
                          domain="ai.test", model_version=7, doc_string="a small model")
    m.ir_version = 8
    helper.set_model_props(m, {"author": "tests", "purpose": "compat"})
    return m


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("compat") / "model.onnx"
    onnx.save(_model(), str(p))
    return str(p)


def _x(n=3, seed=1):
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def both(fn, *args):
    """``fn(ort, *args)`` with onnxruntime and with dynashape; results compared."""
    want = fn(ort_mod, *args)
    got = fn(dynashape, *args)
    _compare(got, want)
    return got, want


def _compare(got, want):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _compare(g, w)
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _compare(got[k], want[k])
    elif isinstance(want, np.ndarray):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert got == want


# ---- the user code -------------------------------------------------------------------------

def from_path(ort, path):
    so = ort.SessionOptions()
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(output_names=["y", "z"], input_feed={"x": _x()})


def from_bytes(ort, path):
    with open(path, "rb") as f:
        data = f.read()
    sess = ort.InferenceSession(data, ort.SessionOptions(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": _x(5)}) + sess.run(["z"], {"x": _x(2)})


def with_run_options(ort, path):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ro = ort.RunOptions()
    ro.logid = "tagged"
    ro.log_severity_level = 3
    return sess.run(["y"], {"x": _x()}, ro)


def io_description(ort, path):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return ([(a.name, list(a.shape), a.type) for a in sess.get_inputs()],
            [(a.name, list(a.shape), a.type) for a in sess.get_outputs()])


def metadata(ort, path):
    m = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_modelmeta()
    return [m.producer_name, m.graph_name, m.domain, m.description, m.version, dict(m.custom_metadata_map)]


def providers(ort, path):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.get_providers(), "CPUExecutionProvider" in ort.get_available_providers()


def no_optimization(ort, path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": _x(4)})


def free_dim_override(ort, path):
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("N", 2)
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return [list(sess.get_inputs()[0].shape)] + sess.run(None, {"x": _x(2)})


def run_async(ort, path):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    done = threading.Event()
    box = {}

    def callback(results, user_data, err):
        box["results"], box["user_data"], box["err"] = results, user_data, err
        done.set()

    sess.run_async(["y", "z"], {"x": _x()}, callback, "data")
    assert done.wait(30)
    return [np.asarray(r) for r in box["results"]] + [box["user_data"], box["err"]]


def io_binding(ort, path):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    binding.bind_cpu_input("x", _x(6))
    binding.bind_output("y")
    binding.bind_output("z", "cpu")
    sess.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()


def terminated(ort, path):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ro = ort.RunOptions()
    ro.terminate = True
    with pytest.raises(Exception) as info:
        sess.run(None, {"x": _x()}, ro)
    ro.terminate = False
    return info.value, sess.run(None, {"x": _x()}, ro)


# ---- the tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [from_path, from_bytes, with_run_options, io_description, metadata, providers,
                                no_optimization, free_dim_override, run_async, io_binding])
def test_same_code_same_results(fn, model_path):
    both(fn, model_path)


def test_terminate_raises_a_typed_error_and_the_session_still_works(model_path):
    err_d, out_d = terminated(dynashape, model_path)
    err_o, out_o = terminated(ort_mod, model_path)
    assert isinstance(err_d, RunTerminatedError) and isinstance(err_d, RuntimeError)
    _compare(out_d, out_o)


def _profile(ort, path, tmp):
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tmp, "prof")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # onnxruntime fuses MatMul+Add
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    out = sess.run(None, {"x": _x()})
    trace = sess.end_profiling()
    with open(trace) as f:
        events = json.load(f)
    nodes = [e for e in events if e.get("cat") == "Node" and not e["name"].endswith(("_fence_before", "_fence_after"))]
    return trace, nodes, out


def test_profiling_writes_one_event_per_node(model_path, tmp_path):
    trace, nodes, out = _profile(dynashape, model_path, str(tmp_path))
    assert os.path.basename(trace).startswith("prof_") and trace.endswith(".json")
    assert sorted(e["name"] for e in nodes) == sorted(NODES)
    assert all(e["ph"] == "X" and e["dur"] > 0 and "ts" in e for e in nodes)
    assert {e["name"]: e["args"]["op_name"] for e in nodes} == {"mm": "MatMul", "add": "Add", "relu": "Relu",
                                                                 "sum": "ReduceSum"}
    _, ref_nodes, ref = _profile(ort_mod, model_path, str(tmp_path))
    _compare(out, ref)
    # onnxruntime names its kernel events <node>_kernel_time
    assert {e["name"].removesuffix("_kernel_time") for e in ref_nodes} == set(NODES)


def test_cuda_provider_without_cuda_warns_and_runs_on_cpu(model_path):
    if torch.cuda.is_available():
        pytest.skip("this check is for a machine without CUDA")
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider"):
        sess = dynashape.InferenceSession(model_path, providers=["CUDAExecutionProvider"])
    assert sess.device.type == "cpu" and sess.get_providers() == ["CPUExecutionProvider"]
    ref = ort_mod.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    _compare(sess.run(None, {"x": _x()}), ref.run(None, {"x": _x()}))


def test_provider_order_and_options(model_path):
    # without CUDA the CUDA provider falls back to CPU with a warning; with it, nothing to warn of
    with pytest.warns(RuntimeWarning) if not torch.cuda.is_available() else contextlib.nullcontext():
        sess = dynashape.InferenceSession(model_path, providers=[("CUDAExecutionProvider", {"device_id": 0}),
                                                                 "CPUExecutionProvider"])
    assert sess.get_providers() == (["CUDAExecutionProvider", "CPUExecutionProvider"] if torch.cuda.is_available()
                                    else ["CPUExecutionProvider"])
    assert "CPUExecutionProvider" in sess.get_provider_options()


def test_unknown_provider_is_an_options_error(model_path):
    with pytest.raises(OptionsError, match="NoSuchExecutionProvider") as info:
        dynashape.InferenceSession(model_path, providers=["NoSuchExecutionProvider"])
    assert "CPUExecutionProvider" in str(info.value)


def test_device_forms_still_work(model_path):
    for sess in (dynashape.InferenceSession(model_path, "cpu"), dynashape.InferenceSession(model_path, device="cpu"),
                 dynashape.InferenceSession(model_path, torch.device("cpu"))):
        assert sess.device.type == "cpu"
        (y, z) = sess.run(None, feeds={"x": _x()})
        np.testing.assert_allclose(z, y.sum(1), rtol=1e-5)


def test_threads_are_applied_during_a_run_and_restored(model_path):
    before = torch.get_num_threads()
    so = dynashape.SessionOptions()
    so.intra_op_num_threads = 1
    sess = dynashape.InferenceSession(model_path, so)
    assert sess.threads == 1
    seen = []
    real = torch.set_num_threads

    def spy(n):
        seen.append(n)
        real(n)
    torch.set_num_threads = spy
    try:
        sess.run(None, {"x": _x()})
    finally:
        torch.set_num_threads = real
    assert torch.get_num_threads() == before
    if before != 1:
        assert seen == [1, before]


def test_session_options_fields_map_to_dynashape(model_path):
    so = dynashape.SessionOptions()
    so.graph_optimization_level = dynashape.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.key", "v")
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 3)
    assert so.get_session_config_entry("session.key") == "v"
    sess = dynashape.InferenceSession(model_path, so)
    assert sess._fusion is False and sess.get_session_options() is so


def test_iobinding_torch_tensors(model_path):
    sess = dynashape.InferenceSession(model_path)
    b = sess.io_binding()
    b.bind_input_tensor("x", torch.from_numpy(_x()))
    out = torch.empty(3, dtype=torch.float32)
    b.bind_output_tensor("z", out)
    b.bind_output("y")
    sess.run_with_iobinding(b)
    z, y = b.get_outputs()
    assert z is out and isinstance(y, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), y.sum(1).numpy(), rtol=1e-5)
    with pytest.raises(UnsupportedFeatureError, match="bind_input_tensor"):
        b.bind_input("x", "cpu", 0, np.float32, [3, 4], 12345)
    b.clear_binding_inputs()
    b.clear_binding_outputs()
    assert b.get_outputs() == []


def test_run_async_reports_errors(model_path):
    sess = dynashape.InferenceSession(model_path)
    done = threading.Event()
    box = {}

    def callback(results, user_data, err):
        box.update(results=results, err=err)
        done.set()
    sess.run_async(None, {"nope": _x()}, callback, None)
    assert done.wait(30)
    assert box["results"] is None and "nope" in box["err"]


def test_bound_output_tensor_is_written_in_place():
    """io_binding's zero-copy outputs: the kernel writes into the caller's tensor."""
    import torch
    from onnx import TensorProto as TP
    from onnx import helper

    import dynashape

    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["h"]), helper.make_node("Mul", ["h", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = dynashape.InferenceSession(m)
    for n in (2, 5):
        x = torch.rand(n, 3) * 4 - 2
        out = torch.empty(n, 3)
        ptr = out.data_ptr()
        b = sess.io_binding()
        b.bind_input_tensor("x", x)
        b.bind_output_tensor("y", out)
        sess.run_with_iobinding(b)
        torch.testing.assert_close(out, torch.tanh(x) * x)
        assert b.get_outputs()[0].data_ptr() == ptr
    assert sess.stats()["outputs_written_in_place"] == 2


def test_log_severity_level_maps_to_verbose():
    import dynashape
    from dynashape.api import _session_options

    so = dynashape.SessionOptions()
    assert "verbose" not in _session_options(so, {})
    so.log_severity_level = 0
    assert _session_options(so, {})["verbose"] == 2
    so.log_severity_level = 1
    assert _session_options(so, {"verbose": 0})["verbose"] == 0  # the keyword wins

"""onnxruntime user code on a GPU (skipped without CUDA; the device runs it): the CUDA provider
maps to the GPU, io_binding writes bound CUDA tensors in place and hands device outputs back,
profiling and run_async work with kernels that run asynchronously. Compared with onnxruntime's
CPU results (its CUDA provider is not installed here)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

import dynashape
from tests.compat.test_onnxruntime_compat import NODES, _model, _x

ort = pytest.importorskip("onnxruntime")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    import onnx
    p = tmp_path_factory.mktemp("cuda_compat") / "model.onnx"
    onnx.save(_model(), str(p))
    return str(p)


def _ref(path, x):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_cuda_provider_runs_on_the_gpu(path):
    sess = dynashape.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.device.type == "cuda" and sess.get_providers()[0] == "CUDAExecutionProvider"
    for n in (3, 7, 1):
        got = sess.run(None, {"x": _x(n, seed=n)})
        for g, w in zip(got, _ref(path, _x(n, seed=n))):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_iobinding_with_cuda_tensors(path):
    sess = dynashape.InferenceSession(path, providers=["CUDAExecutionProvider"])
    b = sess.io_binding()
    for n in (4, 2):
        x = torch.from_numpy(_x(n, seed=n)).cuda()
        out = torch.empty(n, dtype=torch.float32, device="cuda")
        b.bind_input_tensor("x", x)
        b.bind_output_tensor("z", out)
        b.bind_output("y", "cuda")
        sess.run_with_iobinding(b)
        z, y = b.get_outputs()
        assert z is out and y.is_cuda
        b.synchronize_outputs()
        ref = _ref(path, _x(n, seed=n))
        np.testing.assert_allclose(out.cpu().numpy(), ref[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.copy_outputs_to_cpu()[1], ref[0], rtol=1e-5, atol=1e-6)


def test_profiling_on_cuda_times_every_node(path, tmp_path):
    so = dynashape.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = dynashape.InferenceSession(path, so, providers=["CUDAExecutionProvider"])
    got = sess.run(None, {"x": _x()})
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    nodes = [e for e in events if e.get("cat") == "Node"]
    assert sorted(e["name"] for e in nodes) == sorted(NODES) and all(e["dur"] > 0 for e in nodes)
    for g, w in zip(got, _ref(path, _x())):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_run_async_on_cuda(path):
    sess = dynashape.InferenceSession(path, providers=["CUDAExecutionProvider"])
    done, box = threading.Event(), {}

    def callback(results, user_data, err):
        box.update(results=results, err=err, user=user_data)
        done.set()
    sess.run_async(None, {"x": _x(5, seed=5)}, callback, "u")
    assert done.wait(60) and box["err"] == "" and box["user"] == "u"
    for g, w in zip(box["results"], _ref(path, _x(5, seed=5))):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

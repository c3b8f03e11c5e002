"""Host syncs on the dynamic path (issue 36, item 1): on CUDA nothing reads the device back except
a shape that data decides, and those reads are counted by op (``stats()["host_syncs_by_op"]``).

On a GPU (``DYNASHAPE_TEST_DEVICE=cuda``) the models of tests/models run, after their first call,
under ``torch.cuda.set_sync_debug_mode("error")``: any synchronising CUDA call raises. Feeds are
device tensors and outputs stay on the device (a numpy feed or result is the caller's copy,
which syncs by nature). On the CPU the counting logic is checked: a data-dependent op on a CPU
tensor is no sync and is not counted.
"""

from __future__ import annotations

import gc
import os
import threading
import warnings
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.impls.context import wait_all
from dynashape.ops import host_sync

from .models import cnn, llama
from .models import transformers_models as hf

DEVICE = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")
cuda_only = pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="needs DYNASHAPE_TEST_DEVICE=cuda")


def _nonzero_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TP.INT64, [1, "k"])
    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "nz", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_counting_logic():
    host_sync.reset()
    host_sync.count("NonZero", torch.ones(2))  # a CPU tensor: no sync
    assert host_sync.counters()["host_syncs"] == 0
    host_sync.count("NonZero", SimpleNamespace(is_cuda=True))
    host_sync.count("NonZero", SimpleNamespace(is_cuda=True))
    host_sync.count("free of device memory")
    assert host_sync.counters() == {"host_syncs": 3, "host_syncs_by_op": {"NonZero": 2, "free of device memory": 1}}
    host_sync.reset()


def test_a_cpu_session_counts_no_sync():
    gc.collect()  # an earlier test's CUDA sessions free their device memory now, not inside the count
    host_sync.reset()
    sess = dynashape.InferenceSession(_nonzero_model())
    rng = np.random.default_rng(0)
    for n in (5, 9, 3):
        x = np.where(rng.random(n) < 0.5, 0.0, rng.standard_normal(n)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.stack(np.nonzero(x)))
    assert sess.stats()["host_syncs"] == 0


@cuda_only
def test_a_data_dependent_shape_is_counted_by_op():
    sess = dynashape.InferenceSession(_nonzero_model(), device=DEVICE)
    before = host_sync.counters()["host_syncs_by_op"].get("NonZero", 0)
    for n in (5, 9, 3):
        x = torch.randn(n, device=DEVICE)
        x[::2] = 0
        (y,) = sess.run(None, {"x": x})
        assert torch.equal(torch.as_tensor(y).cpu(), torch.nonzero(x.cpu()).t())
    assert sess.stats()["host_syncs_by_op"]["NonZero"] - before == 3


def _torch_syncs(calls) -> int:
    """The synchronising CUDA calls torch sees in this thread while ``calls()`` runs (sync debug
    mode "warn"; a background build's own are its thread's, not a call's)."""
    me, seen = threading.current_thread(), []

    def show(message, *args, **kwargs):
        if threading.current_thread() is me and "synchroniz" in str(message):
            seen.append(message)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return len(seen)


def _no_sync_calls(sess, feeds_list) -> None:
    """After the first call, every host sync is one the session counts by name, and only a
    re-plan's free of device memory syncs (an arena outgrown by a larger shape: the direct
    allocator's cuMemFree waits for the kernels that may still read it). A second pass over the
    same shapes re-plans nothing and runs under sync debug "error": no sync at all."""
    sess.run(None, feeds_list[0])
    wait_all(120)  # earlier tests' sessions: their background builds done, their memory freed, before the count
    gc.collect()
    before = host_sync.counters()["host_syncs_by_op"]
    seen = _torch_syncs(lambda: [sess.run(None, f) for f in feeds_list[1:]])
    after = host_sync.counters()["host_syncs_by_op"]
    counted = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert seen == sum(counted.values()), (seen, counted)
    assert set(counted) <= {"free of device memory"}, counted
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for feeds in feeds_list:
            sess.run(None, feeds)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda_only
@pytest.mark.parametrize("static_impls", ["off", "auto"])
@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "inception_v1"])
def test_cnn_calls_do_not_sync(name, static_impls):
    if name not in cnn.light_models():
        pytest.skip(f"{name} is not among the light CNNs here")
    _, inp = cnn.light_models()[name]
    sess = dynashape.InferenceSession(str(cnn.model_path(name, "random")), device=DEVICE,
                                      dynamic_dims=cnn.dynamic_dims(name), static_impls=static_impls)
    feeds = [{inp: torch.randn(b, 3, 224, 224, device=DEVICE)} for b in (2, 3, 1, 4, 3, 2)]
    _no_sync_calls(sess, feeds)


@cuda_only
@pytest.mark.parametrize("static_impls", ["off", "auto"])
@pytest.mark.parametrize("name", list(hf.MODELS))
def test_transformer_calls_do_not_sync(name, static_impls):
    dims = {"batch": dynashape.Dimension(1, hf.MAX_BATCH), "seq": dynashape.Dimension(1, hf.MAX_SEQ)}
    sess = dynashape.InferenceSession(str(hf.model_path(name)), device=DEVICE, dim_params=dims,
                                      static_impls=static_impls)
    feeds = []
    for b, s in [(2, 7), (3, 17), (1, 5), (2, 7), (4, 33), (3, 17)]:
        f = {"input_ids": torch.randint(0, hf.TINY["vocab"], (b, s), device=DEVICE)}
        if name == "bert":
            f["attention_mask"] = torch.ones(b, s, dtype=torch.int64, device=DEVICE)
        feeds.append(f)
    _no_sync_calls(sess, feeds)


@cuda_only
def test_decode_steps_do_not_sync():
    path = llama.model_path()
    dims = {"batch": dynashape.Dimension(1, llama.MAX_BATCH), "seq": dynashape.Dimension(1, llama.MAX_SEQ),
            "past": dynashape.Dimension(0, llama.MAX_PAST)}
    sess = dynashape.InferenceSession(str(path), device=DEVICE, dim_params=dims, static_impls="off")
    names = llama.input_names()
    kv = (llama.TINY["kv_heads"], llama.TINY["head_dim"])
    past = [torch.zeros(1, kv[0], 0, kv[1], device=DEVICE) for _ in range(2 * llama.TINY["layers"])]
    ids = torch.randint(0, llama.TINY["vocab"], (1, 5), device=DEVICE)
    out = sess.run(None, dict(zip(names, [ids, *past])))

    def steps():
        nonlocal out
        for _ in range(12):
            ids = torch.randint(0, llama.TINY["vocab"], (1, 1), device=DEVICE)
            out = sess.run(None, dict(zip(names, [ids, *out[1:]])))
    before = host_sync.counters()["host_syncs"]
    seen = _torch_syncs(steps)
    # the KV storages and the arena grow ahead of the past (the ShapePredictor): a few frees, counted
    assert seen == host_sync.counters()["host_syncs"] - before
    assert seen <= 4

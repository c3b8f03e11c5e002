"""Batch buckets for convolutional regions (codegen/align.py kind "conv", runtime/aligned.py), and
the CUDA builds made off the calling thread (impls/static.py ``detached``).

A CNN's regions work image by image along the batch (proven from the ops, not guessed): one
static impl per bucket of batches (1, 2, 4, 8, then multiples of 8) serves every batch of it,
over padded views of the arena; the padded rows never reach an output. On CUDA this is on by
default with static impls; on the CPU (CI) the same path runs with the specialised region
source, turned on for the session here; on the device these tests run CUDA graphs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import Dimension
from dynashape.impls.static import _scratch
from dynashape.runtime.aligned import MAX_ALIGNED, conv_bucket


def cnn(mix_rows: bool = False, exported_pool: bool = False) -> onnx.ModelProto:
    """Conv-Relu-MaxPool, a residual Conv-Add-Relu, GlobalAveragePool, Flatten, Gemm over x [N, 3, 12, 12];
    ``mix_rows``: the logits minus their mean over the batch (rows of N meet); ``exported_pool``:
    the pool and flatten as torch.onnx writes a ResNet's (ReduceMean over axes 2, 3, Reshape)."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    inits = [init("W1", 8, 3, 3, 3), init("B1", 8), init("W2", 8, 8, 3, 3), init("B2", 8), init("WF", 5, 8),
             init("BF", 5)]
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "p1"], ["a2"]), helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "WF", "BF"], ["z"], transB=1)]
    if exported_pool:
        inits.append(onnx.numpy_helper.from_array(np.array([-1, 8], dtype=np.int64), "flat"))
        nodes[6:8] = [helper.make_node("ReduceMean", ["r2"], ["g"], axes=[2, 3], keepdims=1),
                      helper.make_node("Reshape", ["g", "flat"], ["f"])]
    out = "z"
    if mix_rows:
        nodes += [helper.make_node("ReduceMean", ["z"], ["m"], axes=[0], keepdims=1),
                  helper.make_node("Sub", ["z", "m"], ["y"])]
        out = "y"
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 12, 12])],
                          [helper.make_tensor_value_info(out, TP.FLOAT, ["N", 5])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(autouse=True)
def _specialized(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")  # builds in ms on the CPU


def _regions(sess):
    return [rc for st in sess._default.runner.states.values() for rc in st.spec.regions]


def _session(model, device):
    sess = dynashape.InferenceSession(model, device=device, static_impls="sync",
                                      dynamic_dims={"x": [Dimension(1, 32), 3, 12, 12]})
    sess.compiled.conv_buckets = True  # the CUDA default, on the CPU too for this test
    return sess


def test_buckets_are_powers_of_two_then_multiples_of_eight():
    assert [conv_bucket(v) for v in (1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 64)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 24, 24, 32, 64]
    assert conv_bucket(MAX_ALIGNED + 1) is None and conv_bucket(0) is None
    for v in range(1, MAX_ALIGNED + 1):  # never more than 8 images of padding, never less than the value
        assert v <= conv_bucket(v) <= v + max(8, v) - 1 and conv_bucket(v) - v < 8


def test_one_impl_per_bucket_serves_every_batch_and_padding_never_leaks(device):
    model = cnn()
    sess = _session(model, device)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    batches = [32, 3, 4, 7, 5, 3, 6, 2, 2, 12, 9, 15, 1, 1, 8, 30, 26, 4]
    for i, n in enumerate(batches):
        x = rng.standard_normal((n, 3, 12, 12)).astype(np.float32)
        if i == 1:  # garbage in every padded row the arena may hold: NaN must stay out of real rows
            sess._default.runner.arena.view(torch.uint8).fill_(0xFF)
        (y,) = sess.run(None, {"x": x})
        assert y.shape == (n, 5)
        np.testing.assert_allclose(y, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    aligned = [rc for rc in _regions(sess) if rc.align is not None]
    assert aligned and all(rc.align.kind == "conv" and rc.align.symbol == "N" for rc in aligned)
    st = sess.stats()
    buckets = {conv_bucket(n) for n in batches[1:]}
    assert 1 <= st["static_builds_aligned"] <= len(buckets) * len(aligned), st
    assert st["static_hits"] >= len(batches) // 2 and st["static_guard_fails"] == 0, st


def test_a_global_pool_written_as_reduce_mean_is_bucketed(device):
    """torch.onnx writes ResNet-50's global pool as a ReduceMean over (2, 3) and its flatten as a
    Reshape: reductions over the other axes keep images apart, so the region is bucketed (before,
    it was not, and a random batch built one impl per batch value: none landed in 100 calls)."""
    model = cnn(exported_pool=True)
    sess = _session(model, device)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    batches = [13, 3, 16, 9, 4, 11, 2]
    for n in batches:
        x = rng.standard_normal((n, 3, 12, 12)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    pooled = [rc for rc in _regions(sess) if any("ReduceMean" in line or "mean" in line for line in rc.body)]
    assert pooled and all(rc.align is not None and rc.align.kind == "conv" for rc in pooled)
    assert sess.stats()["static_builds_aligned"] <= len({conv_bucket(n) for n in batches})


def test_a_region_that_mixes_images_is_not_bucketed(device):
    model = cnn(mix_rows=True)
    sess = _session(model, device)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for n in (3, 5, 3, 5, 6):
        x = rng.standard_normal((n, 3, 12, 12)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    mixed = [rc for rc in _regions(sess) if any("ReduceMean" in line for line in rc.body)]
    assert mixed and all(rc.align is None for rc in mixed)
    assert sess.stats().get("static_builds_aligned", 0) == 0
    st = sess.stats()
    assert "build_wait_s" in st
    # the application's torch.cuda.synchronize() calls that waited for a background capture (process-wide)
    assert st["syncs_waited_on_capture"] >= 0 and st["sync_wait_on_capture_s"] >= 0.0


def test_scratch_live_ins_keep_sizes_and_strides_and_never_share_memory():
    x = torch.randn(4, 6)
    views = [x, x.t(), x[:, 1:4], torch.randn(5).expand(3, 5), torch.arange(10).reshape(2, 5)[:, ::2]]
    for v in views:
        s = _scratch(v)
        assert s.shape == v.shape and s.stride() == v.stride() and s.dtype == v.dtype
        assert s.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
        if not v.is_floating_point():
            assert int(s.abs().max()) == 0  # zeros: indices that are always valid
        else:
            assert bool(torch.isfinite(s).all())


def test_a_process_that_ends_while_builds_run_ends_cleanly(device, tmp_path):
    """A script that returns while its session's background builds are queued or running exits
    with 0 and no abort: the worker is a daemon, and nothing it holds may take the interpreter's
    exit down (an H100 run printed "terminate called without an active exception" at exit)."""
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), path)
    code = ("import numpy as np, dynashape\n"
            f"s = dynashape.InferenceSession({str(path)!r}, device={device!r}, static_impls='async')\n"
            "for n in (3, 17, 9, 3, 17, 9):\n"
            "    s.run(None, {'x': np.random.rand(n, 3, 12, 12).astype(np.float32)})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "DYNASHAPE_CPU_STATIC": "specialized"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "terminate called" not in r.stderr


class _FakeGraph:
    """Stands for a CUDA graph built off the calling thread (the CPU has none): its ``untuned``
    count is what the two-phase build reads."""

    kind, nbytes, aligned = "cuda_graph", 0, True

    def __init__(self, untuned: int) -> None:
        self.untuned = untuned

    def __call__(self, ins):
        return ("out",)


@pytest.mark.parametrize("untuned", [3, 0])
def test_a_first_graph_untimed_then_a_tuned_rebuild_replaces_it(untuned):
    """A region's background build on CUDA comes in two (runtime/spec_state.py ``_submit_detached``):
    a first graph with nothing timed, then, only if it left forms untimed, a tuned rebuild that
    replaces it in the cache; the replaced graph is kept until the request's next replay."""
    sess = dynashape.InferenceSession(cnn(), device="cpu", static_impls="async")
    sess.run(None, {"x": np.ones((2, 3, 12, 12), np.float32)})
    st = next(iter(sess._default.runner.states.values()))
    asked = []

    def build(tune=True, give_way=None, busy=None):
        asked.append(tune)
        return _FakeGraph(0 if tune else untuned)
    k = (st.token, 0, (16, "aligned"))
    st._submit_detached(k, build)
    assert sess.compiled.context.wait(10)
    impls = sess.compiled.impls
    stats = sess.stats()
    if untuned:
        assert asked == [False, True] and impls.peek(k).untuned == 0
        assert stats["static_builds"] == 1 and stats["static_builds_tuned"] == 1
        assert len(st.swapped) == 1
        assert st._replay(impls.peek(k), ()) == ("out",)
        assert not st.swapped and not st.retiring
    else:  # its forms were all timed before (a sibling batch, the disk cache): nothing to rebuild
        assert asked == [False] and stats.get("static_builds_tuned", 0) == 0 and not st.swapped


def test_a_tuned_rebuild_of_a_graph_no_longer_served_is_dropped():
    sess = dynashape.InferenceSession(cnn(), device="cpu", static_impls="async")
    sess.run(None, {"x": np.ones((2, 3, 12, 12), np.float32)})
    st = next(iter(sess._default.runner.states.values()))
    asked = []
    gate = __import__("threading").Event()

    def build(tune=True, give_way=None, busy=None):
        asked.append(tune)
        if not tune:
            return _FakeGraph(2)
        raise AssertionError("rebuilt a graph nobody serves")
    ctx = sess.compiled.context
    ctx.submit("hold", lambda: gate.wait(5), lambda *a: None)
    k = (st.token, 0, (8, "aligned"))
    st._submit_detached(k, build)
    # the first graph lands, then the plan moves before the rebuild runs: its key is gone
    ctx.submit("drop", lambda: sess.compiled.impls.drop(st.token), lambda *a: None)
    gate.set()
    assert ctx.wait(10)
    assert asked == [False] and sess.stats().get("static_builds_tuned", 0) == 0
    assert sess.stats().get("static_retune_failed", 0) == 0


def test_queued_two_phase_builds_hold_their_session_weakly():
    """A session deleted while its first graph and tuned rebuild wait in the queue is collected:
    the queued jobs hold it weakly, and are dropped when they come up."""
    import gc
    import threading
    import weakref

    sess = dynashape.InferenceSession(cnn(), device="cpu", static_impls="async")
    sess.run(None, {"x": np.ones((2, 3, 12, 12), np.float32)})
    st = next(iter(sess._default.runner.states.values()))
    ctx, gate, asked = sess.compiled.context, threading.Event(), []
    ctx.submit("hold", lambda: gate.wait(5), lambda *a: None)
    st._submit_detached((st.token, 0, (8, "aligned")), lambda tune=True, give_way=None, busy=None: asked.append(tune))
    alive = weakref.ref(st)
    del st, sess
    gc.collect()
    assert alive() is None
    gate.set()
    assert ctx.wait(10) and asked == []

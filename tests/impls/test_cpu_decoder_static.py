"""static_impls="auto" on CPU: async for a graph that appends to a KV cache (a decoder whose past
the caller feeds back) once the session has made DYNASHAPE_CPU_DECODE_STATIC calls (default 256),
off for any other graph; no region is traced before inductor's imports are done on their thread
(compile_process.prewarm, started when those calls are made), so no decode step waits for them."""

from __future__ import annotations

import threading

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import dynashape
from dynashape.compile.memory_plan import kv_appends
from dynashape.impls import compile_process
from dynashape.runtime import static_mode
from tests.models import llama


def _mlp() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Sigmoid", ["h"], ["y"])],
                          "mlp", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _concat_not_fed_back() -> onnx.ModelProto:
    """A Concat of two graph inputs that is not a graph output: no KV append."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, "s"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, "t"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "cat", [a, b], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_auto_on_cpu_waits_for_the_graph():
    assert static_mode.static_mode("auto", torch.device("cpu")) == "decoders"
    assert static_mode.static_mode("off", torch.device("cpu")) is None
    assert static_mode.static_mode("async", torch.device("cpu")) == "async"
    assert static_mode.for_graph("sync", None) == ("sync", 0) and static_mode.for_graph(None, None) == (None, 0)


def test_a_decoder_gets_async_static_impls_and_other_graphs_none(monkeypatch):
    monkeypatch.delenv("DYNASHAPE_CPU_DECODE_STATIC", raising=False)
    assert static_mode.cpu_decode_after() == static_mode.CPU_DECODE_AFTER == 256
    assert dynashape.InferenceSession(str(llama.model_path())).compiled.static_after == 256
    monkeypatch.setenv("DYNASHAPE_CPU_DECODE_STATIC", "1")
    dec = dynashape.InferenceSession(str(llama.model_path()))
    assert kv_appends(dec.program.fused or dec.program.graph) == 2 * llama.TINY["layers"]
    assert dec.compiled.static_after == 1
    _decode(dec, 1)
    assert dec.compiled.static == "async" and dec.stats()["static_impls"] == "async"
    for model, feeds in ((_mlp(), {"x": torch.randn(3, 4)}),
                         (_concat_not_fed_back(), {"a": torch.randn(1, 2), "b": torch.randn(1, 3)})):
        sess = dynashape.InferenceSession(model)
        sess.run(None, feeds)
        assert sess.compiled.static is None and sess.stats()["static_impls"] == "off"
    # an explicit choice is kept whatever the graph
    assert dynashape.InferenceSession(str(llama.model_path()), static_impls="off").compiled.static is None
    assert dynashape.InferenceSession(_mlp(), static_impls="sync").compiled.static == "sync"


def test_the_env_var_keeps_cpu_decoders_dynamic(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_CPU_DECODE_STATIC", "0")
    assert dynashape.InferenceSession(str(llama.model_path())).compiled.static is None
    monkeypatch.setenv("DYNASHAPE_STATIC_IMPLS", "async")  # the general switch still turns them on, at once
    sess = dynashape.InferenceSession(str(llama.model_path()))
    assert sess.compiled.static == "async" and sess.compiled.static_after == 0
    monkeypatch.delenv("DYNASHAPE_STATIC_IMPLS")
    monkeypatch.setenv("DYNASHAPE_CPU_DECODE_STATIC", "soon")
    with pytest.raises(dynashape.errors.OptionsError, match="DYNASHAPE_CPU_DECODE_STATIC"):
        dynashape.InferenceSession(str(llama.model_path()))


def _decode(sess, steps: int, batch: int = 1):
    names = llama.input_names()
    g = torch.Generator().manual_seed(0)
    past = [torch.zeros(batch, 2, 0, 16) for _ in range(4)]
    ids = torch.randint(0, 1000, (batch, 4), generator=g)
    outs = []
    for _ in range(steps):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        outs.append(out[0].clone())
        past = out[1:]
        ids = torch.randint(0, 1000, (batch, 1), generator=g)
    return outs


def test_no_region_is_traced_before_the_imports_are_done(monkeypatch):
    ready = {"now": False}
    monkeypatch.setattr(compile_process, "warmed", lambda: ready["now"])
    sess = dynashape.InferenceSession(str(llama.model_path()), static_impls="async")
    ref = _decode(dynashape.InferenceSession(str(llama.model_path()), static_impls="off"), 14)
    got = _decode(sess, 6)
    st = sess.stats()
    assert st["static_trace_time_s"] == 0 and st["static_builds"] == 0 and st["static_misses"] > 0, st
    ready["now"] = True  # the imports are done: the keys seen come back and are traced, one per call
    sess2 = _decode(sess, 14)
    assert sess.compiled.context.wait(300)
    st = sess.stats()
    assert st["static_trace_time_s"] > 0 and st["static_builds"] >= 1, st
    for a, b in zip(got + sess2, ref[:6] + ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_nothing_is_imported_or_traced_before_the_first_calls(monkeypatch):
    """A short generation pays nothing: the prewarm (inductor's imports, the compile process) and
    the traces wait for the session's first DYNASHAPE_CPU_DECODE_STATIC calls."""
    monkeypatch.setenv("DYNASHAPE_CPU_DECODE_STATIC", "8")
    started = []
    monkeypatch.setattr(compile_process, "prewarm", lambda: started.append(1))
    monkeypatch.setattr(compile_process, "warmed", lambda: bool(started))
    sess = dynashape.InferenceSession(str(llama.model_path()))
    ref = _decode(dynashape.InferenceSession(str(llama.model_path()), static_impls="off"), 16)
    got = _decode(sess, 7)
    assert not started and sess.stats()["static_trace_time_s"] == 0 and sess.compiled.calls == 7
    # before the threshold the regions do not even look for a static impl (SpecState.static_now)
    assert sess.stats()["static_misses"] == 0
    got += _decode(sess, 16)[7:]  # past the threshold: the prewarm starts, keys seen come back and are traced
    assert started and sess.compiled.context.wait(300)
    st = sess.stats()
    assert st["static_trace_time_s"] > 0 and st["static_builds"] >= 1, st
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_warmed_once_the_prewarm_thread_is_done():
    compile_process.prewarm()  # a second call starts no thread once the imports are done
    for t in threading.enumerate():
        if t.name == "dynashape-prewarm":
            t.join(120)
    assert compile_process.warmed()


def test_a_run_leaves_the_compile_process_a_core_while_builds_are_pending(monkeypatch):
    sess = dynashape.InferenceSession(str(llama.model_path()), static_impls="async")
    model = sess.compiled
    monkeypatch.setattr(compile_process, "warmed", lambda: True)
    pending = {"n": 0}
    monkeypatch.setattr(model.context, "pending", lambda: pending["n"])
    assert model.run_threads(4) == 4 and model.run_threads(None) is None  # nothing pending: as asked
    pending["n"] = 2
    assert model.run_threads(4) == 3 and model.run_threads(1) == 1
    have = torch.get_num_threads()
    assert model.run_threads(None) == (have - 1 if have > 1 else None)
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    before = torch.get_num_threads()
    _decode(sess, 2)
    assert torch.get_num_threads() == before  # restored after each run
    if before > 1:
        assert seen and seen[0] == before - 1
    off = dynashape.InferenceSession(_mlp())
    assert off.compiled.context is None and off.compiled.run_threads(3) == 3

"""Static impls of regions in a session: built when a key comes back (or at load for optimal
values), replayed on a hit, the dynamic path where they cannot serve, counted; results equal to
the dynamic path's, outputs handed out never change afterwards.

On CPU (CI) the static impl is the specialised region source; the CUDA graph impls run the same
tests with DYNASHAPE_TEST_DEVICE=cuda on the device.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import Dimension
from dynashape.impls import CannotCapture
from dynashape.runtime import spec_state, static_mode


def mlp(hidden: int = 16, dims: tuple = ("N", "S")) -> onnx.ModelProto:
    """y = sigmoid(tanh(softmax(relu(x @ W1 + b)^2 @ W2))) over x [*dims, 8]; also the hidden relu
    as an output."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((8, hidden)).astype(np.float32), "W1"),
             onnx.numpy_helper.from_array(rng.standard_normal((hidden,)).astype(np.float32), "b"),
             onnx.numpy_helper.from_array(rng.standard_normal((hidden, 8)).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Mul", ["r", "r"], ["r2"]),
             helper.make_node("MatMul", ["r2", "W2"], ["z"]), helper.make_node("Softmax", ["z"], ["p"], axis=-1),
             helper.make_node("Tanh", ["p"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TP.FLOAT, [*dims, 8])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [*dims, 8]),
                           helper.make_tensor_value_info("r", TP.FLOAT, [*dims, hidden])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds(n, s, device, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": (torch.rand(n, s, 8, generator=g) * 4 - 2).to(device)}


SHAPES = [(1, 3), (4, 5), (2, 7), (1, 3), (4, 5), (2, 7), (1, 3), (4, 5)]


def run_all(sess, device, shapes=SHAPES, wait=False):
    outs = []
    for i, (n, s) in enumerate(shapes):
        outs.append([o.clone() for o in sess.run(None, feeds(n, s, device, i))])
        if wait:
            sess.compiled.context.wait(30)
    return outs


def assert_same(a, b):
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            tol = _tol(u)
            torch.testing.assert_close(u, v, rtol=tol, atol=tol)


def _tol(u) -> float:
    """On CUDA a static impl may take the split product its build timed fastest (ops/split_tf32.py,
    within ~1e-5 of float32's) where the dynamic path takes cuBLAS's float32 product."""
    return 5e-5 if isinstance(u, torch.Tensor) and u.is_cuda else 1e-6


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_built_when_a_key_comes_back_then_hit(mode, device):
    ref = run_all(dynashape.InferenceSession(mlp(), device=device, static_impls="off"), device)
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls=mode)
    out = run_all(sess, device, wait=mode == "async")
    assert_same(out, ref)
    st = sess.stats()
    assert st["static_impls"] == mode
    assert st["static_builds"] == 3  # three keys, each built on its second sight
    assert st["static_hits"] >= 2 and st["impl_cache_size"] == 3 and st["static_refused"] == 0


def test_static_impls_off_and_auto(device):
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="off")
    run_all(sess, device)
    assert sess.stats()["static_impls"] == "off" and "static_hits" not in sess.stats()
    auto = static_mode.static_mode("auto", torch.device(device))
    assert auto == ("async" if device.startswith("cuda") else "decoders")  # CPU: async for KV decoders only
    with pytest.raises(dynashape.errors.OptionsError):
        dynashape.InferenceSession(mlp(), device=device, static_impls="sometimes")


def test_env_var_sets_the_mode(monkeypatch, device):
    monkeypatch.setenv("DYNASHAPE_STATIC_IMPLS", "sync")
    sess = dynashape.InferenceSession(mlp(), device=device)
    assert sess.compiled.static == "sync"
    monkeypatch.setenv("DYNASHAPE_STATIC_IMPLS", "0")
    assert dynashape.InferenceSession(mlp(), device=device).compiled.static is None


def test_lru_capacity_evicts_and_the_evicted_key_is_rebuilt(device):
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync", impl_cache_size=2)
    ref = run_all(dynashape.InferenceSession(mlp(), device=device, static_impls="off"), device, SHAPES * 2)
    assert_same(run_all(sess, device, SHAPES * 2), ref)
    st = sess.stats()
    assert st["impl_cache_size"] == 2 and st["impl_cache_evictions"] >= 1
    assert st["static_builds"] > 3  # a key evicted and seen again is built again


def test_optimal_values_are_built_at_load_and_other_shapes_take_the_dynamic_path(device, monkeypatch):
    monkeypatch.setenv("DYNASHAPE_FC_ALIGN", "0")  # exact shapes only (tests/impls/test_aligned.py: buckets)
    dims = {"x": [Dimension(1, 8, optimals=(2, 4)), Dimension(1, 16, optimals=(5,)), 8]}
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync", dynamic_dims=dims)
    st = sess.stats()
    assert st["optimal_shapes_prebuilt"] == 2 and st["static_builds"] == 2 and st["impl_cache_size"] == 2
    ref = dynashape.InferenceSession(mlp(), device=device, static_impls="off")
    hits, misses = st["static_hits"], st["static_misses"]
    f = feeds(4, 5, device, 11)
    assert_same([sess.run(None, f)], [ref.run(None, f)])
    st = sess.stats()
    assert st["static_hits"] == hits + 1 and st["static_misses"] == misses  # select_module: shapes equal
    f = feeds(3, 5, device, 12)  # not an optimal value: a miss, served by the dynamic impl
    assert_same([sess.run(None, f)], [ref.run(None, f)])
    st = sess.stats()
    assert st["static_hits"] == hits + 1 and st["static_misses"] == misses + 1 and st["static_builds"] == 2


def test_a_region_that_cannot_be_captured_keeps_the_dynamic_path_counted(device, monkeypatch):
    def refuse(*a, **k):
        def build():
            raise CannotCapture("a kernel synchronises with the host")
        return build
    monkeypatch.setattr(spec_state, "static_builder", refuse)
    ref = run_all(dynashape.InferenceSession(mlp(), device=device, static_impls="off"), device)
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    assert_same(run_all(sess, device), ref)
    st = sess.stats()
    assert st["static_refused"] == 3 and st["static_refused_runs"] >= 2 and st.get("static_hits", 0) == 0


def test_outputs_held_by_the_caller_do_not_change_on_the_next_call(device):
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    for i in range(3):
        sess.run(None, feeds(2, 4, device, i))  # built, then replayed
    held = sess.run(None, feeds(2, 4, device, 100))
    kept = [h.clone() for h in held]
    for i in range(3):
        sess.run(None, feeds(2, 4, device, 200 + i))
    assert sess.stats()["static_hits"] >= 3
    for h, k in zip(held, kept):
        assert torch.equal(h, k)


def test_requests_on_threads(device):
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="async")
    ref = dynashape.InferenceSession(mlp(), device=device, static_impls="off")
    errors = []

    def work(seed):
        req = sess.create_infer_request()
        try:
            for i, (n, s) in enumerate(SHAPES * 2):
                f = feeds(n, s, device, seed * 100 + i)
                for a, b in zip(req.run(None, f), ref.create_infer_request().run(None, f)):
                    torch.testing.assert_close(a, b, rtol=_tol(a), atol=_tol(a))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    sess.compiled.context.wait(30)
    assert sess.compiled.impls.summary()["impl_cache_size"] >= 3  # per request: impls read its own arena


def decode_alike(sess, ref, device, steps: int) -> None:
    """A greedy-decode-like loop of the test decoder (a prompt of 5, then one token per step, the
    present fed back) through ``sess`` and ``ref``: every output equal at every step."""
    from tests.models import llama
    names = llama.input_names()
    torch.manual_seed(0)
    past = past_ref = [torch.zeros(2, 2, 0, 16, device=device) for _ in range(4)]
    ids = torch.randint(0, 1000, (2, 5), device=device)
    for _step in range(steps):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        out_ref = ref.run(None, dict(zip(names, [ids, *past_ref])))
        for a, b in zip(out, out_ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        past, past_ref = out[1:], out_ref[1:]
        ids = torch.randint(0, 1000, (2, 1), device=device)


def test_regions_of_a_decode_step_leave_the_past_to_the_attention(device):
    from tests.models import llama
    sess = dynashape.InferenceSession(str(llama.model_path()), device=device, static_impls="sync",
                                   decode_graphs="off")  # the regions, not the whole-step graph
    ref = dynashape.InferenceSession(str(llama.model_path()), device=device, static_impls="off")
    decode_alike(sess, ref, device, 20)  # the past grows past the arena's capacity: re-plans drop impls
    spec = [s for s in sess.compiled.specs if s.regions][-1]
    assert all("past" not in rc.region.syms for rc in spec.regions if rc.region.kernels > 1)
    st = sess.stats()
    assert st["static_hits"] >= 10 * len(spec.regions)  # the same impls serve every decode step


def test_a_capture_that_fails_after_the_real_run_serves_the_call_with_that_run(device, monkeypatch):
    """A CUDA capture fails after the region ran once for real on the impl's buffers: the call
    takes those results; running the region again could read what that run overwrote."""
    runs = []

    def run_then_refuse(dev, fn, body, params, live_out, symvars, symvals, ins, refresh, results, ns, filename,
                        detach=False):
        def build():
            first = fn(*symvals, *ins)
            runs.append(1)
            raise CannotCapture("a kernel synchronises with the host", tuple(first))
        return build
    monkeypatch.setattr(spec_state, "static_builder", run_then_refuse)
    ref = run_all(dynashape.InferenceSession(mlp(), device=device, static_impls="off"), device)
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    assert_same(run_all(sess, device), ref)
    st = sess.stats()
    assert len(runs) == st["static_refused"] == 3 and st["static_refused_runs"] >= 2


def test_refusals_are_logged_with_verbose(device, monkeypatch, capsys):
    def refuse(*a, **k):
        def build():
            raise CannotCapture("a kernel synchronises with the host")
        return build
    monkeypatch.setattr(spec_state, "static_builder", refuse)
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync", verbose=1)
    run_all(sess, device)
    err = capsys.readouterr().out
    assert "cannot be captured; the dynamic impl serves it: a kernel synchronises with the host" in err
    assert list(sess.compiled.refusals)[-1].endswith("a kernel synchronises with the host")


def _big_linear(k: int = 3072, n: int = 768) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal((k, n)) / 50).astype(np.float32), "W"),
             onnx.numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"]),
             helper.make_node("Relu", ["y"], ["r"]), helper.make_node("Mul", ["r", "r"], ["r2"]),
             helper.make_node("Sigmoid", ["r2"], ["s"])]  # the output's own line bounds the region
    g = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", k])],
                          [helper.make_tensor_value_info("s", TP.FLOAT, ["N", n])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_graphs_keep_their_blas_workspace_when_cublas_forgets_its_own(device):
    """torch.compile's CUDA graphs clear cuBLAS's workspaces before and after each recording; a
    static impl whose products used the workspace cuBLAS kept for the capture stream would then
    write into freed memory at every replay (found beside torch.compile(mode="reduce-overhead"):
    a later cuDNN convolution failed). Canaries allocated after the clear must survive replays."""
    if not device.startswith("cuda"):
        pytest.skip("cuBLAS workspaces: DYNASHAPE_TEST_DEVICE=cuda")
    from dynashape.impls import static as static_mod
    sess = dynashape.InferenceSession(_big_linear(), device=device, static_impls="sync")
    x = torch.randn(16, 3072, device=device)
    ref = dynashape.InferenceSession(_big_linear(), device=device, static_impls="off").run(None, {"x": x})[0]
    for _ in range(3):  # dynamic, build, replay
        out = sess.run(None, {"x": x})[0]
    assert sess.stats()["static_hits"] >= 1
    torch._C._cuda_clearCublasWorkspaces()
    side = static_mod._capture_stream(torch.device(device))
    with torch.cuda.stream(side):  # freed workspace blocks go back to the stream that allocated them
        canaries = [torch.full((1 << 20,), 7.0, device=device) for _ in range(48)]
    torch.cuda.synchronize()
    for _ in range(3):
        out = sess.run(None, {"x": x})[0]
    torch.cuda.synchronize()
    assert all(bool((c == 7.0).all()) for c in canaries)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_a_build_that_failed_over_a_replaced_plan_is_not_refused(device):
    """A larger shape re-planned the arena while a background build ran over the old one (padded
    calls' buckets grow it in a session's first calls): its failure says nothing of the key, which
    a later call builds again, so it is counted, not refused."""
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    sess.run(None, feeds(2, 3, device, 1))
    st = next(iter(sess._default.runner.states.values()))
    stale = (st.token[0], st.token[1] - 1)
    st._built((stale, 0, (2, 3)), CannotCapture("a pointer of the old arena"), 0.0)
    assert not st.refused and sess.stats()["static_stale_failures"] == 1
    st._built((st.token, 0, (2, 3)), CannotCapture("a kernel synchronises with the host"), 0.0)
    assert st.refused == {(0, (2, 3))} and sess.stats()["static_refused"] == 1

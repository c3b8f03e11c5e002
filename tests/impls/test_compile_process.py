"""The compile process (impls/compile_process.py, impls/inductor_worker.py): CPU regions are
lowered and compiled by inductor in a process of their own while the serving thread keeps
running; what it sends back is loaded here and equals the region's lines; a process that dies
is an error of that build only, and the next build starts a new one; a trace that fails leaves
the specialised source, counted; an async session traces at most one region per call."""

from __future__ import annotations

import threading

import pytest
import torch

import dynashape
from dynashape.impls import compile_process
from dynashape.impls import static as static_mod
from dynashape.impls.static import static_builder
from tests.models import llama


def _chain(n, x, y, scale):
    z = x
    for _ in range(9):  # nine element-wise ops: enough for inductor
        z = torch.cos(z) * scale + y
    return (z, torch.mul(y, z, out=y))


def _traced(seed: int):
    g = torch.Generator().manual_seed(seed)
    block = torch.randn(40, generator=g)  # two live-ins viewing one block, as arena views do
    x, y = block[:12].view(3, 4), block[20:32].view(3, 4)
    return block, x, y, static_mod.InductorImpl(_chain, (3,), (x, y, 0.7))


def test_a_region_compiled_in_the_process_equals_its_lines_and_keeps_aliasing():
    block, x, y, impl = _traced(0)
    want_block = block.clone()
    want = _chain(3, want_block[:12].view(3, 4), want_block[20:32].view(3, 4), 0.7)
    impl.compile()
    got = impl((x, y, 0.7))
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(block, want_block, rtol=1e-6, atol=1e-6)  # the write into the block happened
    assert got[1].data_ptr() == y.data_ptr()  # a live-out that is a live-in is that live-in


def test_a_compile_process_that_dies_fails_that_build_only():
    proc = compile_process.CompileProcess()
    try:
        with pytest.raises(compile_process.CompileProcessError, match="failed"):
            proc.compile(b"not a pickle", None)  # the process cannot read it and exits
        block, x, y, impl = _traced(1)
        impl.inner.fn = proc.compile(impl.inner.request, impl.inner.gm)  # a new process serves the next
        assert proc.starts == 2 and proc.builds == 1
        want = _chain(3, x.clone(), y.clone(), 0.7)
        torch.testing.assert_close(impl((x, y, 0.7))[0], want[0], rtol=1e-6, atol=1e-6)
    finally:
        proc.close()


def test_a_region_inductor_cannot_trace_keeps_its_specialised_source_counted(monkeypatch):
    def refuse(self, *a, **k):
        raise RuntimeError("an op inductor refuses")
    monkeypatch.setattr(static_mod.InductorImpl, "__init__", refuse)
    x = torch.randn(2, 3)
    build = static_builder(torch.device("cpu"), None, ["y = torch.add(x, x)"], ["n", "x"], ["y"], ["n"], (2,),
                           (x,), [True], [False], {"torch": torch}, "<test>")
    impl = build()
    assert impl.kind == "specialized" and "an op inductor refuses" in impl.fallback
    torch.testing.assert_close(impl((2, x))[0], x + x)


def test_an_async_session_traces_at_most_one_region_per_call(monkeypatch):
    traces: list[int] = []
    calls = [0]
    real_init = static_mod.InductorImpl.__init__

    def counting(self, *a, **kw):
        assert threading.current_thread() is threading.main_thread()
        traces.append(calls[0])
        real_init(self, *a, **kw)
    monkeypatch.setattr(static_mod.InductorImpl, "__init__", counting)
    path, names = str(llama.model_path()), llama.input_names()
    sess = dynashape.InferenceSession(path, static_impls="async")
    g = torch.Generator().manual_seed(0)
    past = [torch.zeros(1, 2, 0, 16) for _ in range(4)]
    for step in range(8):
        calls[0] = step
        out = sess.run(None, dict(zip(names, [torch.randint(0, 1000, (1, 1), generator=g), *past])))
        past = out[1:]
    assert sess.compiled.context.wait(300)
    assert len(traces) >= 2 and len(set(traces)) == len(traces), traces  # one per call, over several calls
    assert sess.stats()["static_builds_inductor"] >= 1

"""Static impls on CPU compiled by inductor (impls/static.py ``InductorImpl``): a region with
enough element-wise work is traced to aten ops over fake tensors and compiled; its results and
its writes into the arena equal the dynamic path's; a region with little to fuse keeps the
specialised source; a non-tensor live-in the build took as a constant guards the impl."""

from __future__ import annotations

import pytest
import torch

import dynashape
from dynashape.impls import static as static_mod
from tests.models import llama


def _decode(sess, names, steps: int, seed: int = 0, batch: int = 2):
    g = torch.Generator().manual_seed(seed)
    past = [torch.zeros(batch, 2, 0, 16) for _ in range(4)]
    ids = torch.randint(0, 1000, (batch, 5), generator=g)
    outs = []
    for _ in range(steps):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        outs.append([o.clone() for o in out])
        past = out[1:]
        ids = torch.randint(0, 1000, (batch, 1), generator=g)
    return outs


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_decode_on_compiled_regions_equals_the_dynamic_path(mode):
    path, names = str(llama.model_path()), llama.input_names()
    sess = dynashape.InferenceSession(path, static_impls=mode)
    ref = dynashape.InferenceSession(path, static_impls="off")
    got = _decode(sess, names, 6)
    if mode == "async":  # the builds run on the worker meanwhile; once done, the impls serve
        assert sess.compiled.context.wait(300)
        got += _decode(sess, names, 6, seed=1)
    want = _decode(ref, names, 6) + (_decode(ref, names, 6, seed=1) if mode == "async" else [])
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    st = sess.stats()
    assert st.get("static_inductor_fallbacks", 0) == 0, list(sess.compiled.refusals)
    assert st["static_builds_inductor"] >= 1 and st["static_hits"] >= 1, st


def test_a_region_with_little_to_fuse_keeps_the_specialised_source():
    def fn(n, a, b):  # two ops
        return (torch.add(a, b), torch.mul(a, b))
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(static_mod.TooLittleToFuse):
        static_mod.InductorImpl(fn, (4,), (a, b))


def _chain(n, x, scale):
    y = x
    for _ in range(10):  # ten element-wise ops: enough for inductor
        y = torch.sin(y) * scale + y
    return (y, torch.add(x, y, out=x))  # and a write into a live-in, as regions write the arena


def test_the_compiled_region_writes_its_live_ins_as_the_lines_do_and_guards_its_constants():
    x = torch.randn(3, 5)
    impl = static_mod.InductorImpl(_chain, (3,), (x.clone(), 0.5)).compile()
    assert impl.kind == "inductor"
    want_x = x.clone()
    want = _chain(3, want_x, 0.5)
    got_x = x.clone()
    got = impl((got_x, 0.5))
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_x, want_x, rtol=1e-6, atol=1e-6)  # the in-place write happened
    assert impl((x.clone(), 0.25)) is None  # another constant: the dynamic path serves


def test_env_var_chooses_the_specialised_source(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")
    path, names = str(llama.model_path()), llama.input_names()
    sess = dynashape.InferenceSession(path, static_impls="sync")
    _decode(sess, names, 4)
    st = sess.stats()
    assert st.get("static_builds_inductor", 0) == 0 and st["static_builds_specialized"] >= 1


def test_inductor_builds_trace_in_the_calling_thread_and_compile_beside_it(monkeypatch):
    """FX tracing keeps module-level state (a trace on the worker broke a torch.compile running
    meanwhile in the application's thread): the trace runs in the call; the compilation on the
    worker, in the compile process, while the dynamic impl serves."""
    import threading
    traced, compiled = [], []
    real_init, real_compile = static_mod.InductorImpl.__init__, static_mod.InductorImpl.compile

    def recording_init(self, *a, **kw):
        traced.append(threading.current_thread())
        real_init(self, *a, **kw)

    def recording_compile(self):
        compiled.append(threading.current_thread())
        return real_compile(self)
    monkeypatch.setattr(static_mod.InductorImpl, "__init__", recording_init)
    monkeypatch.setattr(static_mod.InductorImpl, "compile", recording_compile)
    path, names = str(llama.model_path()), llama.input_names()
    sess = dynashape.InferenceSession(path, static_impls="async")
    _decode(sess, names, 10)  # one trace per call: the regions come one call after another
    assert sess.compiled.context.wait(300)
    assert traced and all(t is threading.main_thread() for t in traced)
    assert compiled and all(t.name == "dynashape-compile" for t in compiled)
    st = sess.stats()
    # (an earlier test's session may still compile on its own worker: counted in ``compiled`` too)
    assert 1 <= st["static_builds_inductor"] <= len(compiled) and st.get("static_inductor_fallbacks", 0) == 0, \
        (dict(st), list(sess.compiled.refusals))
    from dynashape.impls.compile_process import process
    assert process().builds >= len(compiled)


@pytest.mark.parametrize("var,value", [("DYNASHAPE_CPU_STATIC", "bogus"), ("DYNASHAPE_STATIC_FORMS", "yes"),
                                       ("DYNASHAPE_CUDNN_BENCHMARK_LIMIT", "-3")])
def test_bad_build_settings_are_typed_errors_that_name_the_variable(monkeypatch, var, value):
    from dynashape.errors import OptionsError
    monkeypatch.setenv(var, value)
    check = {"DYNASHAPE_CPU_STATIC": static_mod.cpu_kind, "DYNASHAPE_STATIC_FORMS": static_mod.timed_forms,
             "DYNASHAPE_CUDNN_BENCHMARK_LIMIT": static_mod.cudnn_benchmark_limit}[var]
    with pytest.raises(OptionsError, match=var):
        check()
    if var == "DYNASHAPE_CPU_STATIC":  # a CPU session with static impls says so when it is made
        with pytest.raises(OptionsError, match=var):
            dynashape.InferenceSession(str(llama.model_path()), static_impls="sync")

"""ImplCache (LRU, thread-safe) and CompilationContext (one worker, deduplicated builds)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from dynashape.impls import CompilationContext, ImplCache
from dynashape.impls.cache import capacity_from


def test_lru_evicts_the_least_recently_used():
    c = ImplCache(2)
    c.put(("t", 0, (1,)), "a")
    c.put(("t", 0, (2,)), "b")
    assert c.get(("t", 0, (1,))) == "a"  # (1,) is now the most recent
    c.put(("t", 0, (3,)), "c")
    assert ("t", 0, (2,)) not in c and ("t", 0, (1,)) in c and ("t", 0, (3,)) in c
    s = c.summary()
    assert s["impl_cache_evictions"] == 1 and s["impl_cache_hits"] == 1 and s["impl_cache_size"] == 2
    assert c.get(("t", 0, (2,))) is None and c.summary()["impl_cache_misses"] == 1


def test_capacity_zero_is_unbounded_and_drop_forgets_one_token():
    c = ImplCache(0)
    for i in range(500):
        c.put(("a" if i % 2 else "b", 0, (i,)), i)
    assert len(c) == 500 and c.summary()["impl_cache_evictions"] == 0
    assert c.drop("a") == 250 and len(c) == 250
    assert all(k[0] == "b" for k in c._items)


def test_capacity_from_option_and_env(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_IMPL_CACHE", "7")
    assert capacity_from(None) == 7 and capacity_from(3) == 3
    monkeypatch.delenv("DYNASHAPE_IMPL_CACHE")
    assert capacity_from(None) == 300
    with pytest.raises(ValueError):
        ImplCache(-1)


def test_async_build_is_deduplicated_and_reports_once():
    ctx = CompilationContext("async")
    gate = threading.Event()
    built, done = [], []

    def build():
        gate.wait(5)
        built.append(1)
        return "impl"
    assert ctx.submit("k", build, lambda k, r, s: done.append((k, r)))
    assert not ctx.submit("k", build, lambda k, r, s: done.append((k, r)))  # queued already
    assert ctx.pending() == 1
    gate.set()
    assert ctx.wait(5)
    assert built == [1] and done == [("k", "impl")] and ctx.pending() == 0
    assert ctx.submit("k", lambda: "again", lambda k, r, s: done.append((k, r)))  # done: may build again
    assert ctx.wait(5) and done[-1] == ("k", "again")


def test_sync_builds_in_the_callers_thread_and_failures_are_reported():
    ctx = CompilationContext("sync")
    seen = []
    me = threading.get_ident()
    ctx.submit("a", lambda: threading.get_ident(), lambda k, r, s: seen.append(r))

    def fail():
        raise RuntimeError("cannot")
    ctx.submit("b", fail, lambda k, r, s: seen.append(r))
    assert seen[0] == me and isinstance(seen[1], RuntimeError) and ctx.pending() == 0


def test_worker_keeps_order_and_runs_in_the_background():
    ctx = CompilationContext("async")
    order = []
    for i in range(5):
        ctx.submit(i, lambda i=i: (time.sleep(0.01), i)[1], lambda k, r, s: order.append(r))
    assert ctx.wait(5) and order == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        CompilationContext("later")


def test_a_queued_build_sees_the_submitting_runs_settings():
    # a run's settings held in ContextVars (a session's u8s8_saturate) hold for the builds it queues
    from dynashape.ops.u8s8 import SESSION_SATURATE, u8s8_saturation
    ctx = CompilationContext("async")
    seen = []
    token = SESSION_SATURATE.set(True)
    try:
        ctx.submit("k", lambda: seen.append(u8s8_saturation()), lambda k, r, s: None)
    finally:
        SESSION_SATURATE.reset(token)
    assert ctx.wait(5) and seen == [True]


def test_stop_drops_queued_builds_and_waits_for_the_running_one():
    # what the exit does (context._stop_all): nothing runs on the worker once the interpreter tears down
    ctx = CompilationContext("async")
    started, gate, ran = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        gate.wait(5)
        ran.append("slow")
    ctx.submit("slow", slow, lambda k, r, s: None)
    for i in range(3):
        ctx.submit(i, lambda i=i: ran.append(i), lambda k, r, s: None)
    assert started.wait(5)
    threading.Timer(0.05, gate.set).start()
    assert ctx.stop(5)  # returns once the running build is done
    assert ran == ["slow"] and ctx.pending() == 0
    assert not ctx.submit("later", lambda: ran.append("later"), lambda k, r, s: None)
    assert ctx.stop(0) and ran == ["slow"]


def test_every_context_is_stopped_at_exit():
    # (only this test's context is stopped here: the others of the test process live on)
    from dynashape.impls import context
    ctx = CompilationContext("async")
    assert ctx in context._contexts
    gate = threading.Event()
    ctx.submit("k", lambda: gate.wait(5), lambda k, r, s: None)
    threading.Timer(0.05, gate.set).start()
    context._stop_all([ctx])
    assert ctx.pending() == 0 and not ctx.submit("k2", lambda: None, lambda k, r, s: None)


def test_a_lower_priority_waits_and_a_build_that_gives_way_is_queued_again():
    """Priority 0 (a region's first graph) before 1 (tuned rebuilds), FIFO within one; a build
    that raises Requeue while a priority-0 build waits runs again after it, and is reported once."""
    from dynashape.impls.context import Requeue
    ctx = CompilationContext("async")
    gate, order, reports = threading.Event(), [], []
    attempts = {"tune": 0}

    def block():
        gate.wait(5)
        order.append("block")

    def tune():
        attempts["tune"] += 1
        if attempts["tune"] == 1:
            ctx.submit("late", lambda: order.append("late"), lambda *a: reports.append(a[0]))
            assert ctx.urgent()
            raise Requeue("a first graph waits")
        order.append("tune")
        return "tuned"

    ctx.submit("block", block, lambda *a: reports.append(a[0]))
    ctx.submit("tune", tune, lambda k, r, s: reports.append((k, r)), priority=1)
    ctx.submit("first", lambda: order.append("first"), lambda *a: reports.append(a[0]))
    assert ctx.urgent()  # "first" waits behind the running "block"
    gate.set()
    assert ctx.wait(10)
    assert order == ["block", "first", "late", "tune"], order
    assert reports.count(("tune", "tuned")) == 1 and attempts["tune"] == 2
    assert not ctx.urgent() and ctx.pending() == 0


def test_a_build_that_waits_for_the_queue_to_settle_gives_way_to_first_graphs_queued_meanwhile():
    """A tuned rebuild begins only once no first graph was queued for a while (``settled``): until
    then it gives way with a delay, which a first graph queued meanwhile cuts short."""
    from dynashape.impls.context import Requeue
    ctx = CompilationContext("async")
    order, seen, at = [], [], {}

    def tune():
        seen.append(ctx.settled(0.3))
        if not ctx.settled(0.3):
            if len(seen) == 1:  # a first graph arrives while the rebuild waits out a long delay
                threading.Timer(0.05, lambda: ctx.submit("first", first, lambda *a: None)).start()
                raise Requeue("first graphs were queued just now", delay=5.0)
            raise Requeue("first graphs were queued just now", delay=0.05)
        at["tune"] = time.monotonic()
        order.append("tune")

    def first():
        at["first"] = time.monotonic()
        order.append("first")

    t0 = time.monotonic()
    ctx.submit("quick", lambda: order.append("quick"), lambda *a: None)
    ctx.submit("tune", tune, lambda *a: None, priority=1)
    assert ctx.wait(10)
    assert order == ["quick", "first", "tune"], order
    assert seen[0] is False and seen[-1] is True
    assert at["first"] - t0 < 2.0  # the 5 s wait was cut short by the first graph queued meanwhile
    assert at["tune"] - at["first"] >= 0.25  # and the rebuild began once the queue had settled


def test_the_switch_interval_is_short_while_the_worker_builds_and_restored_after():
    import sys

    from dynashape.impls.context import SWITCH_S
    before = sys.getswitchinterval()
    seen = []
    ctx = CompilationContext("async")
    ctx.submit("k", lambda: seen.append(sys.getswitchinterval()), lambda *a: None)
    assert ctx.wait(10)
    assert seen and seen[0] <= SWITCH_S + 1e-9
    assert sys.getswitchinterval() == before


def test_a_tuned_rebuild_waits_for_first_graphs_and_with_retune_idle_for_the_calls_to_pause(monkeypatch):
    """``may_tune``: a rebuild gives way to a first graph queued or queued just now; with
    retune 'idle' also to calls, before it starts (a delay of IDLE_S) and before each key."""
    from dynashape.errors import OptionsError
    from dynashape.impls import context
    from dynashape.impls.context import Requeue, retune_policy
    ctx = CompilationContext("async")
    ctx._last_urgent = time.monotonic() - 10  # the first graphs were queued long ago
    give_way = ctx.may_tune(idle_only=False)
    ctx.call_began()  # calls do not hold a rebuild back by default
    ctx.call_ended()
    assert ctx.may_tune(idle_only=False)() is False and give_way() is False
    with pytest.raises(Requeue) as rq:
        ctx.may_tune(idle_only=True)
    assert rq.value.delay == context.IDLE_S
    ctx._last_call = time.monotonic() - 2 * context.IDLE_S  # the calls paused
    give_way = ctx.may_tune(idle_only=True)
    assert give_way() is False
    ctx.call_began()  # a call comes: the build stops before its next key
    assert give_way() is True
    ctx._last_urgent = time.monotonic()  # a first graph was queued just now: everyone waits
    for idle_only in (False, True):
        with pytest.raises(Requeue):
            ctx.may_tune(idle_only)
    monkeypatch.setenv("DYNASHAPE_RETUNE", "idle")
    assert retune_policy() == "idle"
    monkeypatch.setenv("DYNASHAPE_RETUNE", "sometimes")
    with pytest.raises(OptionsError, match="DYNASHAPE_RETUNE"):
        retune_policy()


def test_calls_mark_the_context_so_a_tuned_rebuild_can_wait_for_them_to_pause():
    import dynashape
    from tests.impls.test_static_impls import feeds, mlp
    sess = dynashape.InferenceSession(mlp(), device="cpu", static_impls="async")
    ctx = sess.compiled.context
    assert not sess.compiled.marks_calls  # only CUDA's async builds read the marks: the CPU's calls skip them
    sess.run(None, feeds(2, 3, "cpu", 0))
    assert ctx.idle(60.0)
    sess.compiled.marks_calls = True  # (as on CUDA)
    seen = []
    ctx.call_ended = lambda f=ctx.call_ended: (seen.append(ctx.calls_running()), f())  # inside the call: running
    sess.run(None, feeds(2, 3, "cpu", 0))
    assert seen == [True] and not ctx.calls_running()
    assert not ctx.idle(60.0)  # the call just now


def test_a_courteous_build_pauses_before_each_torch_call_only_while_a_call_runs(monkeypatch):
    from dynashape.errors import OptionsError
    from dynashape.impls import context
    from dynashape.impls.context import Courtesy, courtesy_on
    slept = []
    monkeypatch.setattr(context.time, "sleep", slept.append)
    busy = [False]
    x = torch.ones(3)
    with Courtesy(lambda: busy[0]):
        y = torch.add(x, 1)
        busy[0] = True
        z = torch.mul(y, 2) + 1  # two torch calls while busy
    assert slept == [context.COURTESY_S] * 2 and z.tolist() == [5.0] * 3
    # the mode is the build thread's alone: the caller's torch calls meanwhile never pause
    inside, outside = threading.Event(), threading.Event()

    def build():
        with Courtesy(lambda: True):
            inside.set()
            outside.wait(10)
            torch.add(x, 1)
    worker = threading.Thread(target=build)
    worker.start()
    assert inside.wait(10)
    slept.clear()
    torch.mul(x, 3) + 2  # a caller's calls while the build's mode is on
    assert slept == []
    outside.set()
    worker.join(10)
    assert slept == [context.COURTESY_S]
    monkeypatch.setenv("DYNASHAPE_BUILD_COURTESY", "1")
    assert courtesy_on()
    monkeypatch.setenv("DYNASHAPE_BUILD_COURTESY", "yes")
    with pytest.raises(OptionsError, match="DYNASHAPE_BUILD_COURTESY"):
        courtesy_on()

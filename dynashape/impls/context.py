"""CompilationContext: builds static impls on one background worker while the dynamic impl serves.

``submit(key, build, done)`` queues ``build()`` unless the same key is queued or building
(deduplicated); the worker calls ``done(key, impl_or_exception, seconds)`` when it finishes.
Builds of a lower ``priority`` number run first, in the order queued: a CUDA region's first
graph (untuned, ~10x cheaper) before any tuned rebuild (runtime/spec_state.py). A build that
raises ``Requeue`` goes back into the queue behind the others: a tuned rebuild does so when a
first graph is waiting (``urgent``), before it times a key's forms, so a new bucket's graph
never waits for another's tuning (on an H200 a ResNet-50 bucket's tuning under traffic took
~1.5 s, and the graphs of the buckets seen meanwhile waited for it). A tuned rebuild also waits to
begin until no first graph has been queued for ``SETTLE_S`` (``settled``; it raises
``Requeue(delay=...)`` and the worker waits that long, or until a first graph comes): a key's
timing cannot be interrupted, and ResNet-50 cycling batches 1, 8, 3, 16 had the tuning of bucket
1, begun between the first call and the second, hold the first graphs of buckets 8, 4 and 16
back for 0.43 s, 50 calls on the dynamic path (H200, benchmarks/build_timeline.py --per-call).

While the worker builds, the interpreter's switch interval is 0.5 ms instead of 5 (``_quick_switches``):
the worker's Python holds the GIL between the caller's kernel launches, and a caller that wants it
back waits up to one interval each time (ResNet-50 calls of 5 ms took 20-27 ms while a bucket was
tuned beside them). 0.1 ms measured no better: a cold ResNet-50's calls at a new batch beside its
first graphs' builds took 64-67 ms against 42-46 at 0.5 ms (H200, one run each, 2026-11-29).
Mode ``"sync"`` builds in the caller's thread at once (benchmarks and tests that want the
static impl on the call that asks), ``"async"`` on the worker. The worker is a daemon thread
started on the first job; ``wait()`` blocks until the queue is empty (tests, prebuilding).

CUDA graph captures were first built inline, in the calling thread, whatever the mode: while a
stream of the process is being captured, a ``torch.cuda.synchronize()`` anywhere in the
application fails (cudaErrorStreamCaptureUnsupported; measured on an H100 with the capture on a
worker thread in thread-local mode). ``capture_guard.py`` now holds torch's device-wide
synchronisations (and the direct allocator's frees) during any capture of a CUDA session, so an
async CUDA build runs on this worker (``impls/static.py`` ``detached``); ``inline=True`` remains
for ``"sync"`` builds and prebuilding at load.

A queued build runs in a copy of the submitting thread's context: the run's settings held in
ContextVars (the session's u8s8_saturate, its loop limit) hold for the build too, as they would
have for a build in the call.

At interpreter exit the workers are stopped (``_stop_all``, registered with ``atexit``): queued
builds are dropped and the exit waits (bounded) for the one running. A daemon thread still inside
a CUDA capture or a cuDNN call while the interpreter and the C++ runtime tear down aborted the
process ("terminate called without an active exception", H100 and H200, a script that returned
while its session's builds ran).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import itertools
import logging
import os
import queue
import sys
import threading
import time
import weakref

from torch.overrides import TorchFunctionMode

from ..errors import OptionsError
from ..ops import split_tf32

log = logging.getLogger(__name__)
EXIT_WAIT_S = 120.0  # the longest an exiting process waits for the build running on a worker
SWITCH_S = 0.0005  # the interpreter's switch interval while a worker builds (module docstring)
SETTLE_S = 0.5  # no first graph queued for this long before a tuned rebuild begins (module docstring)
IDLE_S = 0.1  # with retune 'idle': no call for this long before a tuned rebuild times a key (``idle``)
COURTESY_S = 0.0002  # with build courtesy: a build's pause before each torch call while a call runs (``Courtesy``)
_contexts: weakref.WeakSet = weakref.WeakSet()
_switching = [0, None]  # workers building now; the interval they found
_switch_lock = threading.Lock()


def retune_policy() -> str:
    """When a CUDA region's tuned rebuild times its forms: DYNASHAPE_RETUNE 'idle' (default: only
    while the calls pause, ``idle``; it gives way before each key once a call comes) or 'beside'
    (while calls run, giving way only to first graphs). Timing beside the calls made them slower
    than the tuned graphs could make them fast: on an H200 (2026-11-29, one lease, cold processes)
    ResNet-50 at a random batch per call, last 50 calls 2.27x eager beside, 2.56x idle (the first
    process's graph replays had run ~1.2 ms slower than a second process's, the tuning's kernels and
    its Python beside them); cycling batches 1, 8, 3, 16: 296 -> 220 ms for 60 calls, its slowest
    call 3.9 -> 2.9x eager's slowest; BERT-base cycling 7 shapes 892 -> 802 ms. A server with
    pauses between requests tunes in them; one that never pauses keeps its first graphs, and a
    second process times the forms at load (the disk cache)."""
    text = os.environ.get("DYNASHAPE_RETUNE", "idle")
    if text not in ("beside", "idle"):
        raise OptionsError(f"DYNASHAPE_RETUNE={text!r}: expected 'beside' or 'idle'")
    return text


def courtesy_on() -> bool:
    """Whether a background build pauses before each torch call while a call of its session runs:
    DYNASHAPE_BUILD_COURTESY '1' (default) or '0'. Measured on an H200 (2026-11-29, one lease, cold
    processes, eager side by side): ResNet-50 cycling batches 1, 8, 3, 16, its first 20 calls 183 ->
    91 ms (60 calls 271 -> 232); BERT-base cycling 7 shapes, first 20 calls 368 -> 287 ms; ResNet-50
    at a random batch, first 20 calls 240 -> 157 ms, its last 50 unchanged (236 -> 232)."""
    text = os.environ.get("DYNASHAPE_BUILD_COURTESY", "1")
    if text not in ("0", "1"):
        raise OptionsError(f"DYNASHAPE_BUILD_COURTESY={text!r}: expected '1' or '0'")
    return text == "1"


class Courtesy(TorchFunctionMode):
    """On a build's thread: before each torch call, while ``busy()`` (a call of the session is being
    launched), a pause of ``COURTESY_S``, which gives the caller the GIL. Without it the worker's
    Python and the caller's share the interpreter about evenly: a ResNet-50 call of 4-7 ms took ~20 ms
    beside a first graph's build (H200). With it the caller keeps the GIL but for one torch call of
    the build per pause and switch interval (~2%), and the build runs while the caller waits on the
    device or does other work (its call launched)."""

    def __init__(self, busy) -> None:
        super().__init__()
        self.busy = busy

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.busy():
            time.sleep(COURTESY_S)
        return func(*args, **(kwargs or {}))


class Requeue(Exception):  # noqa: N818  (a signal, not an error)
    """Raised by a build that gives way to more urgent ones: it is queued again, behind them.
    ``delay``: the worker waits that long first, or until a build of priority 0 is queued (a
    build that waits for the queue to settle, rather than for a build already queued)."""

    def __init__(self, msg: str = "", delay: float = 0.0) -> None:
        super().__init__(msg)
        self.delay = delay


@contextlib.contextmanager
def _quick_switches():
    with _switch_lock:
        if _switching[0] == 0:
            _switching[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(_switching[1], SWITCH_S))
        _switching[0] += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switching[0] -= 1
            if _switching[0] == 0:
                sys.setswitchinterval(_switching[1])


class CompilationContext:
    def __init__(self, mode: str = "async") -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"compilation mode must be 'async' or 'sync', got {mode!r}")
        self.mode = mode
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO within a priority (and never comparing builds)
        self._urgent = 0  # builds of priority 0 queued (not running)
        self._last_urgent = time.monotonic()  # when the last build of priority 0 was queued
        self._arrival = threading.Event()  # set when a build of priority 0 is queued
        self._last_call = 0.0  # when a call last began or ended (``call_began``, ``call_ended``)
        self._calls = 0  # calls being launched now (several requests may run at once)
        self._calls_lock = threading.Lock()
        self._pending: set = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self._stopped = False
        _contexts.add(self)

    def submit(self, key, build, done, inline: bool = False, priority: int = 0) -> bool:
        """Queue a build (False when that key is queued or building already); ``inline``: build
        in the caller's thread whatever the mode (a CUDA graph capture, see the module docstring);
        ``priority``: lower first."""
        with self._lock:
            if key in self._pending or self._stopped:
                return False
            self._pending.add(key)
        if self.mode == "sync" or inline:
            self._run(key, build, done)
            return True
        self._put(priority, key, functools.partial(contextvars.copy_context().run, build), done)
        self._start()
        return True

    def _put(self, priority: int, key, build, done, requeued: bool = False) -> None:
        with self._lock:
            self._urgent += priority == 0
            if priority == 0 and not requeued:
                self._last_urgent = time.monotonic()
                self._arrival.set()
        self._queue.put((priority, next(self._order), key, build, done))

    def urgent(self) -> bool:
        """Whether a build of priority 0 waits in the queue (one running is not waiting)."""
        return self._urgent > 0

    def settled(self, quiet_s: float = SETTLE_S) -> bool:
        """Whether no build of priority 0 waits and none was queued within ``quiet_s``."""
        return not self._urgent and time.monotonic() - self._last_urgent >= quiet_s

    def call_began(self) -> None:
        """A call of the session begins (``idle`` and ``calls_running`` read it)."""
        with self._calls_lock:
            self._calls += 1
        self._last_call = time.monotonic()

    def call_ended(self) -> None:
        with self._calls_lock:
            self._calls -= 1
        self._last_call = time.monotonic()

    def calls_running(self) -> bool:
        """Whether a call of the session is being launched now."""
        return self._calls > 0

    def idle(self, quiet_s: float = IDLE_S) -> bool:
        """Whether no call began or ended within ``quiet_s``."""
        return time.monotonic() - self._last_call >= quiet_s

    def may_tune(self, idle_only: bool = False):
        """For a tuned rebuild about to time forms: raises ``Requeue`` while it should wait (a first
        graph is queued, or was within ``SETTLE_S``; with ``idle_only``, a call ran within
        ``IDLE_S``), else gives the ``give_way()`` its build asks before each key."""
        if self.urgent():
            raise Requeue("a first graph waits")
        if not self.settled():  # first graphs of other buckets may follow
            raise Requeue("first graphs were queued just now", delay=SETTLE_S / 5)
        if not idle_only:
            return self.urgent
        if not self.idle():  # the timing would slow the calls it runs beside
            raise Requeue("calls are running", delay=IDLE_S)
        return lambda: self.urgent() or not self.idle()

    def queued(self, key) -> bool:
        """Whether a build of ``key`` is queued or running."""
        with self._lock:
            return key in self._pending

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no build is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def stop(self, timeout: float = EXIT_WAIT_S) -> bool:
        """Take no more builds, drop the queued ones and wait up to ``timeout`` for the running
        one; False if it still runs then."""
        with self._lock:
            self._stopped = True
        while True:
            try:
                priority, _, key, _, _ = self._queue.get_nowait()
            except queue.Empty:
                break
            with self._idle:
                self._urgent -= priority == 0
                self._pending.discard(key)
                self._idle.notify_all()
        return self.wait(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                return
            self._worker = threading.Thread(target=self._loop, name="dynashape-compile", daemon=True)
            self._worker.start()

    def _loop(self) -> None:
        while True:
            priority, _, key, build, done = self._queue.get()
            with self._lock:
                self._urgent -= priority == 0
            if self._stopped:  # dropped (the exit's stop raced this get)
                with self._idle:
                    self._pending.discard(key)
                    self._idle.notify_all()
                continue
            self._run(key, build, done, worker=True, priority=priority)

    def _run(self, key, build, done, worker: bool = False, priority: int = 0) -> None:
        t0 = time.perf_counter()
        try:
            # on the worker: no split TF32 product anywhere meanwhile (ops/split_tf32.py), and the
            # switches put back before the build is reported done (a wait() returns after that)
            with split_tf32.building() if worker else contextlib.nullcontext(), \
                    _quick_switches() if worker else contextlib.nullcontext():
                result = build()
        except Requeue as rq:
            if worker and not self._stopped:  # behind the builds it gave way to; still pending
                log.debug("build %s gave way after %.3f s", key, time.perf_counter() - t0)
                if rq.delay > 0:  # waits, cut short by a first graph queued meanwhile
                    self._arrival.clear()
                    if not self._urgent:
                        self._arrival.wait(rq.delay)
                self._put(priority, key, build, done, requeued=True)
                return
            result = RuntimeError("a build gave way while nothing could come after it")
        except Exception as e:  # noqa: BLE001  a build that fails is a refusal, reported by done()
            result = e
        log.debug("build %s (priority %d): %s in %.3f s", key, priority,
                  type(result).__name__, time.perf_counter() - t0)
        try:
            done(key, result, time.perf_counter() - t0)
        finally:
            with self._idle:
                self._pending.discard(key)
                self._idle.notify_all()


def wait_all(timeout: float | None = None) -> bool:
    """Block until no context of the process has a build queued or running (tests, benchmarks:
    a session's tuned rebuilds may still run after its last call); False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for ctx in list(_contexts):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not ctx.wait(left):
            return False
    return True


@atexit.register
def _stop_all(contexts=None) -> None:
    """At exit: every context's worker idle before the interpreter tears down (module docstring)."""
    deadline = time.monotonic() + EXIT_WAIT_S
    for ctx in list(_contexts if contexts is None else contexts):
        ctx.stop(max(0.0, deadline - time.monotonic()))

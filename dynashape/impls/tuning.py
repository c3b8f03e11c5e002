"""Timing the forms of an op for a static impl (``ops/specialise.py`` asks at a key's first sight).

Each form runs once (cuBLAS / cuDNN set up handles and pick their kernels), then ``REPS`` runs
of it, each after a write over a buffer twice the GPU's L2 cache, between two CUDA events; the
flush alone is timed the same way and taken off. The operands are cold, as in a model whose
weights are read once per call (a product timed in a loop would find its weight in L2 after the
first run). The time must be the kernels' and not Python's launch cost, since a static impl
replays them without it: before the first event the GPU is held (``torch.cuda._sleep``) for
longer than the host takes to queue every run, so the runs execute back to back. Without the
hold a form of many small kernels (a convolution over 16 images unfolded one by one: 16 im2col
launches) was timed at its host cost and lost to a slower form of one kernel.
Nothing is captured (a timing graph per form would cost a capture and its memory each). The
fastest form wins; one that fails is skipped. Nothing is timed inside another capture: there the op takes its
first form (its own call) and its key stays untuned.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from ..ops import specialise
from .context import Requeue

log = logging.getLogger(__name__)

REPS = 8
ROUNDS = 3
# a build off the calling thread (static.detached) times each form once over 4 runs: a sixth of
# the work, so that a bucket's graph is ready within a second or two of traffic; its timings are
# noisier anyway (the caller's kernels share the GPU), and the forms it picks between differ by
# tens of percent where they differ at all
LIGHT = (4, 1)
_local = threading.local()


def light():
    """Inside (this thread): forms timed with ``LIGHT`` repetitions."""
    return specialise.thread_setting(_local, "light", True)


def _reps() -> tuple[int, int]:
    return LIGHT if getattr(_local, "light", False) else (REPS, ROUNDS)


MAX_HOLD_US = 50_000.0
_CYCLES_PER_US: list[float] = []


def _cycles_per_us() -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep`` (measured once per process)."""
    if not _CYCLES_PER_US:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # the sleep kernel loaded before it is timed
        a.record()
        torch.cuda._sleep(2_000_000)
        b.record()
        b.synchronize()
        _CYCLES_PER_US.append(2_000_000 / max(a.elapsed_time(b) * 1e3, 1.0))
    return _CYCLES_PER_US[0]


def hold_gpu(us: float) -> None:
    """Keep the current stream busy for about ``us`` microseconds (at most ``MAX_HOLD_US``); a
    torch without ``torch.cuda._sleep`` (a private helper) times without the hold."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(min(us, MAX_HOLD_US) * _cycles_per_us()))


def _host_us(fn) -> float:
    """The host's microseconds to queue ``fn`` (its kernels are not waited for)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def fastest(key: tuple, runs: list, give_way=None) -> int | None:
    """The index of the fastest of ``runs`` (callables on the current stream), or None where
    nothing can be timed (the stream is capturing). ``give_way``: see ``timings``."""
    if torch.cuda.is_current_stream_capturing():
        return None
    t0 = time.perf_counter()
    times = timings(runs, give_way)
    best = min(range(len(runs)), key=times.__getitem__)
    specialise.STATS["tuned"] += 1
    specialise.STATS["tune_s"] += time.perf_counter() - t0
    log.info("tuned %s: %.1f us (first form %.1f us)", key[:4], times[best], times[0])
    return best if times[best] < float("inf") else 0


def timings(runs: list, give_way=None) -> list[float]:
    """Microseconds per run of each callable, cold operands, inf for one that fails.
    ``give_way()`` (a tuned rebuild's, impls/context.py ``may_tune``) is asked before each form is
    queued; when true, the round is abandoned (its queued work waited for) and ``Requeue`` raised:
    the key is timed again later. A call that came while a key was timed had waited for the whole
    key (~20-60 ms on an H200: calls of 4-7 ms took 30 ms), now for one form's runs at most.

    All the forms of a key are timed in one queue: the GPU held, then the flush alone and each
    form's ``REPS`` runs between CUDA events, one wait at the end (per round), where a form had
    a hold and a wait of its own. Measured on an H200 beside ResNet-50 calls, this did not make
    a background build's tuning faster (~20 forms a second either way, ~60 ms a key against
    ~20 idle): it is kept for its fewer waits. The hold must outlast the host's queueing, which
    the GIL can stretch: a round whose queueing took longer than its hold is timed again with a
    hold twice that long (at most ``MAX_HOLD_US``)."""
    dev = torch.cuda.current_device()
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20)
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    n, rounds = _reps()

    def reps(fn=None):
        def body():
            for _ in range(n):
                flush.fill_(1.0)
                if fn is not None:
                    fn()
        return body
    good = []
    for i, run in enumerate(runs):
        try:
            run()  # cuBLAS / cuDNN set up handles, workspaces and algorithms first
            good.append(i)
        except Exception as e:  # noqa: BLE001  a form that cannot run here is not a candidate
            log.debug("candidate %d failed: %s", i, e)
    bodies = [reps()] + [reps(runs[i]) for i in good]
    best = [float("inf")] * len(bodies)
    hold = _host_us(bodies[-1]) * len(bodies)  # one form's queueing, times the forms
    done = 0
    while done < rounds:
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(len(bodies) + 1)]
        hold_gpu(2.0 * hold + 100.0)
        t0 = time.perf_counter()
        evs[0].record()
        for body, ev in zip(bodies, evs[1:]):
            if give_way is not None and give_way():
                torch.cuda.current_stream().synchronize()  # what was queued, before its buffers go
                raise Requeue("a call came while a key's forms were timed")
            body()
            ev.record()
        queued = (time.perf_counter() - t0) * 1e6
        evs[-1].synchronize()
        if queued > 2.0 * hold + 100.0 and hold < MAX_HOLD_US:  # the GPU may have caught up: again
            hold = min(2.0 * queued, MAX_HOLD_US)
            continue
        done += 1
        for j in range(len(bodies)):
            best[j] = min(best[j], evs[j].elapsed_time(evs[j + 1]) * 1e3)
    times = [float("inf")] * len(runs)
    for j, i in enumerate(good):
        times[i] = max((best[j + 1] - best[0]) / n, 0.0)
    return times

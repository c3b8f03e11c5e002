"""Timing the forms of an op for a static impl (``ops/specialise.py`` asks at a key's first sight).

Each form runs once (cuBLAS / cuDNN set up handles and pick their kernels), then ``REPS`` runs of it,
each after a write over a buffer twice the GPU's L2 cache, are captured into a CUDA graph and
replayed: the replay measures the kernels without Python's launch cost (a static impl replays
them without it too), and with the operands cold, as in a model whose weights are read once per
call (a product timed in a loop would find its weight in L2 after the first run). The flush
alone is timed the same way and taken off. The fastest form wins; one that fails is skipped.
Nothing is tuned inside another capture: there the op takes its first form (its own call) and
its key stays untuned.
"""

from __future__ import annotations

import logging
import time

import torch

from ..ops import specialise
from . import capture_guard

log = logging.getLogger(__name__)

REPS = 8
ROUNDS = 3


def _graph(fn) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with capture_guard.capturing():
        g.capture_begin(capture_error_mode="thread_local")
        try:
            fn()
        finally:
            g.capture_end()
    return g


def _replay_us(g: torch.cuda.CUDAGraph) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3)
    return best


def fastest(key: tuple, runs: list) -> int | None:
    """The index of the fastest of ``runs`` (callables on the current stream), or None where
    nothing can be timed (the stream is capturing)."""
    if torch.cuda.is_current_stream_capturing():
        return None
    t0 = time.perf_counter()
    times = timings(runs)
    best = min(range(len(runs)), key=times.__getitem__)
    specialise.STATS["tuned"] += 1
    specialise.STATS["tune_s"] += time.perf_counter() - t0
    log.info("tuned %s: %.1f us (first form %.1f us)", key[:4], times[best], times[0])
    return best if times[best] < float("inf") else 0


def timings(runs: list) -> list[float]:
    """Microseconds per run of each callable, cold operands, inf for one that fails."""
    caller = torch.cuda.current_stream()
    if caller != torch.cuda.default_stream():
        return _timings(runs)
    side = torch.cuda.Stream()  # graphs are captured on a stream of their own
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        times = _timings(runs)
    caller.wait_stream(side)
    return times


def _timings(runs: list) -> list[float]:
    dev = torch.cuda.current_device()
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20)
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")

    def reps(fn=None):
        def body():
            for _ in range(REPS):
                flush.fill_(1.0)
                if fn is not None:
                    fn()
        return body
    base = _replay_us(_graph(reps()))
    times = []
    for i, run in enumerate(runs):
        try:
            run()  # cuBLAS / cuDNN set up handles, workspaces and algorithms outside the capture
            times.append(max((_replay_us(_graph(reps(run))) - base) / REPS, 0.0))
        except Exception as e:  # noqa: BLE001  a form that cannot run here is not a candidate
            log.debug("candidate %d failed: %s", i, e)
            times.append(float("inf"))
    return times

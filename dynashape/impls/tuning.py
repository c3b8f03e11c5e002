"""Timing the forms of an op for a static impl (``ops/specialise.py`` asks at a key's first sight).

Each form runs once (cuBLAS / cuDNN set up handles and pick their kernels), then ``REPS`` runs
of it, each after a write over a buffer twice the GPU's L2 cache, between two CUDA events; the
flush alone is timed the same way and taken off. The operands are cold, as in a model whose
weights are read once per call (a product timed in a loop would find its weight in L2 after the
first run), and the flush keeps the GPU busy while the host queues the next form's kernels, so
the time is the kernels' and not Python's launch cost (a static impl replays them without it).
Nothing is captured (a timing graph per form would cost a capture and its memory each). The
fastest form wins; one that fails is skipped. Nothing is timed inside another capture: there the op takes its
first form (its own call) and its key stays untuned.
"""

from __future__ import annotations

import logging
import time

import torch

from ..ops import specialise

log = logging.getLogger(__name__)

REPS = 8
ROUNDS = 3


def _events_us(fn) -> float:
    """Microseconds of ``REPS`` calls of ``fn`` (the best of ``ROUNDS``), on the current stream."""
    best = float("inf")
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
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
    base = _events_us(reps())
    times = []
    for i, run in enumerate(runs):
        try:
            run()  # cuBLAS / cuDNN set up handles, workspaces and algorithms first
            times.append(max((_events_us(reps(run)) - base) / REPS, 0.0))
        except Exception as e:  # noqa: BLE001  a form that cannot run here is not a candidate
            log.debug("candidate %d failed: %s", i, e)
            times.append(float("inf"))
    return times

"""What a replica tallies: requests, batches and their sizes, queue time, latency per shape.

Plain counters and bounded sample windows (no Ray here), read by ``snapshot()``; the Ray
deployment mirrors them into Ray's metrics, the single-process server and the tests read them
directly.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable

import numpy as np

WINDOW = 4096  # samples kept per series: percentiles over the recent past, bounded memory


def _pcts(samples) -> dict:
    if not samples:
        return {"n": 0}
    a = np.asarray(samples, dtype=np.float64)
    return {"n": len(a), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.batch_rows: Counter = Counter()       # rows per run -> runs
        self.batch_requests: Counter = Counter()   # requests per run -> runs
        self.queue_ms: deque = deque(maxlen=WINDOW)
        self.latency_ms: dict[str, deque] = {}     # merged shape -> run times
        # told of every run (shape, requests, rows, ms), outside the lock: the Ray deployment
        # mirrors runs into Ray's metrics this way
        self.listeners: list[Callable[[str, int, int, float], None]] = []

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def run(self, shape: str, requests: int, rows: int, ms: float, padded: int = 0, real: int = 0) -> None:
        with self.lock:
            self.counts["runs"] += 1
            self.counts["requests_run"] += requests
            self.counts["padded_elements"] += padded
            self.counts["real_elements"] += real
            self.batch_rows[rows] += 1
            self.batch_requests[requests] += 1
            self.latency_ms.setdefault(shape, deque(maxlen=WINDOW)).append(ms)
        for f in self.listeners:
            try:
                f(shape, requests, rows, ms)
            except Exception:  # noqa: BLE001  a metrics exporter's failure must not fail the requests
                self.count("listener_errors")

    def queued(self, ms: float) -> None:
        with self.lock:
            self.queue_ms.append(ms)

    def snapshot(self) -> dict:
        with self.lock:
            return {"counts": dict(self.counts),
                    "batch_rows": dict(sorted(self.batch_rows.items())),
                    "batch_requests": dict(sorted(self.batch_requests.items())),
                    "queue_ms": _pcts(self.queue_ms),
                    "latency_ms": {s: _pcts(v) for s, v in self.latency_ms.items()}}

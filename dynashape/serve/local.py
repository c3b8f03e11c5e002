"""A replica served in one process: a bounded queue and a batching thread, no Ray.

What Ray Serve does for a deployment (collect requests for up to ``max_wait_ms``, refuse beyond
``max_queue``), done with a condition variable, for users with one process and for the GPU
benchmark (benchmarks/serving.py), which runs one of these per GPU.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

from ..errors import ServerBusyError
from .replica import ModelReplica


class LocalServer:
    def __init__(self, replica: ModelReplica, *, max_wait_ms: float = 5.0, max_queue: int = 256,
                 window: int | None = None, batching: bool = True) -> None:
        self.replica = replica
        self.max_wait_s = max_wait_ms / 1e3
        self.max_queue = max_queue
        # requests taken per collection: several batches' worth, so that grouping by shape has a choice
        self.window = (window or 4 * replica.max_batch) if batching else 1
        self.queue: deque = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.worker = threading.Thread(target=self._loop, name="dynashape-serve", daemon=True)
        self.worker.start()

    def submit(self, feeds) -> Future:
        fut: Future = Future()
        with self.cond:
            if self.closed:
                raise ServerBusyError("the server is closed")
            if len(self.queue) >= self.max_queue:
                self.replica.metrics.count("refused_busy")
                raise ServerBusyError(f"queue full ({self.max_queue} requests waiting): retry later")
            self.queue.append((feeds, time.perf_counter(), fut))
            self.cond.notify()
        return fut

    def infer(self, feeds, timeout: float | None = None) -> dict:
        return self.submit(feeds).result(timeout)

    def _take(self) -> list | None:
        with self.cond:
            while not self.queue and not self.closed:
                self.cond.wait()
            if self.closed and not self.queue:
                return None
            deadline = self.queue[0][1] + self.max_wait_s
            while len(self.queue) < self.window and not self.closed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self.cond.wait(left)
            return [self.queue.popleft() for _ in range(min(self.window, len(self.queue)))]

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            now = time.perf_counter()
            try:
                results = self.replica.infer_many([f for f, _, _ in batch], [(now - t) * 1e3 for _, t, _ in batch])
            except BaseException as e:  # noqa: BLE001  a bug of ours: every waiter hears it, the loop goes on
                results = [e] * len(batch)
            for (_, _, fut), r in zip(batch, results):
                if isinstance(r, BaseException):
                    fut.set_exception(r)
                else:
                    fut.set_result(r)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.worker.join()
